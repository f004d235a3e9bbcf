"""A node's ResourceSlices (tessera.dra.slices): one pool per node, written only on a
difference (by value), slices of at most 64 devices, and what a read-back lost."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import DRA_DRIVER
from tessera.dra.slices import (
    MAX_COUNTER_SETS,
    MAX_DEVICES,
    MAX_NAME,
    Plan,
    as_kept,
    dropped,
    plan,
    slice_name,
)

NODE = "node-0"


def device(i: int, memory_mib: int = 9984, shared: bool = True) -> dict[str, Any]:
    d: dict[str, Any] = {"name": f"gpu{i}", "attributes": {"index": {"int": i}},
                         "capacity": {"memory": {"value": str(memory_mib << 20)},
                                      "cores": {"value": "100"}}}
    if shared:
        d["allowMultipleAllocations"] = True
        d["capacity"]["memory"]["requestPolicy"] = {
            "default": str(memory_mib << 20), "validRange": {"min": "1Mi", "step": "1Mi"}}
    return d


def apply(p: Plan, existing: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the API server holds after the plan's writes (as it would print them)."""
    held = {s["metadata"]["name"]: s for s in existing}
    for s in [*p.create, *p.replace]:
        held[s["metadata"]["name"]] = copy.deepcopy(s)
    for name in p.delete:
        held.pop(name)
    return list(held.values())


def test_first_publication_then_nothing_at_idle() -> None:
    devices = [device(i) for i in range(3)]
    first = plan(NODE, devices, [])
    assert first.generation == 1 and len(first.create) == 1 and first.writes == 1
    s = first.create[0]
    assert s["metadata"]["name"] == f"{NODE}-{DRA_DRIVER}-0"
    assert s["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert s["spec"]["nodeName"] == NODE and s["spec"]["driver"] == DRA_DRIVER
    held = apply(first, [])
    assert plan(NODE, devices, held).writes == 0


def test_the_api_servers_rendering_of_a_quantity_is_no_difference() -> None:
    devices = [device(0)]
    held = apply(plan(NODE, devices, []), [])
    shown = json.loads(json.dumps(held).replace(str(9984 << 20), "9984Mi"))
    assert shown != held and plan(NODE, devices, shown).writes == 0


def test_a_change_moves_the_generation_and_rewrites_the_pool() -> None:
    devices = [device(i) for i in range(MAX_DEVICES + 1)]
    p = plan(NODE, devices, [])
    assert len(p.create) == 2 and {s["spec"]["pool"]["resourceSliceCount"] for s in p.create} == {2}
    held = apply(p, [])
    fewer = plan(NODE, devices[:2], held)
    assert fewer.generation == 2 and len(fewer.replace) == 1
    assert fewer.delete == [slice_name(NODE, 1)]
    held = apply(fewer, held)
    assert plan(NODE, devices[:2], held).writes == 0
    grown = plan(NODE, [device(0, 20096), device(1)], held)
    assert grown.generation == 3 and grown.writes == 1


def test_slices_of_other_nodes_and_drivers_are_not_ours() -> None:
    other = {"metadata": {"name": "x"}, "spec": {"driver": "gpu.nvidia.com",
                                                  "nodeName": NODE, "devices": []}}
    p = plan(NODE, [device(0)], [other])
    assert p.delete == [] and len(p.create) == 1


def test_a_gate_off_drops_fields_and_the_read_back_says_so() -> None:
    written = [device(0), device(1, shared=False)]
    back = copy.deepcopy(written)
    assert dropped(written, back) == []
    del back[0]["allowMultipleAllocations"]
    del back[0]["capacity"]["memory"]["requestPolicy"]
    assert dropped(written, back) == ["allowMultipleAllocations",
                                      "capacity memory requestPolicy"]
    assert dropped(written, back[1:]) == ["devices"]


def test_a_long_node_name_still_gives_a_valid_slice_name() -> None:
    name = slice_name("n" * 250, 3)
    assert len(name) <= MAX_NAME and name.endswith("-3")


@given(st.lists(st.integers(1, 200), max_size=150), st.lists(st.integers(1, 200), max_size=150))
def test_any_change_converges_in_one_plan(before: list[int], after: list[int]) -> None:
    """From any published pool to any other: one plan, then nothing; no slice over the
    limit; the pool's slices agree on one generation and their count."""
    old = [device(i, m) for i, m in enumerate(before)]
    new = [device(i, m) for i, m in enumerate(after)]
    held = apply(plan(NODE, old, []), [])
    p = plan(NODE, new, held)
    held = apply(p, held)
    assert plan(NODE, new, held).writes == 0
    pools = {(s["spec"]["pool"]["generation"], s["spec"]["pool"]["resourceSliceCount"])
             for s in held}
    assert len(pools) == 1 and next(iter(pools))[1] == len(held)
    assert all(len(s["spec"]["devices"]) <= MAX_DEVICES for s in held)
    assert [d for s in sorted(held, key=lambda s: int(s["metadata"]["name"].rsplit("-", 1)[1]))
            for d in s["spec"]["devices"]] == new
    if before == after:
        assert p.writes == 0


def counter_set(i: int, value: int = 7) -> dict[str, Any]:
    return {"name": f"gpu{i}-slices", "counters": {"compute-slices": {"value": str(value)}}}


def consumer(i: int, gpu: int) -> dict[str, Any]:
    d = device(i, shared=False)
    d["consumesCounters"] = [{"counterSet": f"gpu{gpu}-slices",
                              "counters": {"compute-slices": {"value": "1"}}}]
    return d


def test_shared_counters_sit_in_slices_of_their_own_first_in_the_pool() -> None:
    sets = [counter_set(g) for g in range(MAX_COUNTER_SETS + 1)]
    devices = [consumer(i, i % len(sets)) for i in range(3)]
    first = plan(NODE, devices, [], sets)
    slices = first.create
    assert [s["metadata"]["name"] for s in slices] == [slice_name(NODE, i) for i in range(3)]
    assert [len(s["spec"].get("sharedCounters", [])) for s in slices] == [MAX_COUNTER_SETS, 1, 0]
    assert all("devices" not in s["spec"] for s in slices[:2])
    assert "sharedCounters" not in slices[2]["spec"] and slices[2]["spec"]["devices"] == devices
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    held = apply(first, [])
    assert plan(NODE, devices, held, sets).writes == 0


def test_a_counter_that_changes_rewrites_the_pool_and_one_that_goes_deletes_its_slice() -> None:
    devices = [consumer(0, 0)]
    held = apply(plan(NODE, devices, [], [counter_set(0)]), [])
    changed = plan(NODE, devices, held, [counter_set(0, value=4)])
    assert changed.generation == 2 and changed.writes == 2 and not changed.delete
    assert changed.replace[0]["spec"]["sharedCounters"] == [counter_set(0, value=4)]
    gone = plan(NODE, [device(0)], held)  # the GPU no longer on demand
    assert [s["spec"]["devices"] for s in gone.replace] == [[device(0)]]
    assert gone.delete == [slice_name(NODE, 1)]


def test_consumed_counters_a_server_drops_are_reported_and_not_written_again() -> None:
    written = [consumer(0, 0)]
    read = [{k: v for k, v in written[0].items() if k != "consumesCounters"}]
    assert dropped(written, read) == ["consumesCounters"]
    assert as_kept(written, ["consumesCounters"]) == read
