"""An on-demand MIG GPU as partitionable DRA devices (tessera.dra.partitions): the devices
the counters let the scheduler allocate together are exactly the placements the planner's
validation lets coexist, on every placed layout of a GPU; names, counters and sizes within
what resource.k8s.io/v1 accepts."""

from __future__ import annotations

from functools import cache
from itertools import combinations
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.dra.devices import (
    MAX_KEYS,
    MAX_NAME,
    device_name,
    is_c_identifier,
    is_dns_label,
)
from tessera.dra.partitions import (
    COMPUTE_SLICES,
    INSTANCES,
    MAX_CONSUMPTIONS_PER_DEVICE,
    MAX_COUNTERS_PER_CONSUMPTION,
    MAX_COUNTERS_PER_SET,
    MAX_COUNTERS_PER_SLICE_1_34,
    MAX_DEVICES_CONSUMING_COUNTERS,
    MEDIA_ENGINES,
    Bounds,
    allocatable,
    counted_profiles,
    gpu_partitions,
    memory_slice_counter,
    placement_of,
)
from tessera.mig.catalog import profile, profiles, slice_counts
from tessera.mig.planner import Instance, LayoutError, validate
from tessera.models import MODELS, get_model

MODEL_IDS = ["A100-40GB", "H100-80GB", "A30-24GB"]
State = frozenset[tuple[str, int]]


def gpu(model: str, index: int = 0) -> GPUInventory:
    return GPUInventory(index=index, uuid=f"GPU-{index:08d}-0000-0000-0000-000000000000",
                        model=model, memoryMiB=get_model(model).memory_mib, migMode="enabled",
                        numaNode=0, pciBusId=f"00000000:{index + 16:02X}:00.0")


def placement(device: dict[str, Any]) -> tuple[str, int]:
    a = device["attributes"]
    return a["migProfile"]["string"], a["start"]["int"]


def planner_accepts(model: str, instances: list[tuple[str, int]]) -> bool:
    try:
        validate(model, [Instance(n, s) for n, s in instances])
    except LayoutError:
        return False
    return True


@cache
def states(model: str) -> tuple[State, ...]:
    """Every set of instances the planner accepts on one GPU (the empty one included):
    placements tried in a fixed order, each added or not."""
    options = [(p.name, s) for p in profiles(model) for s in p.starts]
    out: list[State] = []

    def grow(k: int, placed: list[tuple[str, int]]) -> None:
        if k == len(options):
            out.append(frozenset(placed))
            return
        grow(k + 1, placed)
        if planner_accepts(model, [*placed, options[k]]):
            grow(k + 1, [*placed, options[k]])

    grow(0, [])
    return tuple(out)


occupied_case = st.sampled_from(MODEL_IDS).flatmap(
    lambda m: st.tuples(st.just(m), st.sampled_from(states(m))))


@settings(max_examples=200, deadline=None)
@given(occupied_case)
def test_the_devices_are_exactly_the_placements_the_gpu_can_still_take(
    case: tuple[str, State],
) -> None:
    model, occupied = case
    got = gpu_partitions(gpu(model), [Instance(n, s) for n, s in occupied])
    published = [placement(d) for d in got.devices]
    assert len(published) == len(set(published))
    assert set(published) == {(p.name, s) for p in profiles(model) for s in p.starts
                              if planner_accepts(model, [*occupied, (p.name, s)])}


@settings(max_examples=200, deadline=None)
@given(occupied_case)
def test_two_devices_are_allocatable_together_exactly_when_the_planner_lets_them_coexist(
    case: tuple[str, State],
) -> None:
    model, occupied = case
    got = gpu_partitions(gpu(model), [Instance(n, s) for n, s in occupied])
    for a, b in combinations(got.devices, 2):
        together = [*occupied, placement(a), placement(b)]
        expected = planner_accepts(model, together)
        assert allocatable([got.counter_set], [a, b]) == expected, (a["name"], b["name"])


@settings(max_examples=200, deadline=None)
@given(occupied_case.flatmap(lambda c: st.tuples(
    st.just(c), st.lists(st.integers(0, 24), max_size=8, unique=True))))
def test_any_set_of_devices_is_allocatable_exactly_when_the_planner_accepts_it(
    case: tuple[tuple[str, State], list[int]],
) -> None:
    (model, occupied), picks = case
    got = gpu_partitions(gpu(model), [Instance(n, s) for n, s in occupied])
    chosen = [got.devices[i] for i in picks if i < len(got.devices)]
    together = [*occupied, *(placement(d) for d in chosen)]
    assert allocatable([got.counter_set], chosen) == planner_accepts(model, together)


bounds_case = occupied_case.flatmap(lambda c: st.tuples(
    st.just(c),
    st.lists(st.sampled_from([p.name for p in profiles(c[0])]), max_size=3, unique=True),
    st.one_of(st.none(), st.integers(1, 7)),
    st.lists(st.integers(0, 24), max_size=8, unique=True)))


@settings(max_examples=300, deadline=None)
@given(bounds_case)
def test_bounds_publish_only_allowed_profiles_and_count_instances_against_the_limit(
    case: tuple[tuple[str, State], list[str], int | None, list[int]],
) -> None:
    """``onDemand.profiles`` and ``maxInstances``: only allowed profiles are published, and
    a set of devices is allocatable exactly when the planner accepts it and the GPU's
    instances (occupied ones included) stay within the limit."""
    (model, occupied), allowed, limit, picks = case
    bounds = Bounds(tuple(allowed), limit)
    got = gpu_partitions(gpu(model), [Instance(n, s) for n, s in occupied], bounds=bounds)
    assert all(not allowed or placement(d)[0] in allowed for d in got.devices)
    if limit is not None and len(occupied) >= limit:
        assert got.devices == []
        return
    if limit is not None:
        assert got.counter_set["counters"][INSTANCES] == {"value": str(limit - len(occupied))}
    chosen = [got.devices[i] for i in picks if i < len(got.devices)]
    together = [*occupied, *(placement(d) for d in chosen)]
    within = limit is None or len(together) <= limit
    assert allocatable([got.counter_set], chosen) == (
        planner_accepts(model, together) and within)


@pytest.mark.parametrize("model", MODEL_IDS)
def test_every_layout_of_an_empty_gpu_is_allocatable(model: str) -> None:
    # with +me variants, at most one +me instance per GPU
    assert len(states(model)) == {"A30-24GB": 76}.get(model, 2319)
    got = gpu_partitions(gpu(model), [])
    by_placement = {placement(d): d for d in got.devices}
    for state in states(model):
        assert allocatable([got.counter_set], [by_placement[i] for i in state])


@pytest.mark.parametrize("model", [m.id for m in MODELS])
def test_each_device_consumes_exactly_what_its_placement_takes(model: str) -> None:
    got = gpu_partitions(gpu(model, 3), [])
    memory, compute = slice_counts(model)
    assert counted_profiles(model) == ()  # +me: the media-engines counter instead
    assert set(got.counter_set["counters"]) == (
        {memory_slice_counter(s) for s in range(memory)} | {COMPUTE_SLICES, MEDIA_ENGINES})
    assert got.counter_set["counters"][MEDIA_ENGINES] == {"value": "1"}
    assert got.counter_set["counters"][COMPUTE_SLICES] == {"value": str(compute)}
    assert len(got.devices) == sum(len(p.starts) for p in profiles(model))
    for d in got.devices:
        name, start = placement(d)
        p = profile(model, name)
        (entry,) = d["consumesCounters"]
        assert entry["counterSet"] == got.counter_set["name"] == "gpu3-slices"
        expected = {memory_slice_counter(s): {"value": "1"}
                    for s in range(start, start + p.memory_slices)}
        expected[COMPUTE_SLICES] = {"value": str(p.compute_slices)}
        if p.media_extensions:
            expected[MEDIA_ENGINES] = {"value": "1"}
        assert entry["counters"] == expected


def test_the_media_extension_profiles_share_the_gpus_one_set_of_media_engines() -> None:
    """On an A30 both +me profiles consume the one ``media-engines`` counter: a 1g.6gb+me
    and a 2g.12gb+me are never allocated together (each takes the GPU's OFA engine)."""
    got = gpu_partitions(gpu("A30-24GB"), [])
    one = next(d for d in got.devices if placement(d) == ("1g.6gb+me", 0))
    two = next(d for d in got.devices if placement(d) == ("2g.12gb+me", 2))
    assert allocatable([got.counter_set], [one]) and allocatable([got.counter_set], [two])
    assert not allocatable([got.counter_set], [one, two])


def test_occupied_instances_take_their_room_and_lower_the_counters() -> None:
    got = gpu_partitions(gpu("H100-80GB"), [Instance("3g.40gb", 4),
                                            Instance("1g.10gb+me", 0)])
    assert sorted(placement(d) for d in got.devices) == [
        ("1g.10gb", 1), ("1g.10gb", 2), ("1g.10gb", 3), ("1g.20gb", 2), ("2g.20gb", 2)]
    counters = got.counter_set["counters"]
    assert counters[COMPUTE_SLICES] == {"value": "3"}
    assert counters[MEDIA_ENGINES] == {"value": "0"}
    with pytest.raises(LayoutError, match="occupied instances are invalid"):
        gpu_partitions(gpu("H100-80GB"), [Instance("4g.40gb", 0), Instance("3g.40gb", 0)])


def test_a_counter_no_set_has_makes_devices_unallocatable() -> None:
    got = gpu_partitions(gpu("H100-80GB"), [])
    assert allocatable([], []) and allocatable([got.counter_set], [])
    assert not allocatable([], got.devices[:1])


def test_a_placement_device_is_named_as_the_instance_it_becomes() -> None:
    g = gpu("H100-80GB", 2)
    for d in gpu_partitions(g, []).devices:
        name, start = placement(d)
        unit = AdvertisedUnit(uuid="MIG-x", resource="r", memoryMiB=1, profile=name,
                              start=start)
        assert d["name"] == device_name(g, unit)


@pytest.mark.parametrize("model", [m.id for m in MODELS])
@pytest.mark.parametrize("index", [0, 7, 9999])
def test_within_the_api_limits(model: str, index: int) -> None:
    got = gpu_partitions(gpu(model, index), [])
    s = got.counter_set
    assert is_dns_label(s["name"]) and len(s["name"]) <= MAX_NAME
    assert len(s["counters"]) <= MAX_COUNTERS_PER_SET
    assert all(is_dns_label(n) and len(n) <= MAX_NAME for n in s["counters"])
    # 1.34 keeps counters and devices in one slice, at most 32 counters over its sets
    assert 3 * len(s["counters"]) <= MAX_COUNTERS_PER_SLICE_1_34
    assert len(got.devices) <= MAX_DEVICES_CONSUMING_COUNTERS
    names = [d["name"] for d in got.devices]
    assert len(names) == len(set(names))
    for d in got.devices:
        assert is_dns_label(d["name"]) and len(d["name"]) <= MAX_NAME
        keys = [*d["attributes"], *d["capacity"]]
        assert len(keys) <= MAX_KEYS and all(is_c_identifier(k) for k in keys)
        assert 1 <= len(d["consumesCounters"]) <= MAX_CONSUMPTIONS_PER_DEVICE
        for entry in d["consumesCounters"]:
            assert len(entry["counters"]) <= MAX_COUNTERS_PER_CONSUMPTION
            assert set(entry["counters"]) <= set(s["counters"])
        assert "allowMultipleAllocations" not in d  # one claim per placement


@pytest.mark.parametrize("model", [m.id for m in MODELS])
def test_compute_slices_never_run_out_before_memory_slices(model: str) -> None:
    """Why ``compute-slices`` never refuses what the memory slices allow on these models
    (it stays, to keep the counters exact should a geometry differ)."""
    compute = slice_counts(model)[1]
    options = [(p, s) for p in profiles(model) for s in p.starts]
    most = 0

    def grow(k: int, taken: int, used: int, counts: dict[str, int]) -> None:
        nonlocal most
        if k == len(options):
            most = max(most, used)
            return
        grow(k + 1, taken, used, counts)
        p, s = options[k]
        if not taken & p.mask(s) and counts.get(p.name, 0) < p.max_count:
            grow(k + 1, taken | p.mask(s), used + p.compute_slices,
                 {**counts, p.name: counts.get(p.name, 0) + 1})

    grow(0, 0, 0, {})
    assert most == compute


@pytest.mark.parametrize("model", MODEL_IDS)
def test_a_placement_device_name_reads_back_as_its_placement_and_nothing_else_does(
        model: str) -> None:
    for d in gpu_partitions(gpu(model, 2), []).devices:
        assert placement_of(d["name"], 2, model) == placement(d)
        assert placement_of(d["name"], 3, model) is None  # another GPU's
    for name in ("gpu2", "gpu2-mig9-1g10gb", "gpu2-mig1-3g40gb", "gpu2-mig0-9g99gb",
                 "gpu2-mig0-", "xgpu2-mig0-1g10gb", "gpu2-mig0-1g10gb/.."):
        assert placement_of(name, 2, model) is None, name
