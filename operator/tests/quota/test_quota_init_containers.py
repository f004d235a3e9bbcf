"""A pod's quota usage follows Kubernetes' effective-request rule for init containers.

App containers and sidecars (init containers with ``restartPolicy: Always``) add up; a
regular init container runs alone with the sidecars declared before it; the pod holds the
larger of the two per resource.  Admission (``Budget.usage``) and recount (``pod_usage``
from the annotation admission wrote) must give the same number.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.budget import parse_budget_annotation
from tessera_operator.quota import QuotaPolicy, Usage, budget_from_pod, recount
from tessera_operator.quota.arith import (
    ANNOTATION_BUDGET,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
    PodRequestError,
    effective_usage,
    pod_usage,
    usage_of,
)

POLICY = QuotaPolicy(quota="team", default_memory_mib=1024, default_cores=25,
                     max_memory_mib=8192, max_cores=200)


def gpu(memory: int, cores: int, shares: int = 1, **mig: int) -> dict[str, str]:
    """Limits for one container: memory MiB and cores in total, MIG counts by profile."""
    limits = {VGPU: str(shares), VGPU_MEMORY: str(memory), VGPU_CORES: str(cores)}
    limits.update({f"tessera.dev/mig-{p.replace('_', '.')}": str(n) for p, n in mig.items()})
    return limits


def spec(apps: list[dict[str, str]],
         inits: list[tuple[str, dict[str, str]]] | None = None) -> dict[str, Any]:
    """``inits`` are (kind, limits) in declaration order; kind is "init" or "sidecar"."""
    init_containers = []
    for i, (kind, limits) in enumerate(inits or []):
        c: dict[str, Any] = {"name": f"{kind}{i}", "resources": {"limits": limits}}
        if kind == "sidecar":
            c["restartPolicy"] = "Always"
        init_containers.append(c)
    return {"initContainers": init_containers,
            "containers": [{"name": f"app{i}", "resources": {"limits": limits}}
                           for i, limits in enumerate(apps)]}


def admitted(s: dict[str, Any], policy: QuotaPolicy = POLICY) -> dict[str, Any]:
    """The pod object as the operator sees it after admission wrote its budget."""
    b = budget_from_pod(s, policy)
    return {"metadata": {"name": "p", "annotations": {ANNOTATION_BUDGET: b.annotation()}},
            "spec": s, "status": {"phase": "Running"}}


def usage_both_ways(s: dict[str, Any], policy: QuotaPolicy = POLICY) -> Usage:
    """Admission's usage, after checking that recount reads the same back."""
    admission = budget_from_pod(s, policy).usage()
    pod = admitted(s, policy)
    assert pod_usage(pod) == admission
    assert recount([pod]) == admission
    return admission


def test_regular_init_bigger_than_apps_counts_the_init() -> None:
    s = spec([gpu(1000, 10), gpu(2000, 20)], [("init", gpu(6000, 80))])
    assert usage_both_ways(s) == Usage(6000, 80, 1)


def test_regular_init_smaller_than_apps_counts_the_apps() -> None:
    s = spec([gpu(1000, 10), gpu(2000, 20)], [("init", gpu(500, 5))])
    assert usage_both_ways(s) == Usage(3000, 30, 1)


def test_max_is_taken_per_resource() -> None:
    """More memory in the init container, more cores in the apps: each resource its own max."""
    s = spec([gpu(1000, 10), gpu(2000, 20)], [("init", gpu(6000, 5))])
    assert usage_both_ways(s) == Usage(6000, 30, 1)


def test_regular_inits_run_one_at_a_time() -> None:
    s = spec([gpu(100, 1)], [("init", gpu(3000, 10)), ("init", gpu(2000, 40))])
    assert usage_both_ways(s) == Usage(3000, 40, 1)


def test_sidecar_and_app_add_up() -> None:
    s = spec([gpu(2000, 20)], [("sidecar", gpu(1000, 10))])
    assert usage_both_ways(s) == Usage(3000, 30, 1)


def test_sidecar_declared_before_a_regular_init_runs_with_it() -> None:
    # apps + sidecar = 3000/30; init + earlier sidecar = 3500/35
    s = spec([gpu(2000, 20)], [("sidecar", gpu(1000, 10)), ("init", gpu(2500, 25))])
    assert usage_both_ways(s) == Usage(3500, 35, 1)


def test_sidecar_declared_after_a_regular_init_does_not_run_with_it() -> None:
    # the init runs alone (2500/25); apps + sidecar = 3000/30
    s = spec([gpu(2000, 20)], [("init", gpu(2500, 25)), ("sidecar", gpu(1000, 10))])
    assert usage_both_ways(s) == Usage(3000, 30, 1)


def test_mig_profiles_are_maxed_per_profile() -> None:
    s = spec([{"tessera.dev/mig-1g.10gb": "1"},
              {"tessera.dev/mig-1g.10gb": "1", "tessera.dev/mig-2g.20gb": "2"}],
             [("init", {"tessera.dev/mig-1g.10gb": "3", "tessera.dev/mig-3g.40gb": "1"})])
    assert usage_both_ways(s) == Usage(0, 0, 1, {"1g.10gb": 3, "2g.20gb": 2, "3g.40gb": 1})


def test_sidecar_mig_counts_in_a_later_inits_peak() -> None:
    s = spec([gpu(100, 1, **{"1g_10gb": 1})],
             [("sidecar", {"tessera.dev/mig-1g.10gb": "2"}),
              ("init", {"tessera.dev/mig-1g.10gb": "2"})])
    assert usage_both_ways(s) == Usage(100, 1, 1, {"1g.10gb": 4})


def test_per_pod_max_checks_the_effective_usage() -> None:
    # init + app would be 11000 MiB / 200 cores, over the 8192 MiB max; at its peak the pod
    # holds 6000 MiB / 100 cores
    s = spec([gpu(5000, 100)], [("init", gpu(6000, 100))])
    assert usage_both_ways(s) == Usage(6000, 100, 1)
    # a sidecar declared before it runs with it: 4000 + 5000 MiB is over the max
    s = spec([gpu(1000, 10)], [("sidecar", gpu(4000, 10)), ("init", gpu(5000, 10))])
    with pytest.raises(PodRequestError, match="vgpu-memory 9000Mi in total"):
        budget_from_pod(s, POLICY)


def test_annotation_still_lists_every_gpu_container() -> None:
    s = spec([gpu(1000, 10), {"cpu": "1"}],
             [("init", gpu(6000, 80)), ("sidecar", gpu(500, 5)), ("init", {"cpu": "1"})])
    b = budget_from_pod(s, POLICY)
    assert sorted(parse_budget_annotation(b.annotation()).containers) == [
        "app0", "init0", "sidecar1"]
    assert [c.kind for c in b.containers] == ["init", "sidecar", "init", "app", "app"]
    assert usage_both_ways(s) == Usage(6000, 80, 1)


def test_init_only_pod_counts_one_pod() -> None:
    s = spec([{"cpu": "1"}], [("init", gpu(700, 7))])
    assert usage_both_ways(s) == Usage(700, 7, 1)


def test_annotation_containers_absent_from_the_spec_count_as_apps() -> None:
    """A pod whose spec does not match its annotation is overcounted, never undercounted."""
    s = spec([gpu(1000, 10)], [("init", gpu(6000, 80))])
    pod = admitted(s)
    assert pod_usage(pod) == Usage(6000, 80, 1)
    pod["spec"] = {"containers": [{"name": "app0"}]}
    assert pod_usage(pod) == Usage(7000, 90, 1)
    del pod["spec"]
    assert pod_usage(pod) == Usage(7000, 90, 1)
    # without a spec, usage_of sums every container (the plain total)
    annotation = pod["metadata"]["annotations"][ANNOTATION_BUDGET]
    assert usage_of(parse_budget_annotation(annotation)) == Usage(7000, 90, 1)


def test_effective_usage_of_nothing_is_nothing() -> None:
    assert effective_usage([]) == Usage()
    assert budget_from_pod(spec([{"cpu": "1"}], [("init", {"cpu": "1"})])).usage() == Usage()


# -- property: admission and recount agree, and the rule stays between max and sum ---------

PROFILES = ["1g.10gb", "2g.20gb", "3g.40gb"]


@st.composite
def limits(draw: st.DrawFn) -> dict[str, str]:
    out: dict[str, str] = {}
    if draw(st.booleans()):
        n = draw(st.integers(1, 3))
        out[VGPU] = str(n)
        out[VGPU_MEMORY] = str(draw(st.integers(1, 100_000)))
        out[VGPU_CORES] = str(draw(st.integers(0, 100 * n)))
    for p, n in draw(st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 4),
                                     max_size=3)).items():
        out[f"tessera.dev/mig-{p}"] = str(n)
    return out or {"cpu": "1"}


pods = st.tuples(
    st.lists(limits(), min_size=1, max_size=3),
    st.lists(st.tuples(st.sampled_from(["init", "sidecar"]), limits()), max_size=3))


def _flat(u: Usage) -> dict[str, int]:
    return {"memory": u.memory_mib, "cores": u.cores, "pods": u.pods,
            **{f"mig/{p}": u.mig.get(p, 0) for p in PROFILES}}


def _oracle(apps: list[dict[str, int]], inits: list[tuple[str, dict[str, int]]],
            keys: list[str]) -> dict[str, int]:
    """k8s.io/component-helpers resource.PodRequests, transcribed resource by resource."""
    out = {}
    for k in keys:
        reqs = sum(a[k] for a in apps)
        restartable = init_max = 0
        for kind, c in inits:
            if kind == "sidecar":
                reqs += c[k]
                restartable += c[k]
                init_max = max(init_max, restartable)
            else:
                init_max = max(init_max, c[k] + restartable)
        out[k] = max(reqs, init_max)
    return out


@settings(max_examples=300, deadline=None)
@given(pods)
def test_admission_and_recount_agree_and_stay_between_max_and_sum(
        p: tuple[list[dict[str, str]], list[tuple[str, dict[str, str]]]]) -> None:
    apps, inits = p
    s = spec(apps, inits)
    b = budget_from_pod(s, QuotaPolicy())
    admission = b.usage()
    recounted = pod_usage(admitted(s, QuotaPolicy()))
    assert recounted == admission

    budgeted = [c for c in b.containers if c.gpus or c.mig]
    assert (admission.pods == 1) == bool(budgeted)
    eff = _flat(admission)
    plain = _flat(usage_of(parse_budget_annotation(b.annotation())))  # every container summed
    per_container = [_flat(c.usage()) for c in budgeted]
    for k, v in eff.items():
        assert v <= plain[k], k
        assert all(v >= c[k] for c in per_container), k

    # and it is exactly Kubernetes' rule (init containers without a GPU request count as 0)
    by_name = {c.name: _flat(c.usage()) for c in b.containers}
    oracle = _oracle([by_name[f"app{i}"] for i in range(len(apps))],
                     [(kind, by_name[f"{kind}{i}"]) for i, (kind, _) in enumerate(inits)],
                     [k for k in eff if k != "pods"])
    assert {k: v for k, v in eff.items() if k != "pods"} == oracle
