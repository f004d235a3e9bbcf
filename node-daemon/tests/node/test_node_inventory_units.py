"""The inventory's topology and ``units``: what the device plugin advertises on each GPU,
from the same decision (``devices.offers``), written only when it changes."""

from __future__ import annotations

import json
from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st
from test_node_logic import NOW, gpu, partition_obj

from tessera.api.inventory import AdvertisedUnit, parse_gpus
from tessera.api.names import ANNOTATION_GPUS, VGPU
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import advertised, offered_units, offers, units
from tessera_node.node.content import Advertising, node_content
from tessera_node.node.inventory import node_gpus
from tessera_node.node.patch import node_patch

PLUGIN = Advertising(10)
"""A device plugin with 10 shares per unit, nothing withdrawn."""


def content(node: dict[str, object], partitions: list[dict[str, object]],
            snap: DeviceSnapshot | None, advertising: Advertising | None = PLUGIN,
            ) -> tuple[dict[str, str], dict[str, object]]:
    w = node_content(node, partitions, snap, None if snap else "NVML: Unknown Error", (),
                     "/x", lambda p: None, NOW, advertising=advertising)
    written: dict[str, object] = {"metadata": {
        "name": "n", "resourceVersion": "2", "labels": w.labels, "annotations": w.annotations}}
    return w.annotations, written


def published(annotations: dict[str, str]) -> list[dict[str, object]]:
    out: list[dict[str, object]] = json.loads(annotations[ANNOTATION_GPUS])
    return out


def test_topology_is_published_and_unknown_stays_unknown() -> None:
    a = replace(gpu(0), pci_bus_id="00000000:17:00.0", numa_node=1, nvlink_peers=("GPU-1",))
    inv = node_gpus(DeviceSnapshot((a, gpu(1))))
    assert (inv.gpus[0].numa_node, inv.gpus[0].pci_bus_id, inv.gpus[0].nvlink_peers) == (
        1, "00000000:17:00.0", ("GPU-1",))
    assert (inv.gpus[1].numa_node, inv.gpus[1].pci_bus_id, inv.gpus[1].nvlink_peers) == (
        None, "", ())
    raw = published(content({"metadata": {"name": "n"}}, [], DeviceSnapshot((a,)))[0])
    assert {k: raw[0][k] for k in ("numaNode", "pciBusId", "nvlinkPeers")} == {
        "numaNode": 1, "pciBusId": "00000000:17:00.0", "nvlinkPeers": ["GPU-1"]}


def test_units_are_what_the_device_plugin_advertises() -> None:
    snap = DeviceSnapshot((gpu(0, mig="enabled", instances=("3g.40gb", "1g.10gb")), gpu(1),
                           gpu(2, mig="enabled", instances=("1g.10gb",))))
    whole = partition_obj("whole", "2026-01-01T00:00:00Z",
                          {"profiles": [{"name": "3g.40gb", "count": 1},
                                        {"name": "1g.10gb", "count": 1}]},
                          labels={})
    shared = {**partition_obj("shared", "2026-01-02T00:00:00Z",
                              {"profiles": [{"name": "1g.10gb", "count": 1}]})}
    shared["spec"] = {**shared["spec"], "sharing": "Shares",  # type: ignore[dict-item]
                      "nodeSelector": {}, "gpus": {"indices": [2]}}
    whole["spec"] = {**whole["spec"], "gpus": {"indices": [0]}}  # type: ignore[dict-item]
    annotations, _ = content({"metadata": {"name": "n"}}, [whole, shared], snap)
    gpus = parse_gpus(annotations[ANNOTATION_GPUS])
    got = {g.index: g.units for g in gpus}
    assert got[1] == (AdvertisedUnit(uuid="GPU-1", resource=VGPU, memory_mib=81559,
                                     shares=10),)
    starts = {i.uuid: i.start for i in snap.gpus[0].instances}
    assert [(u.resource, u.shares, u.profile, u.start) for u in got[0] or ()] == [
        ("tessera.dev/mig-3g.40gb", 0, "3g.40gb", starts["MIG-0-0"]),
        ("tessera.dev/mig-1g.10gb", 0, "1g.10gb", starts["MIG-0-1"])]
    assert all(u.memory_mib > 0 and u.healthy for u in got[0] or ())
    assert [(u.resource, u.shares, u.profile) for u in got[2] or ()] == [
        (VGPU, 10, "1g.10gb")]
    # the same decision as the plugin's device lists, unit for unit
    sharing = {"GPU-0": "Whole", "GPU-2": "Shares"}
    served = advertised(units(snap), 10, sharing)  # type: ignore[arg-type]
    for g in gpus:
        for u in g.units or ():
            devices = [d for d in served[u.resource] if d.unit == u.uuid]
            assert len(devices) == (u.shares or 1)


def test_withdrawn_units_and_no_device_plugin() -> None:
    snap = DeviceSnapshot((gpu(0, mig="enabled", instances=("3g.40gb", "1g.10gb")), gpu(1)))
    annotations, _ = content({"metadata": {"name": "n"}}, [], snap,
                             Advertising(4, {"GPU-0": {"MIG-0-0"}, "GPU-1": {"GPU-1"}}))
    got = {g.index: [u.uuid for u in g.units or ()]
           for g in parse_gpus(annotations[ANNOTATION_GPUS])}
    assert got == {0: ["MIG-0-1"], 1: []}
    annotations, _ = content({"metadata": {"name": "n"}}, [], snap, None)
    assert all(g.units == () for g in parse_gpus(annotations[ANNOTATION_GPUS]))


def test_unreadable_nvml_keeps_the_inventory_with_its_units_unhealthy() -> None:
    snap = DeviceSnapshot((replace(gpu(0), numa_node=0, pci_bus_id="00000000:17:00.0"),))
    _, written = content({"metadata": {"name": "n"}}, [], snap)
    down, after = content(written, [], None)
    before = parse_gpus(written["metadata"]["annotations"][ANNOTATION_GPUS])  # type: ignore[index]
    now = parse_gpus(down[ANNOTATION_GPUS])
    assert [g.model_copy(update={"units": None}) for g in now] == [
        g.model_copy(update={"units": None}) for g in before]
    assert [u.healthy for g in now for u in g.units or ()] == [False]
    again, rewritten = content(after, [], None)  # nothing to change while it stays down
    labels = rewritten["metadata"]["labels"]  # type: ignore[index]
    assert node_patch(after, labels, again) is None


@given(st.lists(st.sampled_from(["disabled", "1g.10gb", "3g.40gb", "7g.80gb"]), min_size=1,
                max_size=4), st.integers(1, 16), st.booleans())
def test_annotation_is_rewritten_only_when_it_changes(kinds: list[str], shares: int,
                                                      share_mig: bool) -> None:
    snap = DeviceSnapshot(tuple(
        replace(gpu(i, mig="enabled", instances=(k,)) if k != "disabled" else gpu(i),
                pci_bus_id=f"00000000:{0x17 + 16 * i:02X}:00.0", numa_node=i // 2,
                nvlink_peers=(f"GPU-{i ^ 1}",) if i ^ 1 < len(kinds) else ())
        for i, k in enumerate(kinds)))
    first, written = content({"metadata": {"name": "n"}}, [], snap, Advertising(shares))
    second = node_content(written, [], snap, None, (), "/x", lambda p: None, NOW,
                          advertising=Advertising(shares))
    meta = written["metadata"]
    assert node_patch(written, second.labels, second.annotations) is None, meta
    published_units = [u for g in parse_gpus(first[ANNOTATION_GPUS]) for u in g.units or ()]
    assert [u.uuid for u in published_units] == [
        o.unit.uuid for o in offers(offered_units(snap, {}), shares, {})]


def test_on_demand_gpus_are_marked_with_their_bounds_only_where_the_device_plugin_runs() -> None:
    """GPU 0 declared (one 3g.40gb), GPU 1 of a partition in migMode OnDemand: only GPU 1
    carries ``onDemand`` (its partition and bounds), every profile it may get is a resource
    (none free yet), and the device plugin's node alone marks it (a DRA node makes its
    instances for claims)."""
    snap = DeviceSnapshot((gpu(0, mig="enabled", instances=("3g.40gb",)),
                           gpu(1, mig="enabled")))
    declared = {**partition_obj("declared", "2026-01-01T00:00:00Z",
                                {"profiles": [{"name": "3g.40gb", "count": 1}]}),
                "spec": {"nodeSelector": {}, "gpus": {"indices": [0]},
                         "layout": {"profiles": [{"name": "3g.40gb", "count": 1}]}}}
    od = {**partition_obj("od", "2026-01-02T00:00:00Z", {}),
          "spec": {"nodeSelector": {}, "gpus": {"indices": [1]}, "layout": {
              "migMode": "OnDemand",
              "onDemand": {"profiles": ["1g.10gb", "7g.80gb"], "keepWhole": 1}}}}
    w = node_content({"metadata": {"name": "n"}}, [declared, od], snap, None, (), "/x",
                     lambda p: None, NOW, advertising=PLUGIN)
    raw = published(w.annotations)
    assert "onDemand" not in raw[0]
    assert raw[1]["onDemand"] == {"partition": "od", "profiles": ["1g.10gb", "7g.80gb"],
                                  "maxInstances": None, "keepWhole": 1}
    assert w.profiles == {"3g.40gb", "1g.10gb", "7g.80gb"}
    assert set(w.on_demand_targets) == {"GPU-1"}
    assert w.reports["od"].phase == "Ready" and w.reports["declared"].phase == "Ready"
    dra = node_content({"metadata": {"name": "n"}}, [declared, od], snap, None, (), "/x",
                       lambda p: None, NOW, advertising=None)
    assert all("onDemand" not in g for g in published(dra.annotations))
    assert dra.profiles == {"3g.40gb"} and set(dra.on_demand) == {"GPU-1"}
