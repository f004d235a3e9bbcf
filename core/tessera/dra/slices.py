"""A node's ResourceSlices for tessera's DRA driver (pure): its devices cut into slices of one
pool named after the node, what to write to get there from what the API server holds, and
what the API server dropped.

Acting only on a difference: the pool's generation moves, and slices are written, only when
the devices differ from what is published (compared by value: the API server may print a
quantity in another form), so a daemon that republishes every resync writes nothing at idle.
An API server whose consumable-capacity gate is off drops ``allowMultipleAllocations`` and
request policies without an error: :func:`dropped` says what a read-back lost.

Shared counters (partitionable devices, KEP-4815: a MIG GPU in on-demand mode,
:mod:`tessera.dra.partitions`) are published as resource.k8s.io/v1 wants them from 1.36:
in slices of their own, without devices, at most ``MAX_COUNTER_SETS`` sets each, in the
same pool and generation as the devices that consume them; those slices come first. An API
server whose ``DRAPartitionableDevices`` gate is off (1.34: alpha, off) drops
``sharedCounters`` and ``consumesCounters`` silently, which would let the scheduler allocate
two overlapping placements: :func:`dropped` reports that loss like the others."""

from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import DRA_DRIVER
from tessera.api.quantity import QuantityError, quantity_value

API_VERSION = "resource.k8s.io/v1"
KIND = "ResourceSlice"
MAX_DEVICES = 64
"""Devices per slice: 128 in resource.k8s.io/v1, 64 from 1.36 once a device has taints; the
lower bound keeps a slice valid when taints come."""
MAX_COUNTER_SETS = 8
"""Counter sets per slice (resource.k8s.io/v1, 1.36: a slice that holds them holds nothing
else)."""
MAX_NAME = 253


def slice_name(node: str, index: int) -> str:
    """``<node>-gpu.tessera.dev-<i>``; a node name too long for that gives way to its hash."""
    name = f"{node}-{DRA_DRIVER}-{index}"
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{node[:MAX_NAME - 40]}-{digest}-{index}"


def chunks(devices: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The devices cut into slices of at most MAX_DEVICES, in order; one empty slice for a
    node with none (the pool then says so rather than vanishing)."""
    return [devices[i:i + MAX_DEVICES] for i in range(0, len(devices), MAX_DEVICES)] or [[]]


@dataclass(frozen=True)
class Part:
    """What one slice holds: devices, or shared counter sets (never both)."""

    devices: list[dict[str, Any]] = field(default_factory=list)
    counters: list[dict[str, Any]] = field(default_factory=list)

    def content(self) -> dict[str, Any]:
        return {"sharedCounters": self.counters} if self.counters else {"devices": self.devices}


def parts(devices: list[dict[str, Any]],
          counter_sets: list[dict[str, Any]] | None = None) -> list[Part]:
    """The pool's slices in order: the counter sets, at most MAX_COUNTER_SETS a slice, then
    the devices (:func:`chunks`)."""
    sets = counter_sets or []
    return ([Part(counters=sets[i:i + MAX_COUNTER_SETS])
             for i in range(0, len(sets), MAX_COUNTER_SETS)]
            + [Part(devices=d) for d in chunks(devices)])


def resource_slice(node: str, index: int, part: Part, generation: int,
                   count: int) -> dict[str, Any]:
    """Slice ``index`` of ``count`` in the node's pool, holding ``part``."""
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": slice_name(node, index)},
            "spec": {"driver": DRA_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation,
                              "resourceSliceCount": count},
                     **part.content()}}


def _canonical(value: Any) -> Any:
    """``value`` with every quantity-looking string as its number, keys sorted: equal for
    two renderings of the same devices."""
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in sorted(value.items())}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    if isinstance(value, str):
        try:
            return str(quantity_value(value))
        except (QuantityError, ValueError, ArithmeticError):
            return value
    return value


def same_devices(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    return json.dumps(_canonical(a)) == json.dumps(_canonical(b))


@dataclass
class Plan:
    """What to write: slices to create and to replace (``replace``: full objects, the caller
    adds each one's resourceVersion), names to delete; nothing at all when published."""

    generation: int
    create: list[dict[str, Any]] = field(default_factory=list)
    replace: list[dict[str, Any]] = field(default_factory=list)
    delete: list[str] = field(default_factory=list)

    @property
    def writes(self) -> int:
        return len(self.create) + len(self.replace) + len(self.delete)


def _holds(spec: dict[str, Any], part: Part) -> bool:
    return (same_devices(spec.get("devices") or [], part.devices)
            and same_devices(spec.get("sharedCounters") or [], part.counters))


def _published(node: str, mine: dict[str, dict[str, Any]], pool: list[Part],
               generation: int) -> bool:
    """Do ``mine`` (by name) already publish ``pool`` at ``generation``?"""
    names = [slice_name(node, i) for i in range(len(pool))]
    want_pool = {"name": node, "generation": generation, "resourceSliceCount": len(pool)}
    return set(mine) == set(names) and all(
        mine[n]["spec"].get("pool") == want_pool and _holds(mine[n]["spec"], part)
        for n, part in zip(names, pool, strict=True))


def plan(node: str, devices: list[dict[str, Any]], existing: list[dict[str, Any]],
         counter_sets: list[dict[str, Any]] | None = None) -> Plan:
    """From ``existing`` (this driver's slices of this node, as listed) to ``devices`` and
    the ``counter_sets`` they consume from."""
    mine = {s["metadata"]["name"]: s for s in existing
            if s.get("spec", {}).get("driver") == DRA_DRIVER
            and s.get("spec", {}).get("nodeName") == node}
    generation = max((int(s["spec"].get("pool", {}).get("generation", 0))
                      for s in mine.values()), default=0)
    pool = parts(devices, counter_sets)
    if _published(node, mine, pool, generation):
        return Plan(generation)
    names = [slice_name(node, i) for i in range(len(pool))]
    generation += 1
    out = Plan(generation)
    for i, part in enumerate(pool):
        obj = resource_slice(node, i, part, generation, len(pool))
        (out.replace if obj["metadata"]["name"] in mine else out.create).append(obj)
    out.delete = sorted(set(mine) - set(names))
    return out


def dropped(written: list[dict[str, Any]], read: list[dict[str, Any]]) -> list[str]:
    """What the API server kept of written devices (by name) but without its fields: one
    line per kind of loss, e.g. consumable capacity on a cluster whose gate is off."""
    by_name = {d.get("name"): d for d in read}
    lost: set[str] = set()
    for d in written:
        got = by_name.get(d["name"])
        if got is None:
            lost.add("devices")
            continue
        if d.get("allowMultipleAllocations") and not got.get("allowMultipleAllocations"):
            lost.add("allowMultipleAllocations")
        if d.get("consumesCounters") and not got.get("consumesCounters"):
            lost.add("consumesCounters")
        for key, cap in (d.get("capacity") or {}).items():
            back = (got.get("capacity") or {}).get(key)
            if back is None:
                lost.add(f"capacity {key}")
            elif "requestPolicy" in cap and "requestPolicy" not in back:
                lost.add(f"capacity {key} requestPolicy")
    return sorted(lost)


def as_kept(devices: list[dict[str, Any]], lost: list[str]) -> list[dict[str, Any]]:
    """``devices`` without what :func:`dropped` found the API server drops, so that a node on
    such a cluster compares with what it can publish and does not rewrite its pool forever
    (it reports the loss instead)."""
    out = []
    for d in map(copy.deepcopy, devices):
        if "allowMultipleAllocations" in lost:
            d.pop("allowMultipleAllocations", None)
        if "consumesCounters" in lost:
            d.pop("consumesCounters", None)
        for key, cap in (d.get("capacity") or {}).items():
            if f"capacity {key} requestPolicy" in lost:
                cap.pop("requestPolicy", None)
        out.append(d)
    return out
