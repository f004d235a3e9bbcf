"""Least fragmentation for whole MIG instances, against a brute-force oracle.

The oracle re-derives usefulness with the planner's own validity check
(:func:`tessera.mig.planner.validate`): a profile fits a GPU's free slices when adding an
instance of it at some start to the held instances is a valid state.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from placement_fixtures import NODE, fill, mig, mig_gpu, mig_unit, placed_pod

from tessera.mig.catalog import profiles
from tessera.mig.planner import Instance, LayoutError, validate
from tessera.placement.choose import Fit, place
from tessera.placement.policy import Policy
from tessera.placement.record import PlacementRecord
from tessera.placement.units import Unit
from tessera.placement.usage import usage


def oracle_usefulness(model: str, held: list[Unit]) -> int:
    state = [Instance(u.profile or "", u.start or 0) for u in held]
    best = 0
    for p in profiles(model):
        if p.media_extensions:
            continue
        for s in p.starts:
            try:
                validate(model, [*state, Instance(p.name, s)])
            except LayoutError:
                continue
            best = max(best, p.memory_slices)
    return best


def oracle_choice(units: list[Unit], held: set[str], resource: str) -> str | None:
    gpus = sorted({u.gpu_uuid for u in units})
    candidates = [u for u in units if u.resource == resource and u.uuid not in held]
    if not candidates:
        return None

    def key(c: Unit) -> tuple:
        now = held | {c.uuid}
        per_gpu = sorted((oracle_usefulness(
            next(u.model for u in units if u.gpu_uuid == g),
            [u for u in units if u.gpu_uuid == g and u.uuid in now]) for g in gpus),
            reverse=True)
        free_here = sum(1 for u in units if u.gpu_uuid == c.gpu_uuid and u.uuid not in held)
        return ([-x for x in per_gpu], free_here, -(c.start or 0), c.uuid)

    return min(candidates, key=key).uuid


@st.composite
def mig_node(draw: st.DrawFn) -> list[Unit]:
    return [u for i in range(draw(st.integers(1, 3))) for u in draw(mig_gpu(i, whole_share=1))]


@settings(max_examples=200, deadline=None)
@given(mig_node(), st.data())
def test_choice_matches_the_oracle(units: list[Unit], data: st.DataObject) -> None:
    wanted = data.draw(st.sampled_from(sorted({u.profile or "" for u in units})))
    taken = data.draw(st.lists(st.sampled_from(units), max_size=len(units), unique=True))
    busy = [placed_pod(f"ns/p{n}", PlacementRecord(NODE, {"main": {u.resource: (u.uuid,)}}),
                       [mig(u.profile or "")]) for n, u in enumerate(taken)]
    used = usage(units, busy)
    held = {u.uuid for u in taken}
    resource = mig(wanted).resource
    got = place(NODE, [mig(wanted)], units, used, Policy())
    expected = oracle_choice(units, held, resource)
    if expected is None:
        assert not isinstance(got, Fit)
    else:
        assert isinstance(got, Fit) and got.record.units() == {expected}


def test_small_instances_pack_onto_one_gpu_from_the_top() -> None:
    units = [mig_unit(g, "1g.10gb", s, index=i) for i, g in enumerate(["GPU-0", "GPU-1"])
             for s in range(7)]
    busy = fill(units, [[mig("1g.10gb")]] * 2)
    assert [sorted(p.record.units()) for p in busy] == [["MIG-0-1g.10gb@6"],
                                                        ["MIG-0-1g.10gb@5"]]


def test_two_instances_in_one_container_take_the_least_fragmenting_pair() -> None:
    units = [mig_unit("GPU-0", "1g.10gb", s) for s in range(7)]
    got = place(NODE, [mig("1g.10gb", count=2)], units, {}, Policy())
    assert isinstance(got, Fit)
    assert sorted(got.record.units()) == ["MIG-0-1g.10gb@5", "MIG-0-1g.10gb@6"]
