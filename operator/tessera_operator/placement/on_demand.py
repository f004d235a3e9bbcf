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
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping, Sequence
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
        waiting = {uid: v for uid, v in cache.pods.items()
                   if uid not in self.service.reservations}
        pending = pending_pods(waiting, cache.nodes, self.service.default)
        free, held = self._units()
        # an instance asked for a pod that is bound but not started yet stays asked: the
        # kubelet has not allocated it, and the node's daemon may not see the binding yet
        starting = [w for w in previous if (v := cache.pods.get(w.pod_uid)) is not None
                    and v.node == w.node and v.phase == "Pending"]
        return starting + plan(pending, gpus, free, previous, held)

    async def round(self) -> None:
        wanted = self.decide()
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
