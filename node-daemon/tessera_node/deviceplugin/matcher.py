"""Which pod is that? (pure)

``AllocateRequest`` carries only device IDs: nothing names the pod or container. Two steps
(docs/node-daemon.md, "Which pod is that?"):

1. At Allocate time, the *candidates*: containers of pods bound to this node, not
   terminating, still Pending, not started, asking for exactly this many of the resource,
   and not already matched. None: Allocate fails (nothing on this node asked for it). One or
   more: Allocate succeeds with the container's budget file *pending*.
2. Afterwards the kubelet's PodResources ``List`` (polled: there is no Watch) shows which
   pod and container hold exactly these device IDs; that *confirms* the pod, and the budget
   file is written from its annotation. The kubelet records devices only once Allocate has
   returned, so the confirmation never comes from inside Allocate.

Several pods admitted at once: each Allocate has its own device IDs, so each confirmation is
exact whatever order the kubelet admits them in; candidates only decide whether Allocate may
succeed. An app container handed an init container's devices again gets the same IDs: the
same budget file, set pending again, then confirmed for the app container.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.placement.record import PlacementRecord, PlacementRecordError, of_pod

ENDED = ("Succeeded", "Failed")
"""Pod phases after which no container of the pod runs again."""


@dataclass(frozen=True)
class PodView:
    """What the matcher needs of a Pod object."""

    uid: str
    namespace: str
    name: str
    node_name: str
    phase: str
    terminating: bool
    limits: Mapping[str, Mapping[str, int]]
    """Container name (init containers included) -> resource -> count."""
    started: frozenset[str]
    """Containers that have started (running or terminated) at least once."""
    annotations: Mapping[str, str]
    container_ids: Mapping[str, str] = field(default_factory=dict)
    """Container name -> the runtime's ID of it now (``containerd://`` stripped), for those
    that have one."""
    created: str = ""
    """``metadata.creationTimestamp`` (RFC 3339, so it sorts as time)."""
    init: frozenset[str] = frozenset()
    """Which of the containers are init containers."""
    placement: PlacementRecord | None = None
    """``tessera.dev/placement``: the units tessera's scheduler placed the containers on."""
    placement_error: str | None = None
    """Why the pod's placement record cannot be read (then no unit is its: fail closed)."""
    seen: int = 0
    """When the pod watch first showed the pod bound here (its event number: the kubelet
    hears of pods in the same order, and admits them in it)."""


def _count(value: Any) -> int | None:
    try:
        return int(str(value))
    except ValueError:
        return None


def pod_view(obj: Mapping[str, Any]) -> PodView:
    """A Pod (as the API serves it, JSON) to a PodView; limits that are not whole numbers
    are left out (extended resources are integers)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    limits: dict[str, dict[str, int]] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        lim = (c.get("resources") or {}).get("limits") or {}
        limits[c["name"]] = {k: n for k, v in lim.items() if (n := _count(v)) is not None}
    started = set()
    ids = {}
    for cs in [*(status.get("initContainerStatuses") or []),
               *(status.get("containerStatuses") or [])]:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state or cs.get("restartCount", 0) > 0:
            started.add(cs["name"])
        cid = str(cs.get("containerID") or "").partition("://")[2]
        if cid:
            ids[cs["name"]] = cid
    try:
        placement, placement_error = of_pod(obj), None
    except PlacementRecordError as exc:
        placement, placement_error = None, str(exc)
    return PodView(
        uid=meta.get("uid", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        node_name=spec.get("nodeName", ""),
        phase=status.get("phase", "Pending"),
        terminating=meta.get("deletionTimestamp") is not None,
        limits=limits,
        started=frozenset(started),
        annotations=dict(meta.get("annotations") or {}),
        container_ids=ids,
        created=str(meta.get("creationTimestamp") or ""),
        init=frozenset(c["name"] for c in spec.get("initContainers") or []),
        placement=placement,
        placement_error=placement_error,
    )


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    container: str


def candidates(
    pods: Iterable[PodView],
    node: str,
    resource: str,
    count: int,
    matched: frozenset[ContainerRef] = frozenset(),
) -> list[tuple[PodView, str]]:
    """Containers that could be the one an Allocate of ``count`` devices of ``resource`` is
    for, in the order the kubelet admits them (:func:`admission_order`)."""
    out = []
    for p in pods:
        if p.node_name != node or p.terminating or p.phase != "Pending":
            continue
        for name, lim in p.limits.items():
            if lim.get(resource) != count or name in p.started:
                continue
            if ContainerRef(p.namespace, p.name, name) in matched:
                continue
            out.append((p, name))
    return sorted(out, key=admission_order)


def admission_order(pc: tuple[PodView, str]) -> tuple[int, str, str, str, int]:
    """The kubelet admits pods in the order its pod watch shows them bound to its node (one
    pod per watch event; a batch, as after a restart, by creation time) and allocates their
    containers in the pod's order, init containers first. The daemon's watch of the same
    pods sees the same order (``PodView.seen``); names break the remaining ties."""
    p, c = pc
    return (p.seen, p.created, p.namespace, p.name, list(p.limits).index(c))


def allocation_key(resource: str, device_ids: Sequence[str]) -> str:
    """A stable name for one Allocate's device set (its budget file's directory)."""
    text = "\n".join([resource, *sorted(device_ids)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class Held:
    """One row of a PodResources answer: a container holding devices of one resource."""

    ref: ContainerRef
    resource: str
    device_ids: tuple[str, ...]
    asked_at: float = math.inf
    """When the kubelet was asked (wall clock, taken before the call). A row says nothing
    of an allocation made after that moment (:func:`confirm`); the default, no time, is a
    row known to be newer than every allocation (a listing built by hand)."""


def confirm(listing: Iterable[Held], made: Mapping[str, float]) -> dict[str, ContainerRef]:
    """Allocation keys the kubelet now shows held, and by which container. ``made``: each
    allocation key wanted, with when its Allocate was made (wall clock).

    A row asked before an allocation was made never confirms it: the kubelet hands an
    ended pod's device to the next pod, and the daemon may still keep the ended pod's
    answer (its phase not in the pod watch yet), which names the same device IDs, so the
    same key. Confirming the new allocation as the ended pod's would give the new container
    the old one's budget, and remove its files when the old pod is seen to end (the
    runtime then creates a directory where the budget file was). The kubelet forgets an
    inactive pod's devices before it hands them on (``UpdateAllocatedDevices``, before the
    plugin's Allocate), so an answer asked after the Allocate shows the new holder or none.

    When an init container and an app container hold the same IDs, the app container
    (listed later in the pod by the kubelet, and the one that runs now) wins: the last row
    wins."""
    out: dict[str, ContainerRef] = {}
    for h in listing:
        key = allocation_key(h.resource, h.device_ids)
        if key in made and h.asked_at >= made[key]:
            out[key] = h.ref
    return out
