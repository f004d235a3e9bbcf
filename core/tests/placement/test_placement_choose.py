"""place(): the issue's cases, reasons, policy, topology, and properties over random nodes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from placement_fixtures import (
    NODE,
    fill,
    gpu_unit,
    mig,
    mig_unit,
    node,
    placed_pod,
    pod,
    vgpu,
    within_capacity,
)

from tessera.api.names import VGPU
from tessera.placement.choose import Fit, NoFit, place
from tessera.placement.policy import Policy
from tessera.placement.usage import UnitUsage, usage

FOURTEEN = [gpu_unit(f"GPU-{i:02d}", 9984, 10, index=i) for i in range(14)]
SPREAD = Policy(gpu="spread")


# -- the two cases ---------------------------------------------------------------------

def test_a_pod_larger_than_every_unit_is_refused_for_good() -> None:
    got = place(NODE, [vgpu(memory=12000)], FOURTEEN, usage(FOURTEEN, []), Policy())
    assert got == NoFit("largest free unit 9984 MiB < 12000 MiB", unresolvable=True)


def test_ten_6000_mib_pods_take_ten_distinct_units() -> None:
    pods = fill(FOURTEEN, [[vgpu(memory=6000)]] * 10)
    assert len(pods) == 10
    assert len({u for p in pods for u in p.record.units()}) == 10
    assert not within_capacity(FOURTEEN, usage(FOURTEEN, pods))


# -- reasons -------------------------------------------------------------------------------------

def test_memory_taken_by_others_is_resolvable() -> None:
    units = FOURTEEN[:2]
    pods = fill(units, [[vgpu(memory=6000)]] * 2)
    got = place(NODE, [vgpu(memory=6000)], units, usage(units, pods), Policy())
    assert got == NoFit("largest free unit 3984 MiB < 6000 MiB", unresolvable=False)


@pytest.mark.parametrize(("units", "demands", "policy", "reason", "unresolvable"), [
    ([mig_unit("GPU-0", "3g.40gb", 0), mig_unit("GPU-0", "3g.40gb", 4)],
     [mig("3g.40gb")] * 1, Policy(), None, None),
    (FOURTEEN, [mig("3g.40gb")], Policy(),
     "no tessera.dev/mig-3g.40gb instance on the node", True),
    (FOURTEEN, [vgpu()], Policy(models=frozenset({"A100-80GB"})),
     "no A100-80GB GPU (gpu-models)", True),
    (FOURTEEN, [vgpu()], Policy(exclude_models=frozenset({"H100-80GB"})),
     "no GPU but H100-80GB (gpu-models-exclude)", True),
    (FOURTEEN[:1], [vgpu()], Policy(exclude_gpus=frozenset({"GPU-00"})),
     "every tessera.dev/vgpu unit is on an excluded GPU (gpu-uuids-exclude)", True),
    ([gpu_unit("GPU-0", healthy=False)], [vgpu()], Policy(),
     "no healthy tessera.dev/vgpu unit", True),
    (FOURTEEN[:2], [vgpu(count=3)], Policy(),
     "3 tessera.dev/vgpu units needed, the node has 2", True),
    (FOURTEEN[:1], [vgpu(cores=60), vgpu("side", cores=60)], Policy(),
     "container side: largest free cores 40% < 60%", True),
    ([gpu_unit("GPU-0", shares=1)], [vgpu(), vgpu("side")], Policy(),
     "container side: 1 tessera.dev/vgpu units with a free share and 0 MiB needed, "
     "0 have them", True),
    ([gpu_unit("GPU-0"), gpu_unit("GPU-1", index=1)], [vgpu(count=2)],
     Policy(topology="nvlink"),
     "2 GPUs joined by NVLink needed, largest NVLink group free: 1", True),
])
def test_reasons(units: list, demands: list, policy: Policy, reason: str | None,
                 unresolvable: bool | None) -> None:
    got = place(NODE, demands, units, usage(units, []), policy)
    if reason is None:
        assert isinstance(got, Fit)
    else:
        assert got == NoFit(reason, unresolvable=bool(unresolvable))


def test_mig_instances_in_use() -> None:
    units = [mig_unit("GPU-0", "3g.40gb", 0), mig_unit("GPU-0", "3g.40gb", 4)]
    pods = fill(units, [[mig("3g.40gb")]] * 2)
    assert len(pods) == 2
    got = place(NODE, [mig("3g.40gb")], units, usage(units, pods), Policy())
    assert got == NoFit("no tessera.dev/mig-3g.40gb instance free (2 of 2 in use)",
                        unresolvable=False)


# -- policy and topology -----------------------------------------------------------------------

def test_binpack_fills_the_fullest_unit_spread_the_emptiest() -> None:
    units = [gpu_unit("GPU-a", 10000), gpu_unit("GPU-b", 20000, index=1)]
    binpack = place(NODE, [vgpu(memory=5000)], units, usage(units, []), Policy())
    spread = place(NODE, [vgpu(memory=5000)], units, usage(units, []), SPREAD)
    assert isinstance(binpack, Fit) and isinstance(spread, Fit)
    assert binpack.record.of("main", VGPU) == ("GPU-a",)
    assert spread.record.of("main", VGPU) == ("GPU-b",)


def test_node_score_follows_the_node_policy() -> None:
    units = [gpu_unit("GPU-a", 10000)]
    full = place(NODE, [vgpu(memory=10000)], units, {}, Policy())
    assert isinstance(full, Fit) and full.score == 10
    empty = place(NODE, [vgpu(memory=0)], units, {}, Policy(node="spread"))
    assert isinstance(empty, Fit) and empty.score == 10


def test_containers_of_one_pod_share_a_unit_and_count_each_other() -> None:
    units = [gpu_unit("GPU-a", 10000)]
    got = place(NODE, [vgpu(memory=6000), vgpu("b", memory=4000)], units, {}, Policy())
    assert isinstance(got, Fit)
    got = place(NODE, [vgpu(memory=6000), vgpu("b", memory=4001)], units, {}, Policy())
    assert got == NoFit("container main: largest free unit 4000 MiB < 6000 MiB", True) or (
        got == NoFit("container b: largest free unit 4000 MiB < 4001 MiB", True))


def test_init_container_reuses_the_app_containers_unit() -> None:
    units = [gpu_unit("GPU-a", 10000), gpu_unit("GPU-b", 10000, index=1)]
    demands = [vgpu("setup", memory=8000, init=True), vgpu(memory=8000)]
    got = place(NODE, demands, units, {}, SPREAD)
    assert isinstance(got, Fit)
    assert got.record.of("setup", VGPU) == got.record.of("main", VGPU)
    assert usage(units, [placed_pod("ns/p", got.record, demands)])[
        got.record.of("main", VGPU)[0]] == UnitUsage(8000, 0, 1, False, ("ns/p",))


def test_sidecar_counts_with_a_later_init_container() -> None:
    units = [gpu_unit("GPU-a", 10000)]
    demands = [vgpu("proxy", memory=3000, sidecar=True), vgpu("setup", memory=8000, init=True),
               vgpu(memory=1000)]
    assert place(NODE, demands, units, {}, Policy()) == NoFit(
        "container setup: largest free unit 7000 MiB < 8000 MiB", True)


def test_prefer_takes_nvlink_then_numa() -> None:
    units = [gpu_unit("GPU-0", 10000, numa=0, index=0),
             gpu_unit("GPU-1", 10000, numa=1, index=1, peers=["GPU-3"]),
             gpu_unit("GPU-2", 10000, numa=0, index=2),
             gpu_unit("GPU-3", 10000, numa=1, index=3)]
    got = place(NODE, [vgpu(count=2, memory=1000)], units, {}, Policy())
    assert isinstance(got, Fit) and sorted(got.record.of("main", VGPU)) == ["GPU-1", "GPU-3"]
    busy = fill(units, [[vgpu(memory=9500)]])  # takes GPU-0 (binpack, uuid order)
    got = place(NODE, [vgpu(count=2, memory=1000)], units, usage(units, busy), Policy())
    assert isinstance(got, Fit) and sorted(got.record.of("main", VGPU)) == ["GPU-1", "GPU-3"]
    no_link = [u for u in units if u.uuid != "GPU-3"]
    got = place(NODE, [vgpu(count=2, memory=1000)], no_link, {}, Policy())
    assert isinstance(got, Fit) and sorted(got.record.of("main", VGPU)) == ["GPU-0", "GPU-2"]


# -- properties ----------------------------------------------------------------------------------

POLICIES = st.builds(Policy, node=st.sampled_from(["binpack", "spread"]),
                     gpu=st.sampled_from(["binpack", "spread"]),
                     topology=st.sampled_from(["prefer", "nvlink", "none"]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(node(), st.lists(pod(), min_size=1, max_size=8), POLICIES)
def test_placed_pods_never_overfill_a_unit(units: list, pods: list, policy: Policy) -> None:
    placed = []
    for n, demands in enumerate(pods):
        used = usage(units, placed)
        got = place(NODE, demands, units, used, policy)
        assert got == place(NODE, demands, units, used, policy)  # deterministic
        if isinstance(got, NoFit):
            assert got.reason and "\n" not in got.reason
            if got.unresolvable:
                assert isinstance(place(NODE, demands, units, {}, policy), NoFit)
            continue
        assert 0 <= got.score <= 10
        by_uuid = {u.uuid: u for u in units}
        for d in demands:
            mine = got.record.of(d.container, d.resource)
            assert len(mine) == d.count == len(set(mine))  # distinct units per container
            for uuid in mine:
                u = by_uuid[uuid]
                assert u.resource == d.resource and u.healthy
        placed.append(placed_pod(f"ns/p{n}", got.record, demands))
        after = usage(units, placed)
        assert not within_capacity(units, after)
        for u in units:  # never two pods on one whole instance
            if not u.shared:
                assert len(after[u.uuid].holders) <= 1


@settings(max_examples=150, deadline=None)
@given(node(mig_ok=False), st.lists(pod(), max_size=5),
       st.sampled_from([1000, 3000, 6000, 9000]))
def test_binpack_picks_no_more_free_memory_than_spread(units: list, earlier: list,
                                                        memory: int) -> None:
    placed = fill(units, earlier)
    used = usage(units, placed)
    binpack = place(NODE, [vgpu(memory=memory)], units, used, Policy())
    spread = place(NODE, [vgpu(memory=memory)], units, used, SPREAD)
    assert isinstance(binpack, Fit) == isinstance(spread, Fit)
    if isinstance(binpack, Fit) and isinstance(spread, Fit):
        by_uuid = {u.uuid: u for u in units}

        def free(fit: Fit) -> int:
            uuid = fit.record.of("main", VGPU)[0]
            return by_uuid[uuid].memory_mib - used[uuid].memory_mib

        assert free(binpack) <= free(spread)
