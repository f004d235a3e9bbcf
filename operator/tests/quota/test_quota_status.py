"""A GPUQuota's conditions and the over-hard rule (shared by status and the quota webhook)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.api.conditions import DEGRADED, READY, get_condition
from tessera_operator.quota import Limits, Usage
from tessera_operator.quota.status import over_hard, quota_conditions


def test_over_hard_names_each_resource_with_used_and_hard() -> None:
    limits = Limits(memory_mib=40 * 1024, cores=100, pods=2, mig={"1g.10gb": 1})
    used = Usage(48 * 1024, 100, 3, {"1g.10gb": 2})
    assert over_hard(limits, used) == [("memory", "48Gi", "40Gi"), ("pods", "3", "2"),
                                       ("migInstances.1g.10gb", "2", "1")]


def test_uncounted_quota_is_not_ready_and_never_degraded() -> None:
    conds = quota_conditions([], Limits(cores=10), None, 3)
    ready, degraded = get_condition(conds, READY), get_condition(conds, DEGRADED)
    assert ready is not None and (ready.status, ready.reason) == ("False", "Counting")
    assert degraded is not None and degraded.status == "False"
    assert {c.observed_generation for c in conds} == {3}


def test_over_hard_is_degraded_with_the_reason_and_ready_stays_true() -> None:
    conds = quota_conditions([], Limits(cores=5), Usage(0, 10, 1), 1)
    degraded = get_condition(conds, DEGRADED)
    assert degraded is not None and degraded.status == "True"
    assert degraded.message.startswith("cores used 10 > hard 5: existing pods keep running")
    ready = get_condition(conds, READY)
    assert ready is not None and ready.status == "True"


usages = st.builds(Usage, st.integers(0, 10**6), st.integers(0, 10**4), st.integers(0, 100),
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 8),
                                   max_size=2))
limits = st.builds(Limits, st.none() | st.integers(0, 10**6), st.none() | st.integers(0, 10**4),
                   st.none() | st.integers(0, 100),
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 8),
                                   max_size=2))


@given(limits, usages)
def test_degraded_exactly_when_some_limited_resource_is_over(hard: Limits, used: Usage) -> None:
    over = (any(lim is not None and u > lim for lim, u in (
        (hard.memory_mib, used.memory_mib), (hard.cores, used.cores), (hard.pods, used.pods)))
        or any(used.mig.get(p, 0) > lim for p, lim in hard.mig.items()))
    assert bool(over_hard(hard, used)) == over
    degraded = get_condition(quota_conditions([], hard, used, 1), DEGRADED)
    assert degraded is not None and degraded.status == ("True" if over else "False")
