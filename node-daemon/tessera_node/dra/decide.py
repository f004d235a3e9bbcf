"""The publisher's decisions (pure): the node's DRA devices from one NVML snapshot, what to
write given what the API server holds, what a write's read-back lost, and what is still
published of devices the MIG enactor withdrew.

The devices are the units the device plugin would advertise (one decision for both paths:
:func:`~tessera_node.deviceplugin.devices.offers`), less what the enactor withdrew, every
one unhealthy (so withdrawn) while NVML cannot be read.  An API server whose
consumable-capacity gate is off drops fields without an error: once it did, the node plans
against what it keeps (:func:`tessera.dra.slices.as_kept`) so it does not rewrite its pool
at every resync, and it still writes the whole devices whenever it writes anyway, so a
cluster whose gate was turned on is seen at the next change."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api.inventory import GPUInventory
from tessera.api.names import DRA_DRIVER
from tessera.dra.devices import node_devices, nvlink_cliques
from tessera.dra.partitions import Bounds, gpu_partitions, kept_whole
from tessera.dra.slices import Plan, as_kept, dropped, plan
from tessera.mig.catalog import UnknownProfileError
from tessera.mig.planner import LayoutError
from tessera.models import UnknownModelError
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Sharing, offered_units, offers
from tessera_node.node.findings import Finding
from tessera_node.node.inventory import node_gpus, with_units

Obj = dict[str, Any]


def offered(snapshot: DeviceSnapshot, readable: bool, withdrawn: Mapping[str, Collection[str]],
            shares_per_unit: int, sharing: Mapping[str, Sharing]) -> tuple[GPUInventory, ...]:
    """The node's GPUs with the units DRA offers now: its healthy units (every one unhealthy
    when NVML is not ``readable``: the snapshot is the last one read), less ``withdrawn``
    (GPU UUID -> unit UUIDs; the GPU's own UUID: all of it), shared or whole as the
    partitions say. The devices published are these units; the kubelet plugin maps a
    claim's devices back to them."""
    gpus = node_gpus(snapshot).gpus
    units = offers(offered_units(snapshot, withdrawn, readable), shares_per_unit, sharing)
    return with_units(gpus, units)


@dataclass(frozen=True)
class Pool:
    """What the node publishes: its devices and the counter sets some of them consume."""

    devices: list[Obj]
    counter_sets: list[Obj] = field(default_factory=list)


def wanted(snapshot: DeviceSnapshot, readable: bool, withdrawn: Mapping[str, Collection[str]],
           shares_per_unit: int, sharing: Mapping[str, Sharing],
           reserved: Mapping[str, tuple[int, int]] | None = None,
           on_demand: Collection[str] = ()) -> list[Obj]:
    """The node's DRA devices now (:func:`offered`, as ResourceSlice devices), each shared
    one with the capacity live resizes took (``reserved``) left out. A GPU in ``on_demand``
    (UUIDs) publishes no instance as a device: its placements are (:func:`placements`)."""
    gpus = offered(snapshot, readable, withdrawn, shares_per_unit, sharing)
    return node_devices([g.model_copy(update={"units": ()}) if g.uuid in on_demand else g
                         for g in gpus], reserved)


def placements(snapshot: DeviceSnapshot, readable: bool,
               withdrawn: Mapping[str, Collection[str]], on_demand: Mapping[str, Bounds],
               partitionable: bool) -> Pool:
    """The devices and counter sets of the GPUs in ``on_demand`` (GPU UUID -> its
    partition's bounds): with ``partitionable`` (the API server keeps shared counters), the
    placements each can still take beside its instances (:mod:`tessera.dra.partitions`),
    once MIG is enabled on it, NVML readable and nothing withdrawn from it; otherwise
    nothing at all, since a scheduler that ignores counters would allocate two overlapping
    placements."""
    pool = Pool([])
    if not partitionable or not readable or not on_demand:
        return pool
    gpus = node_gpus(snapshot).gpus
    cliques = nvlink_cliques(gpus)
    # a partition's keepWhole: its empty GPUs, while no more are empty than it keeps, offer
    # whole-GPU placements only (a burst the scheduler allocates before the slices change
    # may still take more than one of them; each claim's instance is made all the same)
    kept = kept_whole([(g.uuid, on_demand[g.uuid], not g.instances) for g in gpus
                       if g.uuid in on_demand and g.mig_mode == "enabled"])
    for g in sorted(gpus, key=lambda g: g.index):
        bounds = on_demand.get(g.uuid)
        if bounds is None or g.mig_mode != "enabled" or withdrawn.get(g.uuid):
            continue
        if g.uuid in kept:
            bounds = bounds.whole_only(g.model)
            if bounds is None:
                continue
        try:
            parts = gpu_partitions(g, g.instances, cliques, bounds)
        except (LayoutError, UnknownModelError, UnknownProfileError):
            continue  # an unknown model or a layout the planner rejects: nothing offered
        pool.devices.extend(parts.devices)
        pool.counter_sets.append(parts.counter_set)
    return pool


def on_demand_finding(gpus: Sequence[int], partitionable: bool) -> Finding | None:
    """The node's finding while GPUs in migMode OnDemand publish nothing for want of
    partitionable devices."""
    if not gpus or partitionable:
        return None
    which = ", ".join(str(i) for i in sorted(gpus))
    return Finding("DRAOnDemandUnavailable", f"GPU {which} in migMode OnDemand publish no "
                   "devices: the API server does not keep shared counters "
                   "(DRAPartitionableDevices, on by default from Kubernetes 1.36), without "
                   "which the scheduler could give two claims overlapping MIG instances")


def mine(node: str, slices: Iterable[Obj]) -> list[Obj]:
    """The slices of this driver on this node (the watch's field selector says so already;
    checked again: what the API server sends is input)."""
    return [s for s in slices if (s.get("spec") or {}).get("driver") == DRA_DRIVER
            and (s.get("spec") or {}).get("nodeName") == node]


def decide(node: str, devices: list[Obj], existing: Iterable[Obj], lost: Sequence[str],
           counter_sets: list[Obj] | None = None) -> Plan:
    """What to write: nothing when the published slices hold ``devices`` (and the
    ``counter_sets`` they consume) as this API server keeps them (``lost``: what it dropped
    before); otherwise the whole ``devices``, so that a write also tells again what the
    server keeps."""
    held = mine(node, existing)
    if not lost:
        return plan(node, devices, held, counter_sets)
    kept = plan(node, as_kept(devices, list(lost)), held, counter_sets)
    return kept if kept.writes == 0 else plan(node, devices, held, counter_sets)


def _devices(slices: Iterable[Obj]) -> list[Obj]:
    return [d for s in slices for d in (s.get("spec") or {}).get("devices") or []]


def _gated(devices: Iterable[Obj]) -> bool:
    """Do any of these devices carry a field a gate-off API server drops?"""
    return any(d.get("allowMultipleAllocations") or d.get("consumesCounters") or any(
        "requestPolicy" in c for c in (d.get("capacity") or {}).values()) for d in devices)


def lost_after(previous: Sequence[str], written: Iterable[Obj], stored: Iterable[Obj]
               ) -> list[str]:
    """What the API server drops, from the slices written and as it stored them: what this
    read-back lost when the written devices had such fields, else what was known before (a
    write without them proves nothing either way)."""
    sent = _devices(written)
    if not _gated(sent):
        return list(previous)
    return dropped(sent, _devices(stored))


def loss_finding(lost: Sequence[str]) -> Finding | None:
    """The node's finding (an Event once, the Node's findings annotation, the findings
    metric) while the API server drops fields of its slices."""
    if not lost:
        return None
    why = []
    if any(f != "consumesCounters" for f in lost):
        why.append("its consumable-capacity feature (DRAConsumableCapacity, off before "
                   "Kubernetes 1.36) is off, so each shared GPU or MIG instance goes whole "
                   "to one claim")
    if "consumesCounters" in lost:
        why.append("its partitionable-devices feature (DRAPartitionableDevices, off before "
                   "1.36) is off, so GPUs in migMode OnDemand publish nothing")
    return Finding("DRAFieldsDropped", f"the API server drops {', '.join(lost)} from this node's "
                   f"ResourceSlices (driver {DRA_DRIVER}): {'; '.join(why)}")


def still_published(slices: Iterable[Obj], gpu_uuid: str, devices: Collection[str]
                    ) -> list[str]:
    """Names of published devices among ``devices`` (unit UUIDs) of that GPU (its own UUID
    among them: every device of the GPU): what a withdrawal still waits for."""
    whole = gpu_uuid in devices
    out = []
    for d in _devices(slices):
        attrs = d.get("attributes") or {}
        uuid = (attrs.get("uuid") or {}).get("string")
        gpu = (attrs.get("gpuUUID") or {}).get("string")
        if uuid in devices or (whole and gpu == gpu_uuid):
            out.append(str(d.get("name")))
    return out
