"""A node's ResourceSlices for tessera's DRA driver (pure): its devices cut into slices of one
pool named after the node, what to write to get there from what the API server holds, and
what the API server dropped.

Acting only on a difference: the pool's generation moves, and slices are written, only when
the devices differ from what is published (compared by value: the API server may print a
quantity in another form), so a daemon that republishes every resync writes nothing at idle.
An API server whose consumable-capacity gate is off drops ``allowMultipleAllocations`` and
request policies without an error: :func:`dropped` says what a read-back lost."""

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


def resource_slice(node: str, index: int, devices: list[dict[str, Any]], generation: int,
                   count: int) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": KIND,
            "metadata": {"name": slice_name(node, index)},
            "spec": {"driver": DRA_DRIVER, "nodeName": node,
                     "pool": {"name": node, "generation": generation,
                              "resourceSliceCount": count},
                     "devices": devices}}


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


def _published(node: str, mine: dict[str, dict[str, Any]], parts: list[list[dict[str, Any]]],
               generation: int) -> bool:
    """Do ``mine`` (by name) already publish ``parts`` as one pool at ``generation``?"""
    names = [slice_name(node, i) for i in range(len(parts))]
    want_pool = {"name": node, "generation": generation, "resourceSliceCount": len(parts)}
    return set(mine) == set(names) and all(
        mine[n]["spec"].get("pool") == want_pool
        and same_devices(mine[n]["spec"].get("devices") or [], part)
        for n, part in zip(names, parts, strict=True))


def plan(node: str, devices: list[dict[str, Any]], existing: list[dict[str, Any]]) -> Plan:
    """From ``existing`` (this driver's slices of this node, as listed) to ``devices``."""
    mine = {s["metadata"]["name"]: s for s in existing
            if s.get("spec", {}).get("driver") == DRA_DRIVER
            and s.get("spec", {}).get("nodeName") == node}
    generation = max((int(s["spec"].get("pool", {}).get("generation", 0))
                      for s in mine.values()), default=0)
    parts = chunks(devices)
    if _published(node, mine, parts, generation):
        return Plan(generation)
    names = [slice_name(node, i) for i in range(len(parts))]
    generation += 1
    out = Plan(generation)
    for i, part in enumerate(parts):
        obj = resource_slice(node, i, part, generation, len(parts))
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
        for key, cap in (d.get("capacity") or {}).items():
            if f"capacity {key} requestPolicy" in lost:
                cap.pop("requestPolicy", None)
        out.append(d)
    return out
