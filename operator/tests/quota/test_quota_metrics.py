"""tessera_quota_hard / tessera_quota_used: what the operator's /metrics says of each quota."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from tessera_operator.controller.quota_metrics import QuotaCollector


def quota(name: str, hard: dict[str, Any], used: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"namespace": "team-a", "name": name},
                           "spec": {"hard": hard}}
    if used is not None:
        obj["status"] = {"used": used}
    return obj


def samples(*quotas: dict[str, Any]) -> dict[tuple[str, str, str], float]:
    collected = list(QuotaCollector(lambda: quotas).collect())
    return {(s.name, s.labels["quota"], s.labels["resource"]): s.value
            for family in collected for s in family.samples}


def test_hard_and_used_by_resource_in_bytes_cores_pods_and_instances() -> None:
    got = samples(quota("q", {"memory": "2Gi", "cores": 150, "pods": 4,
                              "migInstances": {"1g.10gb": 2}},
                        {"memory": "1536Mi", "cores": 50, "pods": 1}))
    assert got == {
        ("tessera_quota_hard", "q", "memory"): 2 * 2**30,
        ("tessera_quota_hard", "q", "cores"): 150,
        ("tessera_quota_hard", "q", "pods"): 4,
        ("tessera_quota_hard", "q", "mig/1g.10gb"): 2,
        ("tessera_quota_used", "q", "memory"): 1536 * 2**20,
        ("tessera_quota_used", "q", "cores"): 50,
        ("tessera_quota_used", "q", "pods"): 1,
    }


def test_uncounted_has_no_used_and_an_unreadable_spec_no_hard() -> None:
    got = samples(quota("new", {"cores": 10}, None),
                  quota("bad", {"memory": "lots"}, {"memory": "0", "cores": 0, "pods": 0}))
    assert got == {("tessera_quota_hard", "new", "cores"): 10,
                   ("tessera_quota_used", "bad", "memory"): 0,
                   ("tessera_quota_used", "bad", "cores"): 0,
                   ("tessera_quota_used", "bad", "pods"): 0}


@given(st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 10**5),
                          st.integers(0, 10**6)), max_size=5))
def test_every_quota_gets_each_limit_once_and_the_text_format_renders(
        limits: list[tuple[int, int, int]]) -> None:
    quotas = [quota(f"q{i}", {"memory": f"{m}Mi", "cores": c, "pods": p}, None)
              for i, (m, c, p) in enumerate(limits)]
    got = samples(*quotas)
    assert len(got) == 3 * len(limits)
    for i, (m, c, p) in enumerate(limits):
        assert got[("tessera_quota_hard", f"q{i}", "memory")] == m * 2**20
        assert got[("tessera_quota_hard", f"q{i}", "cores")] == c
        assert got[("tessera_quota_hard", f"q{i}", "pods")] == p
    registry = CollectorRegistry()
    registry.register(QuotaCollector(lambda: quotas))
    assert generate_latest(registry).count(b"tessera_quota_hard{") == 3 * len(limits)
