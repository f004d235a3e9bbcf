"""The DRA publisher's decisions (pure, with the real planner of ``tessera.dra``): which
devices the node publishes from what NVML shows, what is withdrawn before a MIG change,
that republishing writes nothing (also where the API server drops fields), and what a
read-back reports."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.api.names import DRA_DRIVER
from tessera.dra.partitions import Bounds
from tessera.dra.slices import Plan, as_kept
from tessera.mig.catalog import profiles
from tessera.mig.planner import fit
from tessera.models import get_model
from tessera_node.cli import build_parser, options
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState, ProfileInfo
from tessera_node.dra.decide import (
    Pool,
    decide,
    loss_finding,
    lost_after,
    on_demand_finding,
    placements,
    still_published,
    wanted,
)
from tessera_node.dra.state import DraDevices

NODE = "gpu-node-1"
H100 = "H100-80GB"


def gpu(index: int, instances: tuple[str, ...] = (), peers: tuple[str, ...] = ()) -> GPUState:
    m = get_model(H100)
    table = {p.name: p for p in profiles(H100)}
    placed = fit(H100, list(instances)) if instances else []
    insts = tuple(MigInstanceState(table[p.profile].smi_profile_id, p.profile, p.start,
                                   p.size, 20 + k, f"MIG-{index}-{k}")
                  for k, p in enumerate(placed))
    infos = tuple(ProfileInfo(p.smi_profile_id, p.name, p.memory_mib, p.compute_slices,
                              p.max_count, p.sm_count) for p in profiles(H100))
    mig = "enabled" if instances else "disabled"
    return GPUState(index, f"GPU-{index}", m.nvml_name, m.pci_device_id, m.memory_mib << 20,
                    0, None, mig, None, insts, infos if instances else (),
                    nvlink_peers=peers)


def snapshot() -> DeviceSnapshot:
    """Two NVLinked H100s without MIG, one with seven 1g.10gb, one with two 3g.40gb."""
    return DeviceSnapshot((gpu(0, peers=("GPU-1",)), gpu(1, peers=("GPU-0",)),
                           gpu(2, ("1g.10gb",) * 7), gpu(3, ("3g.40gb",) * 2)))


SHARING: dict[str, Any] = {"GPU-3": "Shares"}  # GPU 2's partition: Whole (the default)


def names(devices: list[dict[str, Any]]) -> list[str]:
    return [d["name"] for d in devices]


def store(p: Plan, held: dict[str, dict[str, Any]], drop: bool = False) -> list[dict[str, Any]]:
    """What an API server holds after ``p`` (``drop``: one whose consumable-capacity gate
    is off); returns the stored objects of the writes, as their answers carry them."""
    out = []
    for obj in [*p.create, *p.replace]:
        kept = copy.deepcopy(obj)
        if drop:
            kept["spec"]["devices"] = as_kept(kept["spec"]["devices"], [
                "allowMultipleAllocations", "capacity cores requestPolicy",
                "capacity memory requestPolicy"])
        held[obj["metadata"]["name"]] = kept
        out.append(kept)
    for name in p.delete:
        held.pop(name)
    return out


def test_the_node_publishes_what_the_device_plugin_would_advertise() -> None:
    devices = wanted(snapshot(), True, {}, 10, SHARING)
    assert names(devices) == [
        "gpu0", "gpu1", *[f"gpu2-mig{s}-1g10gb" for s in range(7)],
        "gpu3-mig0-3g40gb", "gpu3-mig4-3g40gb"]
    by = {d["name"]: d for d in devices}
    # whole GPUs are shared; the Whole partition's instances exclusive; the Shares one's shared
    assert by["gpu0"]["allowMultipleAllocations"] is True
    assert "allowMultipleAllocations" not in by["gpu2-mig0-1g10gb"]
    assert by["gpu3-mig4-3g40gb"]["allowMultipleAllocations"] is True
    assert by["gpu0"]["attributes"]["nvlinkClique"] == {"int": 0}
    assert by["gpu2-mig3-1g10gb"]["attributes"]["uuid"] == {"string": "MIG-2-3"}


def test_withdrawn_units_and_an_unreadable_nvml_leave_the_slices() -> None:
    snap = snapshot()
    one = names(wanted(snap, True, {"GPU-2": {"MIG-2-0", "MIG-2-1"}}, 10, SHARING))
    assert "gpu2-mig0-1g10gb" not in one and "gpu2-mig1-1g10gb" not in one
    assert len(one) == 11 - 2
    whole = names(wanted(snap, True, {"GPU-2": {"GPU-2"}}, 10, SHARING))
    assert not any(n.startswith("gpu2-") for n in whole) and len(whole) == 4
    assert wanted(snap, False, {}, 10, SHARING) == []  # NVML unreadable: all withdrawn


def test_republishing_writes_nothing_and_a_change_writes_once() -> None:
    held: dict[str, dict[str, Any]] = {}
    devices = wanted(snapshot(), True, {}, 10, SHARING)
    first = decide(NODE, devices, [], [])
    assert (len(first.create), len(first.replace), first.generation) == (1, 0, 1)
    store(first, held)
    for _ in range(50):  # resyncs at idle
        assert decide(NODE, devices, held.values(), []).writes == 0
    fewer = wanted(snapshot(), True, {"GPU-2": {"MIG-2-0"}}, 10, SHARING)
    second = decide(NODE, fewer, held.values(), [])
    assert (second.writes, second.generation) == (1, 2)
    store(second, held)
    assert decide(NODE, fewer, held.values(), []).writes == 0


def test_slices_deleted_by_hand_are_written_again() -> None:
    held: dict[str, dict[str, Any]] = {}
    devices = wanted(snapshot(), True, {}, 10, SHARING)
    store(decide(NODE, devices, [], []), held)
    again = decide(NODE, devices, [], [])
    assert len(again.create) == 1 and again.create[0]["spec"]["devices"] == devices


def test_others_slices_are_not_ours_to_plan() -> None:
    devices = wanted(snapshot(), True, {}, 10, SHARING)
    other = decide("other-node", devices, [], []).create[0]
    foreign = copy.deepcopy(decide(NODE, devices, [], []).create[0])
    foreign["spec"]["driver"] = "gpu.nvidia.com"
    p = decide(NODE, devices, [other, foreign], [])
    assert len(p.create) == 1 and p.delete == []


def test_a_server_that_drops_fields_is_reported_and_not_rewritten_forever() -> None:
    held: dict[str, dict[str, Any]] = {}
    devices = wanted(snapshot(), True, {}, 10, SHARING)
    first = decide(NODE, devices, [], [])
    stored = store(first, held, drop=True)
    lost = lost_after([], first.create, stored)
    assert lost == ["allowMultipleAllocations", "capacity cores requestPolicy",
                    "capacity memory requestPolicy"]
    for _ in range(20):
        assert decide(NODE, devices, held.values(), lost).writes == 0
    # a change writes the whole devices again: what the server keeps is told anew
    fewer = wanted(snapshot(), True, {"GPU-2": {"MIG-2-0"}}, 10, SHARING)
    second = decide(NODE, fewer, held.values(), lost)
    assert second.writes == 1
    assert second.replace[0]["spec"]["devices"][0]["allowMultipleAllocations"] is True
    # the gate turned on meanwhile: the read-back keeps them and the loss is cleared
    assert lost_after(lost, second.replace, store(second, held)) == []
    finding = loss_finding(lost)
    assert finding is not None and finding.kind == "DRAFieldsDropped"
    assert "allowMultipleAllocations" in finding.message and DRA_DRIVER in finding.message
    assert loss_finding([]) is None


def test_a_write_without_shared_devices_proves_nothing_about_the_loss() -> None:
    devices = wanted(DeviceSnapshot((gpu(2, ("1g.10gb",) * 7),)), True, {}, 10, {})
    p = decide(NODE, devices, [], [])
    assert lost_after(["allowMultipleAllocations"], p.create, p.create) == [
        "allowMultipleAllocations"]


def test_a_withdrawal_waits_for_the_published_devices_only() -> None:
    held: dict[str, dict[str, Any]] = {}
    store(decide(NODE, wanted(snapshot(), True, {}, 10, SHARING), [], []), held)
    assert still_published(held.values(), "GPU-2", {"MIG-2-0"}) == ["gpu2-mig0-1g10gb"]
    assert len(still_published(held.values(), "GPU-2", {"GPU-2"})) == 7
    store(decide(NODE, wanted(snapshot(), True, {"GPU-2": {"GPU-2"}}, 10, SHARING),
                 held.values(), []), held)
    assert still_published(held.values(), "GPU-2", {"GPU-2", "MIG-2-0"}) == []


units = st.sampled_from([f"MIG-2-{k}" for k in range(7)] + ["MIG-3-0", "MIG-3-1", "GPU-0"])


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sets(units, max_size=4), st.booleans(), st.booleans()),
                      min_size=1, max_size=8))
def test_after_any_sequence_of_changes_a_resync_writes_nothing(
        steps: list[tuple[set[str], bool, bool]]) -> None:
    """Withdrawals, NVML going away, slices deleted by hand, a server that drops fields: after
    each write, planning again writes nothing, and the pool holds exactly the devices."""
    held: dict[str, dict[str, Any]] = {}
    lost: list[str] = []
    for gone, readable, wiped in steps:
        if wiped:
            held.clear()
        withdrawn = {u.rsplit("-", 1)[0].replace("MIG", "GPU") if u.startswith("MIG")
                     else u: {u} for u in gone}
        devices = wanted(snapshot(), readable, withdrawn, 10, SHARING)
        p = decide(NODE, devices, held.values(), lost)
        lost = lost_after(lost, [*p.create, *p.replace], store(p, held, drop=True))
        assert decide(NODE, devices, held.values(), lost).writes == 0
        published = [d["name"] for s in held.values() for d in s["spec"]["devices"]]
        assert published == names(devices)
        generations = {s["spec"]["pool"]["generation"] for s in held.values()}
        assert len(generations) == 1


def test_withdrawn_devices_stay_withdrawn_until_nvml_shows_the_change() -> None:
    now = [100.0]
    state = DraDevices(10, clock=lambda: now[0])
    assert state.devices() is None  # NVML not read yet: nothing decided
    state.update(snapshot(), 99.0, SHARING)
    state.withdraw("GPU-2", ["MIG-2-0"])
    assert "gpu2-mig0-1g10gb" not in names(state.devices() or [])
    # withdrawn from the slices, not from the node: a claim allocated on it before the
    # withdrawal is still prepared (the MIG change waits for it)
    assert "MIG-2-0" not in {u.uuid for g in state.gpus() or () for u in g.units or ()}
    assert "MIG-2-0" in {u.uuid for g in state.present() or () for u in g.units or ()}
    now[0] = 105.0
    state.changed("GPU-2")  # the enactor's commands are done
    state.update(snapshot(), 104.0, SHARING)  # read before that: still the old instance
    assert "gpu2-mig0-1g10gb" not in names(state.devices() or [])
    state.update(snapshot(), 106.0, SHARING)  # read after: what NVML shows is published
    assert "gpu2-mig0-1g10gb" in names(state.devices() or [])
    # a new withdrawal after changed() holds until its own change is done
    state.withdraw("GPU-2", ["MIG-2-1"])
    now[0] = 110.0
    state.changed("GPU-2")
    state.withdraw("GPU-2", ["MIG-2-2"])
    state.update(snapshot(), 111.0, SHARING)
    assert {"gpu2-mig1-1g10gb", "gpu2-mig2-1g10gb"}.isdisjoint(names(state.devices() or []))
    state.update(None, 112.0, SHARING)  # NVML unreadable: everything withdrawn
    assert state.devices() == []


def test_the_flag_is_off_by_default_and_never_beside_the_device_plugin(
        monkeypatch: pytest.MonkeyPatch) -> None:
    parser = build_parser()
    assert options(parser.parse_args(["run", "--node-name", "n"])).dra is False
    with pytest.raises(ValueError, match="cannot both be on"):
        options(parser.parse_args(["run", "--node-name", "n", "--dra", "true"]))
    on = options(parser.parse_args(["run", "--node-name", "n", "--dra", "true",
                                    "--device-plugin", "false"]))
    assert on.dra and not on.device_plugin
    monkeypatch.setenv("TESSERA_DRA", "true")
    monkeypatch.setenv("TESSERA_DEVICE_PLUGIN", "false")
    assert options(build_parser().parse_args(["run", "--node-name", "n"])).dra is True


def test_an_on_demand_gpu_publishes_its_placements_and_counters_never_its_instances() -> None:
    """GPU 1 in migMode OnDemand with one 3g.40gb (at 0): its free placements and its
    counter set are published once the API server keeps counters; its instance is not a
    device; GPU 0 is published as before either way."""
    snap = DeviceSnapshot((gpu(0), gpu(1, ("3g.40gb",))))
    state = DraDevices(10)
    state.update(snap, 1.0, {}, {"GPU-1": Bounds()})
    withheld = state.pool()
    assert withheld is not None and names(withheld.devices) == ["gpu0"]
    assert withheld.counter_sets == []
    assert state.set_partitionable(True) and not state.set_partitionable(True)
    pool = state.pool()
    assert pool is not None and [c["name"] for c in pool.counter_sets] == ["gpu1-slices"]
    placed = names(pool.devices)[1:]
    assert names(pool.devices)[0] == "gpu0" and "gpu1-mig0-3g40gb" not in placed
    assert {"gpu1-mig4-3g40gb", "gpu1-mig4-1g10gb", "gpu1-mig6-1g10gb"} <= set(placed)
    assert all(int(n.split("-mig")[1].split("-")[0]) >= 4 for n in placed), placed
    # the partition's bounds: one profile, two instances at most (one is there)
    state.update(snap, 2.0, {}, {"GPU-1": Bounds(("1g.10gb",), 2)})
    bounded = state.pool()
    assert bounded is not None
    assert names(bounded.devices)[1:] == [f"gpu1-mig{s}-1g10gb" for s in (4, 5, 6)]
    assert bounded.counter_sets[0]["counters"]["instances"] == {"value": "1"}
    # withdrawn, NVML unreadable, MIG not enabled yet: nothing of GPU 1
    assert names(placements(snap, True, {"GPU-1": {"GPU-1"}}, {"GPU-1": Bounds()}, True)
                 .devices) == []
    assert placements(snap, False, {}, {"GPU-1": Bounds()}, True) == Pool([])
    off = DeviceSnapshot((gpu(0), gpu(1)))
    assert placements(off, True, {}, {"GPU-1": Bounds()}, True) == Pool([])


def test_placements_publish_with_their_counters_first_and_republish_nothing() -> None:
    snap = DeviceSnapshot((gpu(0), gpu(1, ("3g.40gb",))))
    extra = placements(snap, True, {}, {"GPU-1": Bounds()}, True)
    devices = wanted(snap, True, {}, 10, {}, on_demand={"GPU-1"}) + extra.devices
    first = decide(NODE, devices, [], [], extra.counter_sets)
    assert "sharedCounters" in first.create[0]["spec"]
    held: dict[str, dict[str, Any]] = {}
    stored = store(first, held)
    assert lost_after([], first.create, stored) == []
    assert decide(NODE, devices, held.values(), [], extra.counter_sets).writes == 0
    # an API server without partitionable devices drops consumesCounters: reported
    bare = [{k: v for k, v in d.items() if k != "consumesCounters"} for d in devices]
    assert lost_after([], first.create, [{"spec": {"devices": bare}}]) == ["consumesCounters"]
    finding = loss_finding(["consumesCounters"])
    assert finding is not None and "DRAPartitionableDevices" in finding.message
    assert "DRAConsumableCapacity" not in finding.message


def test_on_demand_gpus_without_partitionable_devices_are_a_finding() -> None:
    f = on_demand_finding([3, 1], False)
    assert f is not None and f.kind == "DRAOnDemandUnavailable"
    assert f.message.startswith("GPU 1, 3 in migMode OnDemand publish no devices")
    assert on_demand_finding([1], True) is None and on_demand_finding([], False) is None


def test_a_partitions_keep_whole_leaves_its_last_empty_gpus_to_whole_gpu_placements() -> None:
    """keepWhole 1 on a node with two empty on-demand GPUs: both offer every placement;
    once one has an instance, the other (the last empty one) offers only the 7g.80gb,
    which takes the whole GPU; with 7g.80gb not allowed it offers nothing."""
    empty = [replace(gpu(i, ("1g.10gb",)), instances=()) for i in (0, 1)]
    keep = Bounds(keep_whole=1, partition="lab")
    on = {"GPU-0": keep, "GPU-1": keep}

    def of(snap: DeviceSnapshot, bounds: dict[str, Bounds], i: int) -> list[str]:
        return [n for n in names(placements(snap, True, {}, bounds, True).devices)
                if n.startswith(f"gpu{i}-")]
    both = DeviceSnapshot(tuple(empty))
    assert len(of(both, on, 0)) == len(of(both, on, 1)) == 25
    one_used = DeviceSnapshot((gpu(0, ("3g.40gb",)), empty[1]))
    assert of(one_used, on, 1) == ["gpu1-mig0-7g80gb"]
    assert len(of(one_used, on, 0)) > 1  # a GPU with instances is not kept
    small = Bounds(("1g.10gb",), keep_whole=1, partition="lab")
    assert of(one_used, {"GPU-0": small, "GPU-1": small}, 1) == []
    # another partition's empty GPU is not counted as this one's
    other = {"GPU-0": keep, "GPU-1": replace(keep, partition="other")}
    assert of(both, other, 0) == ["gpu0-mig0-7g80gb"]
