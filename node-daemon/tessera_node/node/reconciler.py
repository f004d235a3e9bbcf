"""The Node reconciler: the node daemon's loop, level-triggered.

Watches (list + watch, relisting on 410, every event handled alone) keep the own Node
(:mod:`.own_node`) and the GPUPartitions; a poll reads NVML every ``poll_interval_s`` in a
worker thread (NVML has no change notification for MIG layouts, and a MIG change made by
hand with nvidia-smi must show); every change wakes one reconcile pass, and a resync timer
wakes it anyway.  A pass computes what the Node should say (:mod:`.content`, pure), writes it
in one merge patch with the Node's resourceVersion as precondition when it differs, then
posts the Events for what changed.  Plans go to per-GPU workers
(:mod:`tessera_node.layout.queue`); the device plugin gets the GPUs and how the partitions
share them after every pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

from tessera.api.names import (
    ANNOTATION_GPU_COMMITMENTS,
    API_VERSION,
    GPUPARTITIONS,
    GROUP,
    NODE_DAEMON,
    VERSION,
)
from tessera.api.partition import KIND as PARTITION_KIND
from tessera.dra.partitions import Bounds
from tessera.kube.client import ApiError, Kube, Obj, follow, path
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera_node import metrics
from tessera_node.device.nvml import DeviceError, GPUReader
from tessera_node.device.sockets import device_plugin_sockets
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Sharing, units
from tessera_node.deviceplugin.service import DevicePlugin
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.enact import Enactor
from tessera_node.layout.holders import DeviceHolders
from tessera_node.layout.instances import DemandRunner
from tessera_node.layout.on_demand import asked_of
from tessera_node.layout.plan import Outcome
from tessera_node.layout.queue import PlanQueue
from tessera_node.node.content import Advertising, node_content
from tessera_node.node.findings import Finding
from tessera_node.node.inventory import node_gpus
from tessera_node.node.own_node import NODE_WATCH, OwnNode
from tessera_node.node.patch import node_patch
from tessera_node.node.reports import events as report_events
from tessera_node.settings import Options

log = logging.getLogger("tessera_node")

PARTITION_WATCH = "gpupartitions"
NVML = "nvml"
DEBOUNCE_S = 0.05


def reported_state(snapshot: DeviceSnapshot | None) -> Any:
    """What of a snapshot the Node shows (the inventory, pending modes, busy instances):
    only a change of this wakes the reconciler, not every byte of memory in use."""
    if snapshot is None:
        return None
    return (node_gpus(snapshot), tuple(units(snapshot)), tuple(
        (g.mig_pending, g.processes, tuple((i.gi_id, i.size, bool(i.memory_used_bytes),
                                            i.processes) for i in g.instances))
        for g in snapshot.gpus))


class Publishing(Protocol):
    """Another way the node's devices are offered, told after every pass (the DRA
    publisher, ``--dra``)."""

    def update(self, snapshot: DeviceSnapshot | None, read_at: float,
               sharing: Mapping[str, Sharing], on_demand: Mapping[str, Bounds]) -> None: ...

    def findings(self) -> list[Finding]: ...


class NodeReconciler:
    def __init__(self, kube: Kube, opts: Options, reader: GPUReader, enactor: Enactor,
                 health: Health, holders: DeviceHolders, own: OwnNode, changed: asyncio.Event,
                 plugin: DevicePlugin | None = None, dra: Publishing | None = None,
                 made_for: Callable[[], Mapping[str, str]] = lambda: {},
                 demand: DemandRunner | None = None) -> None:
        """``changed``: set by whatever changes what the Node should say (the own Node's
        watch, the device plugin's GPU commitments, and this reconciler's own inputs); each
        time it is set, one reconcile pass follows."""
        self.kube = kube
        self.plugin = plugin
        self.dra = dra
        self.made_for = made_for
        """MIG device UUID -> the claim it was made for (the DRA plugin's checkpoint)."""
        self.demand = demand
        """Makes the instances asked for pods (MIG on demand, device plugin) and destroys those
        of on-demand GPUs nothing holds (both paths)."""
        self._demand_task: asyncio.Task[None] | None = None
        self._demand_wake: asyncio.TimerHandle | None = None
        self.opts = opts
        self.reader = reader
        self.health = health
        self.own = own
        self.partitions: dict[str, Obj] = {}
        self.snapshot: DeviceSnapshot | None = None
        self.read_at = 0.0
        """When the read that gave ``snapshot`` began (monotonic)."""
        self.read_error: str | None = None
        self.sockets: tuple[str, ...] = ()
        self.device_holders = holders
        self.holders: Mapping[str, Sequence[str]] = {}
        """Device -> pods holding it, as last asked (``device_holders``)."""
        self.pods_error: str | None = None
        self._dirty = changed
        self.work = PlanQueue(enactor, self._work_done, opts.retry_interval_s)
        self._tasks: set[asyncio.Task[None]] = set()
        self._logged: set[str] = set()
        self._last_seen: tuple[Any, ...] | None = None

    # -- readiness ----------------------------------------------------------------------------

    def not_ready(self) -> list[str]:
        out = [f"{w}: not listed yet" for w in (NODE_WATCH, PARTITION_WATCH)
               if not self.health.synced(w)]
        if self.own.listed and self.own.obj is None:
            out.append(f"node {self.opts.node_name} does not exist")
        if self.read_error is not None:
            out.append(f"{NVML}: {self.read_error}")
        elif self.snapshot is None:
            out.append(f"{NVML}: not read yet")
        return out

    # -- watches ------------------------------------------------------------------------------

    async def watch_partitions(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.partitions = {o["metadata"]["name"]: o for o in obj.get("items") or []}
            elif typ == "DELETED":
                self.partitions.pop(obj["metadata"]["name"], None)
            else:
                self.partitions[obj["metadata"]["name"]] = obj
            self._dirty.set()
        await follow(self.kube.watch(path(GROUP, VERSION, GPUPARTITIONS),
                                     name=PARTITION_WATCH, health=self.health),
                     handle, PARTITION_WATCH)

    # -- devices ------------------------------------------------------------------------------

    async def poll_devices(self) -> None:
        while True:
            await self.read_devices()
            await asyncio.sleep(self.opts.poll_interval_s)

    def _work_done(self) -> None:
        """A GPU's worker finished: read the GPUs now (not at the next poll), then reconcile
        (with what the worker left, not the snapshot from before it)."""
        async def refresh() -> None:
            try:
                await self.read_devices()
            finally:
                self._dirty.set()
        task = asyncio.create_task(refresh())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _read_holders(self) -> None:
        try:
            self.holders, self.pods_error = self.device_holders.holders(), None
        except OSError as exc:  # fail closed: nothing is changed while pods are unknown
            if self.pods_error is None:
                log.error("cannot ask the kubelet which pods hold devices",
                          extra={"error": str(exc)})
            self.pods_error = f"kubelet PodResources: {exc}"
            metrics.ERRORS.labels("podresources").inc()

    async def read_devices(self) -> None:
        if self.work.enactor.refusal() is not None:
            await asyncio.to_thread(self.work.enactor.prepare)
        await asyncio.to_thread(self._read_holders)
        started = time.monotonic()
        try:
            snapshot = await asyncio.to_thread(self.reader.read)
        except DeviceError as exc:
            if self.read_error is None:
                log.error("cannot read the GPUs", extra={"error": str(exc)})
            self.snapshot, self.read_error = None, str(exc)
            self.health.failing(NVML, str(exc))
            metrics.ERRORS.labels(NVML).inc()
            metrics.NVML_UP.set(0)
            metrics.observe(DeviceSnapshot(()))
        else:
            if self.read_error is not None:
                log.info("GPUs readable again")
            self.snapshot, self.read_error, self.read_at = snapshot, None, started
            self.health.ok(NVML)
            metrics.NVML_UP.set(1)
            metrics.observe(snapshot)
        self.sockets = device_plugin_sockets(self.opts.device_plugin_dir)
        # wake the reconciler only for what a report or the inventory shows
        seen = (reported_state(self.snapshot), self.read_error, self.sockets,
                sorted((k, tuple(v)) for k, v in self.holders.items()), self.pods_error)
        if seen != self._last_seen:
            self._last_seen = seen
            self._dirty.set()

    # -- reconcile ----------------------------------------------------------------------------

    async def reconcile_loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.opts.resync_interval_s)
            await asyncio.sleep(DEBOUNCE_S)  # a burst of events makes one pass
            self._dirty.clear()
            try:
                await self.reconcile_once()
            except (ApiError, OSError, TimeoutError) as exc:
                metrics.ERRORS.labels("reconcile").inc()
                log.warning("reconcile failed; retrying", extra={"error": str(exc)[:300]})
                await asyncio.sleep(1.0)
                self._dirty.set()

    def _on_demand(self, targets: Mapping[str, GPUTarget]) -> None:
        """Make the instances the operator asks of this node for pods, destroy the idle ones
        (one batch at a time, in a thread; the GPUs are read again when it is done)."""
        if (self.demand is None or self.snapshot is None or self.read_error is not None
                or (self._demand_task is not None and not self._demand_task.done())):
            return
        work = self.demand.decide(self.snapshot, targets,
                                  asked_of(self.partitions.values(), self.opts.node_name))
        if self._demand_wake is not None:
            self._demand_wake.cancel()
        due = self.demand.due_in()  # a pass when an idle instance's grace ends
        self._demand_wake = (None if due is None else asyncio.get_running_loop().call_later(
            due + DEBOUNCE_S, self._dirty.set))
        if not work:
            return
        demand = self.demand

        async def run() -> None:
            try:
                await asyncio.to_thread(demand.run, work)
            finally:
                self._work_done()
        self._demand_task = asyncio.create_task(run())

    async def reconcile_once(self) -> None:
        node = self.own.obj
        if (node is None or not self.health.synced(PARTITION_WATCH)
                or (self.snapshot is None and self.read_error is None)):
            return  # nothing to write to, or not everything known yet
        refusal = self.work.enactor.refusal() or self.pods_error
        refused = Outcome("Pending", refusal) if refusal is not None else None
        advertising = (Advertising(self.opts.shares_per_unit,
                                   self.plugin.devices.withdrawn())
                       if self.plugin is not None else None)
        w = node_content(node, self.partitions.values(), self.snapshot, self.read_error,
                   self.sockets, self.opts.device_plugin_dir,
                   lambda p: refused or self.work.outcome(p), datetime.now(UTC),
                   self.holders, self.opts.allow_gpu_reset, advertising,
                   self.dra.findings() if self.dra is not None else (), self.made_for(),
                   self.demand.made_for if self.demand is not None else None)
        # beside another MIG manager the reports fail and nothing is touched
        if refused is None and not any(f.kind == "OtherMigManager" for f in w.findings):
            for p in w.plans:
                if p.steps:
                    self.work.submit(p)
        self.work.forget({p.index for p in w.plans if p.steps})
        for f in w.findings:
            if f.message not in self._logged:
                self._logged.add(f.message)
                log.warning("finding", extra={"kind": f.kind, "finding": f.message})
        if self.plugin is not None:
            self.plugin.update(self.snapshot if self.read_error is None else None,
                               w.sharing, w.profiles)
        if refused is None and not any(f.kind == "OtherMigManager" for f in w.findings):
            self._on_demand(w.on_demand_targets)
        # DRA: the publisher writes what this pass found (after the plans are queued: their
        # workers start at the next await, and withdraw from what it has then)
        if self.dra is not None:
            self.dra.update(self.snapshot if self.read_error is None else None, self.read_at,
                            w.sharing, w.on_demand)
        for kind in ("OtherDevicePlugin", "OtherMigManager", "ProfileMismatch", "UnknownModel",
                     "DRAFieldsDropped", "DRAOnDemandUnavailable"):
            metrics.FINDINGS.labels(kind).set(sum(f.kind == kind for f in w.findings))
        annotations = dict(w.annotations)
        if self.plugin is not None:  # not computed yet (just started): the Node's stays
            committed = self.plugin.committed or ((node.get("metadata") or {}).get(
                "annotations") or {}).get(ANNOTATION_GPU_COMMITMENTS)
            if committed is not None:
                annotations[ANNOTATION_GPU_COMMITMENTS] = committed
        patch = node_patch(node, w.labels, annotations)
        if patch is None:
            return
        metrics.API_WRITES.labels("node").inc()
        try:
            self.own.obj = await self.kube.merge_patch(
                path("", "v1", "nodes", name=self.opts.node_name), patch)
        except ApiError as exc:
            if exc.status == 409:  # the watch brings the newer Node; compute again then
                metrics.REPORT_WRITES.labels("conflict").inc()
                return
            metrics.REPORT_WRITES.labels("error").inc()
            raise
        metrics.REPORT_WRITES.labels("ok").inc()
        log.info("node updated", extra={"node": self.opts.node_name,
                                        "reports": {k: v.phase for k, v in w.reports.items()}})
        for e in report_events(self.opts.node_name, w.old_reports, w.reports):
            obj = self.partitions.get(e.partition)
            if obj is not None:
                metrics.API_WRITES.labels("event").inc()
                await post_event(self.kube, obj, API_VERSION, PARTITION_KIND, e.reason,
                                 e.message, e.type, NODE_DAEMON)
        for f in w.new_findings:
            metrics.API_WRITES.labels("event").inc()
            await post_event(self.kube, self.own.obj, "v1", "Node", f.kind, f.message,
                             "Warning", NODE_DAEMON)
