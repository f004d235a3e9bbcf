"""What the device plugin advertises and how it allocates (pure, table-driven)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import GPU_POD, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState, ProfileInfo
from tessera_node.deviceplugin.allocation import decide, preferred
from tessera_node.deviceplugin.devices import (
    HEALTHY,
    UNHEALTHY,
    PluginDevice,
    advertised,
    capacity_patch,
    share_id,
    unit_of,
    units,
    vgpu_capacity,
)

GIB = 1 << 30
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"
M0 = "MIG-a0000000-0000-0000-0000-000000000000"
M1 = "MIG-a1111111-1111-1111-1111-111111111111"
M2 = "MIG-a2222222-2222-2222-2222-222222222222"


def gpu(index: int, uuid: str, mig: bool = False,
        instances: tuple[MigInstanceState, ...] = ()) -> GPUState:
    return GPUState(
        index=index, uuid=uuid, name="NVIDIA H100 80GB HBM3", pci_device_id=0x233010DE,
        memory_total_bytes=80 * GIB, memory_used_bytes=0, utilization_percent=0,
        mig_mode="enabled" if mig else "disabled", instances=instances,
        profiles=(ProfileInfo(19, "1g.10gb", 9984, 1, 7, 16),),
    )


def inst(uuid: str, profile: str = "1g.10gb", mem: int | None = 10 * GIB, start: int = 0
         ) -> MigInstanceState:
    return MigInstanceState(profile_id=19, profile=profile, start=start, size=1, gi_id=start,
                            uuid=uuid, memory_total_bytes=mem)


SNAP = DeviceSnapshot(gpus=(
    gpu(0, G0),
    gpu(1, G1, mig=True, instances=(inst(M0), inst(M1, start=1), inst("", start=2))),
))


@pytest.mark.parametrize(
    ("sharing", "shares", "want"),
    [
        # MIG instances whole by default: one mig resource, vgpu shares of the whole GPU only
        ({}, 2, {VGPU: [share_id(G0, 0), share_id(G0, 1)],
                 "tessera.dev/mig-1g.10gb": [M0, M1]}),
        # Shares: the instances join vgpu, and the mig resource is not advertised at all
        ({G1: "Shares"}, 1, {VGPU: [share_id(G0, 0), share_id(M0, 0), share_id(M1, 0)]}),
        ({G1: "Whole"}, 1, {VGPU: [share_id(G0, 0)], "tessera.dev/mig-1g.10gb": [M0, M1]}),
    ],
    ids=["default-whole", "shares", "explicit-whole"],
)
def test_one_instance_one_use(sharing: dict[str, str], shares: int,
                              want: dict[str, list[str]]) -> None:
    got = advertised(units(SNAP), shares, sharing)  # type: ignore[arg-type]
    assert {r: [d.id for d in ds] for r, ds in got.items()} == want
    every_unit = [unit_of(d.id) for ds in got.values() for d in ds]
    by_resource = {unit_of(d.id): r for r, ds in got.items() for d in ds}
    assert len(by_resource) == len(set(every_unit))  # no unit under two resources


def test_profiles_of_the_layout_stay_advertised_while_empty() -> None:
    got = advertised([], 4, {}, frozenset({"3g.40gb"}))
    assert got == {VGPU: [], "tessera.dev/mig-3g.40gb": []}


@pytest.mark.parametrize(
    ("unhealthy", "mem", "bad"),
    [
        (frozenset(), 10 * GIB, set()),
        (frozenset({G1}), 10 * GIB, {M0, M1}),  # a GPU's health covers its instances
        (frozenset({M0}), 10 * GIB, {M0}),
        (frozenset(), None, set()),  # memory from the profile table when NVML gives none
    ],
)
def test_health(unhealthy: frozenset[str], mem: int | None, bad: set[str]) -> None:
    snap = DeviceSnapshot(gpus=(gpu(1, G1, True, (inst(M0, mem=mem), inst(M1, start=1))),))
    us = units(snap, unhealthy)
    assert {u.uuid for u in us if not u.healthy} == bad
    assert all(u.memory_bytes for u in us)
    got = advertised(us, 1, {})["tessera.dev/mig-1g.10gb"]
    assert {d.id for d in got if d.health == UNHEALTHY} == bad


def test_unknown_memory_is_unhealthy() -> None:
    g = gpu(1, G1, True, (inst(M0, mem=None),))
    g = GPUState(**{**g.__dict__, "profiles": ()})
    assert [u.healthy for u in units(DeviceSnapshot(gpus=(g,)))] == [False]


def test_capacity_counts_shared_healthy_units_and_a_gpu_pod_per_pod_the_kubelet_runs() -> None:
    us = units(SNAP)
    assert vgpu_capacity(us, {}) == {VGPU_MEMORY: str(80 * 1024), VGPU_CORES: "100",
                                     GPU_POD: "110"}
    cap = vgpu_capacity(us, {G1: "Shares"}, 250)
    assert cap == {VGPU_MEMORY: str(80 * 1024 + 2 * 10 * 1024), VGPU_CORES: "300",
                   GPU_POD: "250"}
    assert capacity_patch(cap) == {"status": {"capacity": cap, "allocatable": cap}}


GPU_OF = {"A": "g0", "B": "g0", "C": "g1", "D": "g2"}


def ids(units_free: dict[str, int]) -> list[str]:
    return [share_id(u, k) for u, n in units_free.items() for k in range(n)]


@pytest.mark.parametrize(
    ("free", "must", "size", "policy", "want"),
    [
        # pack: the GPU with the fewest free shares first, then the unit with the fewest
        ({"A": 1, "B": 4, "C": 2, "D": 4}, [], 1, "pack", ["C::0"]),
        ({"A": 1, "B": 4, "C": 2, "D": 4}, [], 2, "pack", ["C::0", "D::0"]),
        ({"A": 1, "B": 1, "C": 4, "D": 3}, [], 2, "pack", ["A::0", "B::0"]),
        # spread: the emptiest first
        ({"A": 1, "B": 4, "C": 2, "D": 4}, [], 1, "spread", ["B::0"]),
        ({"A": 1, "B": 4, "C": 2, "D": 4}, [], 2, "spread", ["B::0", "D::0"]),
        # must-include first, never a second share on the same unit
        ({"A": 2, "C": 2}, ["A::1"], 2, "pack", ["A::1", "C::0"]),
        ({"A": 3}, [], 2, "pack", ["A::0"]),
    ],
)
def test_preferred_allocation(free: dict[str, int], must: list[str], size: int, policy: str,
                              want: list[str]) -> None:
    assert preferred(ids(free), must, size, GPU_OF, policy) == want  # type: ignore[arg-type]


@given(st.dictionaries(st.sampled_from("ABCD"), st.integers(1, 5), min_size=1),
       st.integers(1, 6), st.sampled_from(["pack", "spread"]))
def test_preferred_never_repeats_a_unit(free: dict[str, int], size: int, policy: str) -> None:
    got = preferred(ids(free), [], size, GPU_OF, policy)  # type: ignore[arg-type]
    assert len(got) == min(size, len(free))
    assert len({unit_of(d) for d in got}) == len(got)
    assert set(got) <= set(ids(free))


DEVS = [PluginDevice("A::0", "A", HEALTHY), PluginDevice("A::1", "A", HEALTHY),
        PluginDevice("B::0", "B", HEALTHY), PluginDevice("C::0", "C", UNHEALTHY)]


@pytest.mark.parametrize(
    ("req", "units_", "error"),
    [
        (["A::0", "B::0"], ("A", "B"), None),
        (["A::0", "A::1"], (), "two shares on A"),
        (["C::0"], (), "unhealthy"),
        (["Z::0"], (), "unknown device"),
        ([], (), "no devices"),
    ],
)
def test_allocate_decision(req: list[str], units_: tuple[str, ...], error: str | None) -> None:
    d = decide(req, DEVS)
    assert d.units == units_
    assert (d.error is None) if error is None else (error in (d.error or ""))
