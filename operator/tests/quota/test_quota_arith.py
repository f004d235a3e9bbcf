"""Quota arithmetic: budgets, fit, reservation deltas and recount."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api import budget as api_budget
from tessera_operator.quota import (
    Limits,
    QuotaPolicy,
    QuotaView,
    Usage,
    budget_from_pod,
    check_fit,
    deny_message,
    recount,
)
from tessera_operator.quota.arith import (
    ANNOTATION_BUDGET,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
    PodRequestError,
    annotation_usage,
)
from tessera_operator.quota.units import memory_mib, mib_quantity


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = ()) -> dict[str, Any]:
    return {"containers": [{"name": f"c{i}", "resources": {"limits": c}}
                           for i, c in enumerate(containers)],
            "initContainers": [{"name": f"i{i}", "resources": {"limits": c}}
                               for i, c in enumerate(init)]}


POLICY = QuotaPolicy(quota="team", default_memory_mib=1024, default_cores=25,
                     max_memory_mib=8192, max_cores=200)


def test_defaults_fill_missing_memory_and_cores_per_share() -> None:
    b = budget_from_pod(pod({VGPU: "2"}), POLICY)
    c = b.containers[0]
    assert (c.gpus, c.memory_mib, c.cores) == (2, 2048, 50)
    assert c.filled == {VGPU_MEMORY: 2048, VGPU_CORES: 50}
    assert b.usage() == Usage(2048, 50, 1)


def test_memory_without_vgpu_implies_one_share() -> None:
    c = budget_from_pod(pod({VGPU_MEMORY: "3000"}), POLICY).containers[0]
    assert (c.gpus, c.memory_mib, c.cores) == (1, 3000, 25)
    assert c.filled == {VGPU: 1, VGPU_CORES: 25}


def test_no_tessera_resources_is_no_budget() -> None:
    b = budget_from_pod(pod({"cpu": "1"}), POLICY)
    assert not b.requests_anything and b.usage() == Usage()


@pytest.mark.parametrize(("limits", "needle"), [
    ({VGPU: "1", VGPU_CORES: "150"}, "more than 100 per share"),
    ({VGPU: "0", VGPU_MEMORY: "10"}, "vgpu is 0"),
    ({VGPU: "1.5"}, "whole number"),
    ({"tessera.dev/vgpu-mem": "1"}, "unknown resource"),
    ({VGPU: "1", VGPU_MEMORY: "9000"}, 'over the per-pod GPUQuota "team" max 9000'),
    # a budget without memory is no budget, whatever else the container says
    ({VGPU_MEMORY: "0"}, "vgpu-memory is 0, and a GPU budget without memory is no budget"),
    ({VGPU: "0", VGPU_MEMORY: "0"}, "vgpu-memory is 0"),
    ({VGPU: "1", VGPU_MEMORY: "0", VGPU_CORES: "10"}, "vgpu-memory is 0"),
    ({"tessera.dev/mig-1g.10gb": "1", VGPU_MEMORY: "0"}, "vgpu-memory is 0"),
    # a bound of the annotation's format, said in the user's terms
    ({VGPU: "65"}, "tessera.dev/vgpu 65 is more than 64 GPU shares; ask for at most 64"),
])
def test_bad_requests_are_refused_with_reason(limits: dict[str, str], needle: str) -> None:
    with pytest.raises(PodRequestError) as exc:
        budget_from_pod(pod(limits), POLICY)
    assert needle.split(" 9000")[0] in str(exc.value)
    assert "pydantic" not in str(exc.value) and "validation error" not in str(exc.value)


def test_a_zero_memory_default_is_no_default() -> None:
    with pytest.raises(PodRequestError, match=r'GPUQuota "team" default\.memory is 0'):
        budget_from_pod(pod({VGPU: "1"}), QuotaPolicy(quota="team", default_memory_mib=0))


def test_max_is_per_pod_total_over_containers() -> None:
    with pytest.raises(PodRequestError, match="vgpu-cores 300 in total"):
        budget_from_pod(pod({VGPU_CORES: "100"}, {VGPU_CORES: "100"}, {VGPU_CORES: "100"}), POLICY)


def test_regular_init_container_is_not_summed_with_the_app_containers() -> None:
    """Per resource, the larger of the init container and the apps (test_quota_init_containers)."""
    b = budget_from_pod(pod({VGPU_MEMORY: "1000", VGPU_CORES: "10"},
                            init=({VGPU_MEMORY: "4000", VGPU_CORES: "5"},)), POLICY)
    assert b.usage() == Usage(4000, 10, 1)


def test_memory_is_mandatory_without_default_and_cores_default_to_whole_share() -> None:
    with pytest.raises(PodRequestError, match="sets no default memory"):
        budget_from_pod(pod({VGPU: "1"}), QuotaPolicy())
    c = budget_from_pod(pod({VGPU: "2", VGPU_MEMORY: "10"}), QuotaPolicy()).containers[0]
    assert c.cores == 200


def test_mig_profiles_counted_with_their_profile_name() -> None:
    b = budget_from_pod(pod({"tessera.dev/mig-1g.10gb.me": "2"}), POLICY)
    assert b.usage() == Usage(0, 0, 1, {"1g.10gb+me": 2})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.integers(1, 200_000), st.integers(0, 100)),
                min_size=1, max_size=4))
def test_annotation_round_trip_is_exact(containers: list[tuple[int, int, int]]) -> None:
    """Per-share values in the annotation always give back the admitted totals."""
    b = budget_from_pod(pod(*({VGPU: str(n), VGPU_MEMORY: str(m), VGPU_CORES: str(c * n)}
                              for n, m, c in containers)), QuotaPolicy())
    assert annotation_usage(b.annotation()) == b.usage()


def test_deny_message_names_quota_resource_requested_used_hard() -> None:
    q = QuotaView("team-a", Limits(memory_mib=10240), Usage(8192, 0, 4))
    v = check_fit(Usage(4096, 10, 1), [q])
    assert deny_message(v) == ('exceeded GPUQuota "team-a": tessera.dev/vgpu-memory requested '
                               "4Gi, used 8Gi, hard 10Gi")


def test_every_quota_must_fit() -> None:
    a = QuotaView("a", Limits(pods=5), Usage(pods=5))
    b = QuotaView("b", Limits(cores=100), Usage(cores=60))
    v = check_fit(Usage(0, 50, 1), [b, a])
    assert [(x.quota, x.resource) for x in v] == [("a", "pods"), ("b", VGPU_CORES)]


def test_units() -> None:
    assert memory_mib("40Gi") == 40960
    assert memory_mib("1G") == 954  # rounds up
    assert memory_mib(4096 * 2**20) == 4096
    assert mib_quantity(40960) == "40Gi" and mib_quantity(1000) == "1000Mi"
    with pytest.raises(ValueError, match="quantity 'lots' has an invalid suffix"):
        memory_mib("lots")
    # every spelling Kubernetes accepts, milli included: 10^13 milli-bytes are 10 GB
    assert memory_mib("10000000000000m") == 9537
    assert memory_mib("1e3") == 1 and memory_mib(".5Gi") == 512 and memory_mib("1.Gi") == 1024
    with pytest.raises(ValueError, match="negative"):
        memory_mib("-1Gi")


usages = st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 100),
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"]),
                                   st.integers(0, 8), max_size=3))
limits = st.builds(Limits, st.none() | st.integers(0, 10**6), st.none() | st.integers(0, 10**4),
                   st.none() | st.integers(0, 100),
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 8)))


@settings(max_examples=300, deadline=None)
@given(usages, usages)
def test_reserve_then_release_is_identity(used: Usage, req: Usage) -> None:
    assert (used + req) - req == used
    assert used - used == Usage()


@settings(max_examples=300, deadline=None)
@given(limits, usages, st.lists(usages, max_size=30))
def test_admitting_only_what_fits_never_overshoots(hard: Limits, req0: Usage,
                                                    reqs: list[Usage]) -> None:
    """Sequential admission (what CAS serialises to) never exceeds any hard limit it grew."""
    used = Usage()
    for req in [req0, *reqs]:
        q = QuotaView("q", hard, used)
        if not check_fit(req, [q]):
            used = used + req
    for got, lim in ((used.memory_mib, hard.memory_mib), (used.cores, hard.cores),
                     (used.pods, hard.pods)):
        assert lim is None or got <= lim or got == 0
    for profile, lim in hard.mig.items():
        assert used.mig.get(profile, 0) <= lim


@settings(max_examples=200, deadline=None)
@given(limits, usages, usages)
def test_fit_is_exact_at_the_boundary(hard: Limits, used: Usage, req: Usage) -> None:
    """check_fit refuses exactly when some limited resource would go over."""
    over = any(lim is not None and r > 0 and u + r > lim for lim, u, r in (
        (hard.memory_mib, used.memory_mib, req.memory_mib), (hard.cores, used.cores, req.cores),
        (hard.pods, used.pods, req.pods))) or any(
        req.mig.get(p, 0) > 0 and used.mig.get(p, 0) + req.mig.get(p, 0) > lim
        for p, lim in hard.mig.items())
    assert bool(check_fit(req, [QuotaView("q", hard, used)])) == over


def _admitted(name: str, limits: dict[str, str], phase: str = "Running") -> dict[str, Any]:
    b = budget_from_pod(pod(limits), POLICY)
    return {"metadata": {"name": name, "annotations": {ANNOTATION_BUDGET: b.annotation()}},
            "status": {"phase": phase}}


def test_recount_skips_finished_and_unbudgeted_pods() -> None:
    finished = _admitted("b", {VGPU_MEMORY: "200", VGPU_CORES: "20"}, phase="Succeeded")
    pods = [_admitted("a", {VGPU_MEMORY: "100", VGPU_CORES: "10"}),
            finished,
            _admitted("c", {VGPU_MEMORY: "300", VGPU_CORES: "30"}, phase="Pending"),
            {"metadata": {"name": "d"}, "status": {"phase": "Running"}},
            {"metadata": {"name": "e", "annotations": {ANNOTATION_BUDGET: "{bad"}}}]
    assert recount(pods) == Usage(400, 40, 2)
    # a finished pod holds nothing, as Kubernetes' ResourceQuota counts it
    assert recount([_admitted("f", {VGPU_MEMORY: "5"}, phase="Failed")]) == Usage()


def test_lending_flows_from_the_quota_into_the_budget() -> None:
    from tessera_operator.quota.objects import FieldError, policy_of, view_of

    def q(spec: dict[str, Any]) -> QuotaView:
        return view_of({"metadata": {"name": "team"}, "spec": spec})

    assert policy_of([q({"weight": 3})]).lending is True
    policy = policy_of([q({"lending": False})])
    assert policy.lending is False and policy.quota == "team"
    spec = {"containers": [{"name": "main", "resources": {"limits": {
        VGPU_MEMORY: "1024", VGPU_CORES: "20"}}}]}
    raw = json.loads(budget_from_pod(spec, policy).annotation())
    assert raw["lending"] is False and raw["quota"] == "team"
    assert api_budget.parse_budget_annotation(budget_from_pod(spec).annotation()).lending is True
    with pytest.raises(FieldError, match=r"spec\.lending"):
        policy_of([q({"lending": "no"})])
