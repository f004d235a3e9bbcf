"""Every replica's view of what placement needs: the GPU nodes' units and the pods that
hold them.

Two watches: Nodes labelled ``tessera.dev/gpu.count`` (their inventory, hence their units,
and the daemon's ``tessera.dev/gpu-commitments``), and pods labelled
``tessera.dev/budgeted`` in every namespace (the webhook labels every GPU pod it admits).
A bound pod holds the units its ``tessera.dev/placement`` record names until it has ended
(``Succeeded``/``Failed``) or is gone; a terminating pod still holds them (its containers may
still run), as in the scheduler's own cache. A pod bound without a record (placed before
tessera's scheduler, or by another scheduler) is counted from its node's commitments (what
the daemon confirmed on each unit) beyond what records explain.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.inventory import NodeInventory, from_node
from tessera.api.names import (
    ANNOTATION_GPU_COMMITMENTS,
    LABEL_BUDGETED,
    LABEL_GPU_COUNT,
    MIG_PREFIX,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.dra.partitions import Bounds
from tessera.kube.client import Kube, Obj, path
from tessera.kube.health import Health
from tessera.placement.demand import DemandError, pod_demands
from tessera.placement.eligibility import eligible
from tessera.placement.on_demand import OnDemandGpu
from tessera.placement.record import PlacementRecordError, of_pod
from tessera.placement.units import NoUnitsError, Unit, node_units
from tessera.placement.usage import Placed

log = logging.getLogger("tessera.placement")

MIB = 1 << 20
ENDED = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodeView:
    """One GPU node as placement sees it."""

    name: str
    units: tuple[Unit, ...] = ()
    error: str | None = None
    """Why its units cannot be used (unreadable inventory, a daemon older than placement)."""
    committed_mib: Mapping[str, int] = field(default_factory=dict)
    """Per unit, the memory budgets the daemon confirmed there (``gpu-commitments``)."""
    committed_containers: Mapping[str, int] = field(default_factory=dict)
    allocatable: Mapping[str, int] = field(default_factory=dict)
    """The Node's allocatable of tessera's device resources (what the scheduler fits
    against)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
    unschedulable: bool = False
    on_demand: tuple[OnDemandGpu, ...] = ()
    """Its GPUs whose instances are made for pending pods (MIG on demand)."""

    def admits(self, pod_spec: Mapping[str, Any]) -> bool:
        """Whether the pod's selector, affinity and tolerations let it onto this node."""
        return eligible(pod_spec, self.name, self.labels, self.taints, self.unschedulable)


def on_demand_gpus(inv: NodeInventory) -> tuple[OnDemandGpu, ...]:
    return tuple(OnDemandGpu(
        node=inv.name, uuid=g.uuid, index=g.index, model=g.model,
        partition=g.on_demand.partition,
        bounds=Bounds(tuple(g.on_demand.profiles), g.on_demand.max_instances,
                      g.on_demand.keep_whole or 0, g.on_demand.partition),
        instances=tuple((i.profile, i.start) for i in g.instances))
        for g in inv.gpus if g.on_demand is not None and g.mig_mode == "enabled")


def node_view(node: Mapping[str, Any]) -> NodeView:
    inv = from_node(node)
    try:
        units = tuple(node_units(inv))
        error = None
    except NoUnitsError as exc:
        units, error = (), str(exc)
    mem: dict[str, int] = {}
    count: dict[str, int] = {}
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPU_COMMITMENTS)
    if raw:
        try:
            data = json.loads(raw)
            for uuid, c in (data.items() if isinstance(data, dict) else ()):
                if isinstance(c, dict):
                    mem[str(uuid)] = int(c.get("committed") or 0) // MIB
                    count[str(uuid)] = int(c.get("containers") or 0)
        except (ValueError, TypeError):
            log.warning("unreadable gpu-commitments; counting records only",
                        extra={"node": inv.name})
    alloc = ((node.get("status") or {}).get("allocatable") or {})
    spec = node.get("spec") or {}
    return NodeView(inv.name, units, error, mem, count,
                    {k: _int(v) for k, v in alloc.items() if is_device_resource(k)},
                    labels=inv.labels, taints=tuple(spec.get("taints") or ()),
                    unschedulable=bool(spec.get("unschedulable")),
                    on_demand=on_demand_gpus(inv) if error is None else ())


def is_device_resource(name: str) -> bool:
    return name in (VGPU, VGPU_MEMORY, VGPU_CORES) or name.startswith(MIG_PREFIX)


def _int(raw: Any) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return 0


def pod_requests(pod: Mapping[str, Any]) -> dict[str, int]:
    """The pod's requests of tessera's device resources as the scheduler counts them: the
    larger of its app containers' sum and each init container's."""
    spec = pod.get("spec") or {}

    def of(c: Mapping[str, Any]) -> dict[str, int]:
        res = c.get("resources") or {}
        merged = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        return {k: _int(v) for k, v in merged.items() if is_device_resource(k)}

    total: dict[str, int] = {}
    for c in spec.get("containers") or []:
        for k, v in of(c).items():
            total[k] = total.get(k, 0) + v
    for c in spec.get("initContainers") or []:
        for k, v in of(c).items():
            total[k] = max(total.get(k, 0), v)
    return total


@dataclass(frozen=True)
class PodView:
    key: str
    uid: str
    node: str
    priority: int
    placed: Placed | None
    """What it holds by its record; None when bound without one (or not bound)."""
    holds: bool
    """Bound and not ended: it holds GPU units (by record, or unrecorded; a record or budget
    that cannot be read counts as none: the daemon's commitments then stand for it)."""
    requests: Mapping[str, int] = field(default_factory=dict)
    waiting: Waiting | None = None
    """Set when the scheduler found no node for the pod and it asks whole MIG instances:
    what MIG on demand needs of it."""
    phase: str = ""


@dataclass(frozen=True)
class Waiting:
    """A pod the scheduler could not place that asks whole MIG instances."""

    created: str
    profiles: tuple[str, ...]
    """One profile per instance it asks (as the scheduler counts them)."""
    spec: Mapping[str, Any]
    """Its ``nodeSelector``, ``affinity`` and ``tolerations``."""
    annotations: Mapping[str, str]
    """Its placement policy annotations (and the rest)."""


def waiting(pod: Mapping[str, Any], requests: Mapping[str, int]) -> Waiting | None:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    if spec.get("nodeName") or meta.get("deletionTimestamp") or status.get("phase") in ENDED:
        return None
    if not any(c.get("type") == "PodScheduled" and c.get("status") == "False"
               and c.get("reason") == "Unschedulable" for c in status.get("conditions") or []):
        return None
    profiles = tuple(k[len(MIG_PREFIX):] for k, n in sorted(requests.items())
                     if k.startswith(MIG_PREFIX) for _ in range(n))
    if not profiles:
        return None
    return Waiting(str(meta.get("creationTimestamp") or ""), profiles,
                   {k: spec[k] for k in ("nodeSelector", "affinity", "tolerations")
                    if k in spec}, dict(meta.get("annotations") or {}))


def pod_view(pod: Mapping[str, Any]) -> PodView:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    key = f"{meta.get('namespace')}/{meta.get('name')}"
    uid = str(meta.get("uid", ""))
    node = str(spec.get("nodeName") or "")
    priority = int(spec.get("priority") or 0)
    phase = (pod.get("status") or {}).get("phase")
    holds = bool(node) and phase not in ENDED
    placed = None
    try:
        record = of_pod(pod)
        if record is not None:
            placed = Placed(key=key, uid=uid, priority=priority, node=record.node,
                            record=record, demands=tuple(pod_demands(pod)))
    except (PlacementRecordError, DemandError):
        placed = None
    requests = pod_requests(pod)
    return PodView(key, uid, node, priority, placed, holds, requests, waiting(pod, requests),
                   str(phase or ""))


@dataclass
class PlacementCache:
    kube: Kube
    health: Health | None = None
    nodes: dict[str, NodeView] = field(default_factory=dict)
    pods: dict[str, PodView] = field(default_factory=dict)
    """By pod UID."""
    by_node: dict[str, dict[str, PodView]] = field(default_factory=dict)
    """The pods holding units, by node and UID (what a decision on one node reads)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    _synced: set[str] = field(default_factory=set)

    versions: dict[str, int] = field(default_factory=dict)
    """Per node, bumped whenever what holds its units (or the node itself) changes: a
    decision's view of a node is computed once per version."""

    def bump(self, node: str) -> None:
        self.versions[node] = self.versions.get(node, 0) + 1

    def _put(self, view: PodView) -> None:
        self._drop(view.uid)
        self.pods[view.uid] = view
        if view.holds:
            self.by_node.setdefault(view.node, {})[view.uid] = view
            self.bump(view.node)

    deleted: dict[str, None] = field(default_factory=dict)
    """UIDs of pods the watch saw deleted (the last 10,000, oldest first): a reservation
    for one of them is dropped at once."""

    def _drop(self, uid: str, gone: bool = False) -> None:
        if gone:
            self.deleted[uid] = None
            if len(self.deleted) > 10_000:
                del self.deleted[next(iter(self.deleted))]
        old = self.pods.pop(uid, None)
        if old is not None and old.holds:
            self.bump(old.node)
            on = self.by_node.get(old.node)
            if on is not None:
                on.pop(uid, None)
                if not on:
                    del self.by_node[old.node]

    @property
    def synced(self) -> bool:
        return {"nodes", "pods"} <= self._synced

    async def watch_nodes(self) -> None:
        try:
            async for typ, obj in self.kube.watch(path("", "v1", "nodes"), LABEL_GPU_COUNT,
                                                  name="placement-nodes", health=self.health):
                if typ == "SYNC":
                    self.nodes = {v.name: v for v in map(node_view, obj.get("items") or [])}
                    for name in self.nodes:
                        self.bump(name)
                    self._synced.add("nodes")
                else:
                    name = str((obj.get("metadata") or {}).get("name"))
                    if typ == "DELETED":
                        self.nodes.pop(name, None)
                    else:
                        self.nodes[name] = node_view(obj)
                    self.bump(name)
                self.changed.set()
        finally:
            self._synced.discard("nodes")

    async def watch_pods(self) -> None:
        try:
            async for typ, obj in self.kube.watch(path("", "v1", "pods"), f"{LABEL_BUDGETED}=true",
                                                  name="placement-pods", health=self.health):
                if typ == "SYNC":
                    self.load_pods(obj)
                else:
                    if typ == "DELETED":
                        self._drop(str((obj.get("metadata") or {}).get("uid")), gone=True)
                    else:
                        self._put(pod_view(obj))
                self.changed.set()
        finally:
            self._synced.discard("pods")

    def load_pods(self, listed: Obj) -> None:
        """Every pod of a LIST (a watch's, or the new leader's consistent read)."""
        for name in self.by_node:
            self.bump(name)
        self.pods, self.by_node = {}, {}
        for v in map(pod_view, listed.get("items") or []):
            self._put(v)
        self._synced.add("pods")

    async def relist_pods(self) -> None:
        """A consistent read of every budgeted pod (not the watch cache): what a replica
        taking over the Lease must know before it places anything (the previous leader's
        last Bindings included)."""
        self.load_pods(await self.kube.list(path("", "v1", "pods"), f"{LABEL_BUDGETED}=true"))

    def holding(self, node: str) -> list[PodView]:
        return list(self.by_node.get(node, {}).values())
