"""The node's ResourceSlices, kept published (``--dra``): the supervised tasks
``dra-slice-watch`` and ``dra-publish``, and the MIG enactor's ``Advertiser`` on the DRA path.

Why a watch and a resync both: the kubelet deletes every ResourceSlice of its node when it
starts (drivers register again after it), and someone may delete one by hand; a watch of
the node's slices (``fieldSelector spec.nodeName=<node>,spec.driver=gpu.tessera.dev``) sees
that at once and the next pass writes them again, where a resync alone would leave the node
without devices for up to ``--resync-interval``. The watch is also the publisher's view of
what is published, so a pass reads nothing from the API server; the resync (every
``--resync-interval``) plans once more anyway, in case an event was missed.

A pass (:func:`~tessera_node.dra.decide.decide`, pure) writes only on a difference by value,
so a daemon at idle writes nothing. What the API server stored is read back from each
write's answer: a server that dropped fields (its consumable-capacity gate off) is reported
as the node's finding ``DRAFieldsDropped`` (an Event on the Node, its findings annotation)
and in ``tessera_node_dra_fields_dropped``.

Before the MIG enactor destroys an instance, resets a GPU or switches its mode it calls
:meth:`SlicePublisher.withdraw` from its thread; that returns only once the slices without
those devices are written (a claim can no longer be given them), and raises
:class:`WithdrawError` when they cannot be within ``DRA_WITHDRAW_TIMEOUT_S``: nothing is
destroyed then."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from tessera.api.names import DRA_DRIVER
from tessera.dra.partitions import Bounds
from tessera.dra.slices import Plan
from tessera.kube.client import ApiError, Kube, Obj, follow, path
from tessera.kube.health import Health
from tessera_node import metrics
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Sharing
from tessera_node.dra.decide import (
    decide,
    loss_finding,
    lost_after,
    mine,
    on_demand_finding,
    still_published,
)
from tessera_node.dra.state import DraDevices
from tessera_node.node.findings import Finding
from tessera_node.settings import DRA_RETRY_S, DRA_WITHDRAW_TIMEOUT_S

log = logging.getLogger("tessera_node.dra")

SLICE_WATCH = "dra-slices"
SLICES = path("resource.k8s.io", "v1", "resourceslices")
DEBOUNCE_S = 0.05
PARTITIONABLE_FROM = 36
"""The first Kubernetes minor whose API server keeps shared counters by default
(``DRAPartitionableDevices`` beta); a later read-back that lost them says otherwise."""


def server_minor(version: Obj) -> int | None:
    """The minor of a ``/version`` answer (``"37"``, ``"37+"``); None when unreadable."""
    digits = re.match(r"\d+", str(version.get("minor", "")))
    return int(digits.group()) if digits else None


def _older(event: Obj, held: Obj | None) -> bool:
    """Is a watch event older than what a write's answer already put in the view? (Two
    writes in a row: the first one's event comes after the second's answer.) Compared as
    numbers where both are, as etcd's are; otherwise the event wins."""
    if held is None:
        return False
    a = str(event["metadata"].get("resourceVersion", ""))
    b = str(held["metadata"].get("resourceVersion", ""))
    return a.isdigit() and b.isdigit() and int(a) < int(b)


class WithdrawError(OSError):
    """The slices without the devices could not be written: the MIG change must not go on
    (an OSError: the enactor fails the change and tries it again later)."""


class SlicePublisher:
    def __init__(self, kube: Kube, node: str, health: Health, state: DraDevices,
                 resync_s: float, on_finding: Callable[[], None] = lambda: None) -> None:
        """``on_finding``: what the node should report changed (the loss of fields)."""
        self.kube = kube
        self.node = node
        self.health = health
        self.state = state
        self.resync_s = resync_s
        self.on_finding = on_finding
        self.selector = f"spec.nodeName={node},spec.driver={DRA_DRIVER}"
        self.slices: dict[str, Obj] = {}
        """This node's slices of the driver, by name: the watch's, and each write's answer."""
        self.lost: list[str] = []
        """What the API server drops from our slices, as last read back."""
        self.minor: int | None = None
        """The API server's Kubernetes minor, once read."""
        self._dirty = asyncio.Event()
        self._lock = asyncio.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None

    # -- the reconciler's side -----------------------------------------------------------------

    def update(self, snapshot: DeviceSnapshot | None, read_at: float,
               sharing: Mapping[str, Sharing],
               on_demand: Mapping[str, Bounds] | None = None) -> None:
        """After every reconcile pass: the GPUs as NVML showed them (None: unreadable) in the
        read begun at ``read_at`` (monotonic), how the partitions share them, and which are
        on demand."""
        self.state.update(snapshot, read_at, sharing, on_demand)
        self._dirty.set()

    def findings(self) -> list[Finding]:
        gpus, partitionable = self.state.on_demand_gpus()
        found = (loss_finding(self.lost), on_demand_finding(gpus, partitionable))
        return [f for f in found if f is not None]

    def _partitionable(self) -> None:
        """Tell the devices whether shared counters are kept: a server from 1.36 whose
        read-back did not lose them."""
        kept = (self.minor is not None and self.minor >= PARTITIONABLE_FROM
                and "consumesCounters" not in self.lost)
        if self.state.set_partitionable(kept):
            log.info("GPUs in migMode OnDemand " + ("published" if kept else "withheld"),
                     extra={"node": self.node, "minor": self.minor, "dropped": self.lost})
            self._dirty.set()
            self.on_finding()

    async def _read_version(self) -> None:
        try:
            self.minor = server_minor(await self.kube.request("GET", "/version"))
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("cannot read the API server's version; GPUs in migMode OnDemand "
                        "stay unpublished until it is read", extra={"error": str(exc)[:300]})
        self._partitionable()

    def not_ready(self) -> list[str]:
        return [] if self.health.synced(SLICE_WATCH) else [f"{SLICE_WATCH}: not listed yet"]

    # -- the tasks -----------------------------------------------------------------------------

    async def watch(self) -> None:
        self._loop = asyncio.get_running_loop()

        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.slices = {o["metadata"]["name"]: o for o in obj.get("items") or []}
            elif typ == "DELETED":
                self.slices.pop(obj["metadata"]["name"], None)
            elif not _older(obj, self.slices.get(obj["metadata"]["name"])):
                self.slices[obj["metadata"]["name"]] = obj
            self._dirty.set()  # one of ours gone or changed by someone: plan again
        await follow(self.kube.watch(SLICES, field_selector=self.selector, name=SLICE_WATCH,
                                     health=self.health), handle, SLICE_WATCH)

    async def run(self) -> None:
        self._loop = asyncio.get_running_loop()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._dirty.wait(), self.resync_s)
            await asyncio.sleep(DEBOUNCE_S)  # a burst of changes makes one pass
            self._dirty.clear()
            if self.minor is None:
                await self._read_version()
            try:
                await self.publish()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("publishing ResourceSlices failed; retrying",
                            extra={"error": str(exc)[:300]})
                await asyncio.sleep(DRA_RETRY_S)
                self._dirty.set()

    # -- one pass ------------------------------------------------------------------------------

    async def publish(self) -> Plan | None:
        """Write what differs; None when nothing can be decided yet (the slices not listed,
        NVML not read). Raises ApiError/OSError when a write fails."""
        async with self._lock:
            pool = self.state.pool()
            if pool is None or not self.health.synced(SLICE_WATCH):
                return None
            held = mine(self.node, self.slices.values())
            p = decide(self.node, pool.devices, held, self.lost, pool.counter_sets)
            if p.writes == 0:
                metrics.DRA_PASSES.labels("unchanged").inc()
                metrics.DRA_DEVICES.set(sum(len(s["spec"].get("devices") or []) for s in held))
                return p
            try:
                stored = await self._write(p)
            except (ApiError, OSError, TimeoutError):
                metrics.DRA_PASSES.labels("error").inc()
                raise
            metrics.DRA_PASSES.labels("written").inc()
            metrics.DRA_DEVICES.set(len(pool.devices))
            lost = lost_after(self.lost, [*p.create, *p.replace], stored)
            names = [d["name"] for o in [*p.create, *p.replace]
                     for d in o["spec"].get("devices") or []]
            log.info("ResourceSlices written", extra={
                "node": self.node, "generation": p.generation, "creates": len(p.create),
                "updates": len(p.replace), "deletes": len(p.delete), "devices": names,
                "resourceVersions": [s["metadata"].get("resourceVersion") for s in stored]})
            self._set_lost(lost)
            self._partitionable()
            return p

    async def _write(self, p: Plan) -> list[Obj]:
        """Create, replace (with the resourceVersion seen), then delete; the stored objects.
        A conflict (the view was behind) lists again before it raises: the next pass plans
        from what is there."""
        stored: list[Obj] = []
        try:
            for obj in p.create:
                stored.append(await self._send("create", self.kube.create(SLICES, obj)))
            for obj in p.replace:
                name = obj["metadata"]["name"]
                seen = self.slices.get(name)
                if seen is None:  # deleted while this pass wrote: plan again
                    raise ApiError(409, "deleted meanwhile", f"PUT {SLICES}/{name}")
                obj["metadata"]["resourceVersion"] = seen["metadata"]["resourceVersion"]
                stored.append(await self._send("update", self.kube.replace(
                    f"{SLICES}/{name}", obj)))
            for name in p.delete:
                await self._send("delete", self.kube.delete(f"{SLICES}/{name}"))
                self.slices.pop(name, None)
        except ApiError as exc:
            if exc.status in (404, 409):
                await self._relist()
            raise
        return stored

    async def _send(self, op: str, call: Any) -> Obj:
        metrics.API_WRITES.labels("resourceslice").inc()
        try:
            out: Obj = await call
        except (ApiError, OSError, TimeoutError):
            metrics.DRA_SLICE_WRITES.labels(op, "error").inc()
            raise
        metrics.DRA_SLICE_WRITES.labels(op, "ok").inc()
        if op != "delete":
            self.slices[out["metadata"]["name"]] = out
        return out

    async def _relist(self) -> None:
        listed = await self.kube.request("GET", SLICES, params={"fieldSelector": self.selector})
        self.slices = {o["metadata"]["name"]: o for o in listed.get("items") or []}

    def _set_lost(self, lost: list[str]) -> None:
        if lost == self.lost:
            return
        if lost:
            log.warning("the API server drops fields of this node's ResourceSlices",
                        extra={"node": self.node, "dropped": lost})
        else:
            log.info("the API server keeps every field of this node's ResourceSlices")
        self.lost = lost
        metrics.DRA_FIELDS_DROPPED.clear()
        for field in lost:
            metrics.DRA_FIELDS_DROPPED.labels(field).set(1)
        self.on_finding()

    # -- the MIG enactor's Advertiser (a GPU's worker thread) ---------------------------------

    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        """Returns once the node's slices no longer publish ``devices`` of that GPU."""
        self.state.withdraw(gpu_uuid, devices)
        if self._loop is None:
            raise WithdrawError("the ResourceSlice publisher has not started")
        fut = asyncio.run_coroutine_threadsafe(self._withdrawn(gpu_uuid, devices), self._loop)
        try:
            fut.result(DRA_WITHDRAW_TIMEOUT_S)
        except Exception as exc:  # timeout, or the loop going away: fail closed
            fut.cancel()
            raise WithdrawError(f"could not withdraw {', '.join(devices)} from the node's "
                                f"ResourceSlices within {DRA_WITHDRAW_TIMEOUT_S:.0f}s: "
                                f"{type(exc).__name__} {exc}") from exc
        log.info("devices withdrawn from the ResourceSlices",
                 extra={"gpu": gpu_uuid, "devices": list(devices)})

    async def _withdrawn(self, gpu_uuid: str, devices: Collection[str]) -> None:
        while True:
            try:
                await self.publish()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("withdrawing devices: write failed; retrying",
                            extra={"error": str(exc)[:300]})
            else:
                if self.health.synced(SLICE_WATCH) and not still_published(
                        mine(self.node, self.slices.values()), gpu_uuid, devices):
                    return
            await asyncio.sleep(DRA_RETRY_S)

    # -- live resizes (the kubelet plugin's resizer, on the loop) ------------------------------

    def refresh(self) -> None:
        """What the node offers changed (a reservation dropped): publish soon (any thread)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._dirty.set)

    async def settled(self) -> None:
        """Returns once the API server holds the node's devices as they are now (a pass has
        nothing left to write); raises :class:`WithdrawError` when it cannot within
        ``DRA_WITHDRAW_TIMEOUT_S``."""
        async def until_written() -> None:
            while True:
                try:
                    p = await self.publish()
                except (ApiError, OSError, TimeoutError) as exc:
                    log.warning("publishing a reservation: write failed; retrying",
                                extra={"error": str(exc)[:300]})
                else:
                    if p is not None and p.writes == 0:
                        return
                    if p is not None:
                        continue  # written: the next pass confirms what the server kept
                await asyncio.sleep(DRA_RETRY_S)
        try:
            await asyncio.wait_for(until_written(), DRA_WITHDRAW_TIMEOUT_S)
        except TimeoutError as exc:
            raise WithdrawError(f"the node's ResourceSlices could not be written within "
                                f"{DRA_WITHDRAW_TIMEOUT_S:.0f}s") from exc

    def changed(self, gpu_uuid: str) -> None:
        self.state.changed(gpu_uuid)
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._dirty.set)
