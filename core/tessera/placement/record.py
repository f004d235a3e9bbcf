"""The ``tessera.dev/placement`` pod annotation: the units each container of a pod uses.

Written by the operator's placement service in the pod's Binding (the API server copies a
Binding's annotations onto the pod in the same write that sets ``spec.nodeName``), read by
the placement service itself (rebuilding its state after a restart) and by the node
daemon's device plugin (``GetPreferredAllocation`` offers these units, ``Allocate`` refuses
any other)::

    {"version": 1, "node": "node-0",
     "containers": {"main": {"tessera.dev/vgpu": ["MIG-…", "GPU-…"]},
                    "init": {"tessera.dev/mig-1g.10gb": ["MIG-…"]}}}

Per container, per tessera resource, the unit UUIDs (GPU or MIG), as many as the
container's limit of that resource, all different.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import ANNOTATION_PLACEMENT, MIG_PREFIX, VGPU

VERSION = 1


class PlacementRecordError(ValueError):
    """The annotation is not a placement this version understands (message says why)."""


@dataclass(frozen=True)
class PlacementRecord:
    node: str
    containers: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    """container name -> resource -> unit UUIDs."""

    def units(self) -> frozenset[str]:
        """Every unit any container of the pod uses."""
        return frozenset(u for by_res in self.containers.values() for us in by_res.values()
                         for u in us)

    def of(self, container: str, resource: str) -> tuple[str, ...]:
        return tuple(self.containers.get(container, {}).get(resource, ()))


def dumps(record: PlacementRecord) -> str:
    return json.dumps(
        {"version": VERSION, "node": record.node,
         "containers": {c: {r: list(us) for r, us in sorted(by_res.items())}
                        for c, by_res in sorted(record.containers.items())}},
        separators=(",", ":"), sort_keys=True)


def loads(raw: str) -> PlacementRecord:
    try:
        data: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise PlacementRecordError(f"{ANNOTATION_PLACEMENT} is not JSON: {exc.msg}") from exc
    if not isinstance(data, dict):
        raise PlacementRecordError(f"{ANNOTATION_PLACEMENT} must be a JSON object")
    if data.get("version") != VERSION:
        raise PlacementRecordError(
            f"{ANNOTATION_PLACEMENT}: version {data.get('version')!r} is not {VERSION}")
    node = data.get("node")
    if not isinstance(node, str) or not node:
        raise PlacementRecordError(f"{ANNOTATION_PLACEMENT}: node must be a node name")
    raw_containers = data.get("containers")
    if not isinstance(raw_containers, dict):
        raise PlacementRecordError(f"{ANNOTATION_PLACEMENT}: containers must be an object")
    containers: dict[str, dict[str, tuple[str, ...]]] = {}
    for name, by_res in raw_containers.items():
        if not isinstance(by_res, dict):
            raise PlacementRecordError(
                f"{ANNOTATION_PLACEMENT}: container {name!r} must map resources to units")
        out: dict[str, tuple[str, ...]] = {}
        for res, units in by_res.items():
            if not (res == VGPU or res.startswith(MIG_PREFIX)):
                raise PlacementRecordError(
                    f"{ANNOTATION_PLACEMENT}: {res!r} is no tessera GPU resource")
            if (not isinstance(units, list) or not units
                    or not all(isinstance(u, str) and u for u in units)):
                raise PlacementRecordError(
                    f"{ANNOTATION_PLACEMENT}: {name}/{res} must list unit UUIDs")
            if len(set(units)) != len(units):
                raise PlacementRecordError(
                    f"{ANNOTATION_PLACEMENT}: {name}/{res} lists a unit twice")
            out[res] = tuple(units)
        containers[name] = out
    return PlacementRecord(node=node, containers=containers)


def of_pod(pod: Mapping[str, Any]) -> PlacementRecord | None:
    """The pod's record; None when it has none; PlacementRecordError when it cannot be read."""
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_PLACEMENT)
    if raw is None:
        return None
    return loads(raw)
