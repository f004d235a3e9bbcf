"""victims(): the fewest lower-priority pods, checked against every subset on small nodes."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_fixtures import NODE, fill, gpu_unit, node, pod, vgpu

from tessera.placement import preemption
from tessera.placement.choose import Fit, place
from tessera.placement.policy import Policy
from tessera.placement.usage import usage


def fits_without(units: list, demands: list, pods: list, removed: set[int]) -> bool:
    kept = [p for i, p in enumerate(pods) if i not in removed]
    return isinstance(place(NODE, demands, units, usage(units, kept), Policy()), Fit)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node(max_gpus=3), st.lists(pod(), min_size=1, max_size=7),
       st.lists(st.integers(0, 3), min_size=7, max_size=7), pod(), st.integers(0, 4))
def test_victims_are_the_fewest_lower_priority_pods(units: list, earlier: list,
                                                     priorities: list, demands: list,
                                                     priority: int) -> None:
    pods = fill(units, earlier, priorities=priorities)
    got = preemption.victims(NODE, priority, demands, units, pods, Policy())
    lower = [i for i, p in enumerate(pods) if p.priority < priority]
    works = [set(c) for size in range(len(lower) + 1) for c in combinations(lower, size)
             if fits_without(units, demands, pods, set(c))]
    if not works:
        assert got is None
        return
    assert got is not None
    assert all(v.priority < priority for v in got)
    assert len(got) == min(len(c) for c in works)
    removed = {i for i, p in enumerate(pods) if p in got}
    assert fits_without(units, demands, pods, removed)


def test_prefers_the_lowest_priorities_then_keys() -> None:
    units = [gpu_unit("GPU-a", 10000)]
    pods = fill(units, [[vgpu(memory=5000)], [vgpu(memory=5000)]], priorities=[5, 1])
    got = preemption.victims(NODE, 10, [vgpu(memory=5000)], units, pods, Policy())
    assert got is not None and [p.key for p in got] == ["ns/pod-01"]
    assert preemption.victims(NODE, 1, [vgpu(memory=5000)], units, pods, Policy()) is None
    assert preemption.victims(NODE, 1, [vgpu(memory=1)], [gpu_unit("GPU-b")], [],
                              Policy()) == []


def test_greedy_beyond_the_exhaustive_bound() -> None:
    units = [gpu_unit(f"GPU-{i:02d}", 10000, 2, index=i) for i in range(8)]
    pods = fill(units, [[vgpu(memory=5000)]] * 16, priorities=list(range(16)))
    assert len(pods) == 16 > preemption.EXHAUSTIVE_CANDIDATES
    got = preemption.victims(NODE, 100, [vgpu(memory=10000)], units, pods, Policy())
    assert got is not None and len(got) == 2
    assert got[0].record.units() == got[1].record.units()
