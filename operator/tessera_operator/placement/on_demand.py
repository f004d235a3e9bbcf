"""MIG on demand on the device-plugin path: the leader asks node daemons for the instances
pending pods need (the rules: :mod:`tessera.placement.on_demand`).

A pod asking ``tessera.dev/mig-<profile>`` that the scheduler could not place (no node
advertises a free instance of it: ``PodScheduled=False``, ``Unschedulable``) waits in the
placement cache. Every round (on any change the cache sees, at least every ``interval_s``),
:func:`~tessera.placement.on_demand.plan` decides which instances to make where, and the
answer goes, per GPUPartition owning those GPUs, into its ``status.demand`` (one merge patch
of that field only; the partition controller writes the rest of the status). Each node
daemon makes what is asked of its GPUs and advertises it; the kubelet updates the Node's
allocatable, the scheduler tries the pod again, and the extender places it on the new
instance. An Event on the pod says which instance is being made for it, and where.

What this leader asked is read back from the partitions when it takes the Lease, so a new
leader keeps the last one's decisions.

A pod that waits for something else too (CPU, a volume, a node the scheduler ranks out)
would keep an instance made for it, free, for as long as it waits: once that instance has
been made and free for ``UNUSED_S`` while the pod still waits, it is released (the node
daemon destroys it after its grace), the pod is told (``MIGInstanceUnused``), and nothing
is asked for it for ``COOLDOWN_S``. A tenant's unschedulable pods cannot hold GPU slices.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import GPUPARTITIONS, GROUP, VERSION
from tessera.api.partition import MigDemand, demand_of
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.events import post_event
from tessera.placement.on_demand import PendingPod, WantedInstance, plan
from tessera.placement.policy import Policy, PolicyError, parse
from tessera.placement.units import Unit
from tessera_operator import metrics
from tessera_operator.placement.cache import NodeView, PodView
from tessera_operator.placement.eviction import COMPONENT
from tessera_operator.placement.service import PlacementService

log = logging.getLogger("tessera.placement")

REASON_ASKED = "MIGInstanceRequested"
REASON_UNUSED = "MIGInstanceUnused"
UNUSED_S = 120.0
"""An instance made for a pod that stays free this long while the pod still waits (it waits
for something else: CPU, a volume) is released, so that a pod that cannot start anyway does
not hold a slice of a GPU."""
COOLDOWN_S = 600.0
"""After that, nothing is asked for that pod for this long."""


def _wire(w: WantedInstance) -> dict[str, Any]:
    return MigDemand(node=w.node, gpu=w.gpu, gpu_index=w.gpu_index, profile=w.profile,
                     start=w.start, pod=w.pod, pod_uid=w.pod_uid).to_dict()


def read_demand(partitions: Sequence[Mapping[str, Any]]) -> list[WantedInstance]:
    """What the partitions' ``status.demand`` asks now."""
    return [WantedInstance(d.node, d.gpu, d.gpu_index, d.profile, d.start, d.pod, d.pod_uid,
                           name) for name, d in demand_of(partitions)]


def pending_pods(pods: Mapping[str, PodView], nodes: Mapping[str, NodeView],
                 default: Policy) -> list[PendingPod]:
    """The pods waiting for MIG instances, oldest first (a pod whose policy annotations do
    not read is left out: admission refuses those)."""
    out = []
    for v in sorted((v for v in pods.values() if v.waiting is not None),
                    key=lambda v: (v.waiting.created if v.waiting else "", v.key)):
        w = v.waiting
        assert w is not None
        try:
            policy = parse(w.annotations, default)
        except PolicyError:
            continue

        def may_run_on(node: str, spec: Mapping[str, Any] = w.spec) -> bool:
            view = nodes.get(node)
            return view is not None and view.admits(spec)
        out.append(PendingPod(v.key, v.uid, w.profiles, may_run_on, policy.allows))
    return out


@dataclass
class OnDemandAsker:
    """The leader's task: keeps ``status.demand`` of the on-demand partitions."""

    service: PlacementService
    kube: Kube
    interval_s: float = 2.0
    asked: dict[str, list[WantedInstance]] = field(default_factory=dict)
    """Per partition, what its ``status.demand`` says (as read at start, then written)."""
    clock: Callable[[], float] = time.monotonic
    free_since: dict[tuple[str, tuple[str, str, int]], float] = field(default_factory=dict)
    """(pod UID, placement) -> when the instance asked for it was first seen made and free
    while the pod still waited."""
    cooling: dict[str, float] = field(default_factory=dict)
    """Pod UID -> until when nothing is asked for it (it left an instance unused)."""
    unused: list[WantedInstance] = field(default_factory=list)
    """Asks released this round for want of use (their pods are told)."""

    async def run(self) -> None:
        listed = await self.kube.list(path(GROUP, VERSION, GPUPARTITIONS))
        items = listed.get("items") or []
        self.asked = {}
        for w in read_demand(items):
            self.asked.setdefault(w.partition, []).append(w)
        cache = self.service.cache
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(cache.changed.wait(), self.interval_s)
            cache.changed.clear()
            await self.round()
            await asyncio.sleep(0.05)  # a burst of watch events makes one round

    def _units(self) -> tuple[dict[str, list[Unit]], set[tuple[str, str, int]]]:
        """Per node, its free healthy whole MIG instances; and the (GPU, profile, start) of
        those pods hold or are reserved (records and reservations counted)."""
        free: dict[str, list[Unit]] = {}
        held: set[tuple[str, str, int]] = set()
        for name in self.service.cache.nodes:
            known = self.service.view_of(name)
            if known is None or known[0].error is not None:
                continue
            view, used, _ = known
            for u in view.units:
                if u.shared or not u.profile or u.start is None:
                    continue
                if used.get(u.uuid) is None or used[u.uuid].free:
                    if u.healthy:
                        free.setdefault(name, []).append(u)
                else:
                    held.add((u.gpu_uuid, u.profile, u.start))
        return free, held

    def decide(self) -> list[WantedInstance]:
        cache = self.service.cache
        gpus = [g for v in cache.nodes.values() for g in v.on_demand]
        previous = [w for ws in self.asked.values() for w in ws]
        if not gpus and not previous:
            return []
        # a pod the filter has reserved units for is being placed, though its last attempt
        # still says Unschedulable
        now = self.clock()
        self.cooling = {u: t for u, t in self.cooling.items() if t > now}
        waiting = {uid: v for uid, v in cache.pods.items()
                   if uid not in self.service.reservations and uid not in self.cooling}
        pending = pending_pods(waiting, cache.nodes, self.service.default)
        free, held = self._units()
        previous = self._release_unused(previous, free, set(waiting), now)
        # an instance asked for a pod that is bound but not started yet stays asked: the
        # kubelet has not allocated it, and the node's daemon may not see the binding yet
        starting = [w for w in previous if (v := cache.pods.get(w.pod_uid)) is not None
                    and v.node == w.node and v.phase == "Pending"]
        return starting + plan(pending, gpus, free, previous, held)

    def _release_unused(self, previous: list[WantedInstance], free: Mapping[str, list[Unit]],
                        waiting: set[str], now: float) -> list[WantedInstance]:
        """What was asked, less the instances made and free for ``UNUSED_S`` while their
        pod kept waiting: those pods cool down (``COOLDOWN_S``) and are told why."""
        ready = {(u.gpu_uuid, u.profile or "", u.start) for us in free.values() for u in us}
        seen: set[tuple[str, tuple[str, str, int]]] = set()
        kept = []
        for w in previous:
            key = (w.pod_uid, w.placement)
            if w.pod_uid in waiting and w.placement in ready:
                seen.add(key)
                since = self.free_since.setdefault(key, now)
                if now - since >= UNUSED_S:
                    self.cooling[w.pod_uid] = now + COOLDOWN_S
                    self.unused.append(w)
                    continue
            kept.append(w)
        self.free_since = {k: t for k, t in self.free_since.items() if k in seen}
        return [w for w in kept if w.pod_uid not in self.cooling]

    async def round(self) -> None:
        wanted = self.decide()
        unused, self.unused = self.unused, []
        for w in unused:
            await self._tell_unused(w)
        by_partition: dict[str, list[WantedInstance]] = {p: [] for p in self.asked}
        for w in wanted:
            by_partition.setdefault(w.partition, []).append(w)
        for name, ws in sorted(by_partition.items()):
            before = self.asked.get(name, [])
            if [_wire(w) for w in ws] == [_wire(w) for w in before]:
                continue
            try:
                await self.kube.merge_patch(
                    path(GROUP, VERSION, GPUPARTITIONS, name=name) + "/status",
                    {"status": {"demand": [_wire(w) for w in ws]}})
            except ApiError as exc:
                if exc.status == 404:  # the partition is gone: so is what it asked
                    self.asked.pop(name, None)
                    continue
                raise
            metrics.STATUS_WRITES.labels("gpupartition", "demand").inc()
            old = {(w.placement, w.pod_uid) for w in before}
            for w in ws:
                if (w.placement, w.pod_uid) not in old:
                    metrics.PLACEMENT_ON_DEMAND.inc()
                    await self._tell(w)
            if ws:
                self.asked[name] = ws
            else:
                self.asked.pop(name, None)

    async def _tell_unused(self, w: WantedInstance) -> None:
        ns, _, name = w.pod.partition("/")
        log.info("MIG instance made for a pod left unused; released", extra={
            "pod": w.pod, "node": w.node, "gpu": w.gpu_index, "profile": w.profile,
            "start": w.start})
        metrics.PLACEMENT_ON_DEMAND_UNUSED.inc()
        await post_event(self.kube, {"metadata": {"name": name, "namespace": ns,
                                                  "uid": w.pod_uid}},
                         "v1", "Pod", REASON_UNUSED,
                         f"the {w.profile} instance made for this pod on {w.node}, GPU "
                         f"{w.gpu_index}, slot {w.start} stayed unused for {UNUSED_S:.0f} s "
                         "while the pod waited for something else (see FailedScheduling): it "
                         "is released, and none is made for this pod for "
                         f"{COOLDOWN_S / 60:.0f} minutes", "Warning", COMPONENT)

    async def _tell(self, w: WantedInstance) -> None:
        ns, _, name = w.pod.partition("/")
        log.info("MIG instance asked for a pod", extra={
            "pod": w.pod, "node": w.node, "gpu": w.gpu_index, "profile": w.profile,
            "start": w.start, "partition": w.partition})
        await post_event(self.kube, {"metadata": {"name": name, "namespace": ns,
                                                  "uid": w.pod_uid}},
                         "v1", "Pod", REASON_ASKED,
                         f"no free {w.profile} instance can hold this pod: one is being made "
                         f"for it on {w.node}, GPU {w.gpu_index}, slot {w.start} "
                         f"(GPUPartition {w.partition}, migMode OnDemand)", "Normal", COMPONENT)
