"""The device plugin inside tessera-node (I/O): the plugin servers, the node's pods, the
PodResources polls, the Node's vgpu capacity and the Events on refused pods.

The daemon hands it the GPUs as NVML shows them and the sharing its GPUPartitions ask for
(``update``, after every reconcile pass); ``run`` (a supervised task) installs libtessera,
serves and registers one plugin per resource, re-registers when the kubelet restarts,
confirms allocations through the kubelet's PodResources API and removes what ended pods
leave. It is also the daemon's ``Advertiser`` (the MIG enactor withdraws devices before it
destroys them) and its ``PodResources`` (which pods hold which devices).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from tessera.api.names import (
    MIG_PREFIX,
    NODE_DAEMON,
    PREFIX,
    REASON_RESIZE_REFUSED,
    REASON_RESIZED,
    VGPU,
)
from tessera.kube.client import ApiError, Kube, Obj, follow, path
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera_node import metrics
from tessera_node.budget.writer import BudgetWriter
from tessera_node.containers import ContainerRegistry
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin import library
from tessera_node.deviceplugin.devices import (
    DEFAULT_MAX_PODS,
    PluginDevice,
    Sharing,
    Unit,
    capacity_patch,
    unit_of,
    units,
    vgpu_capacity,
)
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.manager import ENDED, Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import ContainerRef, Held, PodView, confirm, pod_view
from tessera_node.deviceplugin.pacing import Backoff, Pacer, PodState, to_ask
from tessera_node.deviceplugin.podresources import KubeletBusy, PodResourcesClient
from tessera_node.deviceplugin.resize import awaiting, resized_message
from tessera_node.deviceplugin.response import ContainerResponse, SimPaths
from tessera_node.deviceplugin.server import AllocateError, PluginServer
from tessera_node.settings import (
    ALLOCATE_WAIT_S,
    CONTAINERS_DIR,
    FORGET_PENDING_S,
    LIB_DIR,
    PODRESOURCES_BACKOFF_S,
    PODRESOURCES_BURST,
    PODRESOURCES_QPS,
    Options,
)

log = logging.getLogger("tessera_node.deviceplugin")

POD_WATCH = "pods"
REFUSED_REASON = "GPUBudgetRefused"
UNCONFIRMED = "(a container allocated, its pod not confirmed yet)"


@dataclass
class _Devices:
    snapshot: DeviceSnapshot | None = None
    readable: bool = False
    sharing: Mapping[str, Sharing] = field(default_factory=dict)
    profiles: frozenset[str] = frozenset()


class _Resource:
    """One resource as its plugin server sees it; Allocate waits a little for the pod watch."""

    def __init__(self, service: DevicePluginService, name: str) -> None:
        self.service = service
        self.name = name

    def devices(self) -> list[PluginDevice]:
        return self.service.require_manager().resource(self.name).devices()

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int
                  ) -> list[str]:
        with self.service.gate.answering(then_allocate=True):
            return self.service.require_manager().resource(self.name).preferred(
                available, must_include, size)

    def allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        with self.service.gate.answering(then_allocate=False):
            return self._allocate(device_ids)

    def _allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        started = time.monotonic()
        deadline = started + ALLOCATE_WAIT_S
        while True:
            seen = self.service.pods_version
            try:
                resp = self.service.require_manager().allocate(self.name, device_ids)
            except AllocateError as exc:
                if time.monotonic() >= deadline or "pending pod" not in str(exc):
                    metrics.ALLOCATIONS.labels(self.name, "refused").inc()
                    log.warning("Allocate refused", extra={"resource": self.name,
                                                           "devices": list(device_ids),
                                                           "error": str(exc)})
                    raise
                self.service.wait_pods(seen, deadline - time.monotonic())
                continue
            seconds = time.monotonic() - started
            metrics.ALLOCATIONS.labels(self.name, "ok").inc()
            metrics.ALLOCATE_SECONDS.labels(self.name).observe(seconds)
            log.info("Allocate", extra={"resource": self.name, "devices": list(device_ids),
                                        "seconds": round(seconds, 4)})
            return resp


class DevicePluginService:
    def __init__(self, kube: Kube, opts: Options, health: Health,
                 node: Callable[[], Obj | None],
                 registry: ContainerRegistry | None = None,
                 on_commitments: Callable[[], None] = lambda: None) -> None:
        self.kube = kube
        self.on_commitments = on_commitments
        self.committed: str | None = None
        """``tessera.dev/gpu-commitments`` as last computed (the daemon writes it on the
        Node; ``on_commitments`` is called when it changes)."""
        self.opts = opts
        self.health = health
        self.node = node
        self.registry = registry or ContainerRegistry()
        self.gate = AllocationGate()
        self.podres = PodResourcesClient(opts.pod_resources_socket, gate=self.gate,
                                         pacer=Pacer(PODRESOURCES_QPS, PODRESOURCES_BURST))
        self.backoff = Backoff(*PODRESOURCES_BACKOFF_S)
        self._answers: dict[tuple[str, str], tuple[str, float, list[Held]]] = {}
        """(namespace, pod) -> (its UID, when the kubelet was asked, what it said)."""
        self._answers_lock = threading.Lock()
        self.manager: Manager | None = None
        self.servers: dict[str, PluginServer] = {}
        self.unregistered: dict[str, str] = {}
        self.pod_objs: dict[tuple[str, str], Obj] = {}
        self._views: tuple[PodView, ...] = ()
        self._pods_cond = threading.Condition()
        self.pods_version = 0
        self._devices = _Devices()
        self._withdrawn: dict[str, set[str]] = {}
        self._state_lock = threading.Lock()
        self._wake = asyncio.Event()
        self._refused: list[tuple[PodView, str, str]] = []
        self.error: str | None = "not started yet"

    # -- the daemon's inputs ----------------------------------------------------------------

    def update(self, snapshot: DeviceSnapshot | None, sharing: Mapping[str, Sharing],
               profiles: frozenset[str]) -> None:
        """What NVML shows (None: NVML unreadable, every unit unhealthy) and how the node's
        partitions share their GPUs (GPU UUID -> Whole/Shares), their profiles."""
        with self._state_lock:
            d = self._devices
            if snapshot is not None:
                d.snapshot, d.readable = snapshot, True
            else:
                d.readable = False
            d.sharing, d.profiles = dict(sharing), profiles
        self._publish()
        self._wake.set()

    def node_state(self) -> NodeState:
        with self._state_lock:
            d = self._devices
            gone = {x for devs in self._withdrawn.values() for x in devs}
            if d.snapshot is None:
                return NodeState(sharing=d.sharing, profiles=d.profiles)
            all_units = [u for u in units(d.snapshot)
                         if u.uuid not in gone and u.gpu_uuid not in self._withdrawn_gpus()]
            if not d.readable:
                all_units = [_unhealthy(u) for u in all_units]
            return NodeState(units=all_units, sharing=d.sharing, profiles=d.profiles)

    def unit_indexes(self) -> dict[str, int]:
        """The units the plugin hands out now (GPU or MIG UUID) -> their GPU's NVML index."""
        manager = self.manager
        return {} if manager is None else {u.uuid: u.gpu_index for u in manager.state.units}

    def _withdrawn_gpus(self) -> set[str]:
        return {g for g, devs in self._withdrawn.items() if g in devs}

    def _publish(self) -> None:
        """Give the manager the node's units and every plugin its device list (blocking,
        any thread)."""
        if self.manager is None:
            return
        self.manager.update(self.node_state())
        for server in list(self.servers.values()):
            server.refresh()

    # -- Advertiser (called by the MIG enactor, in a GPU's worker thread) ------------------

    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        with self._state_lock:
            self._withdrawn.setdefault(gpu_uuid, set()).update(devices)
        self._publish()
        log.info("devices withdrawn", extra={"gpu": gpu_uuid, "devices": list(devices)})

    def changed(self, gpu_uuid: str) -> None:
        with self._state_lock:
            self._withdrawn.pop(gpu_uuid, None)
        self._publish()  # the daemon reads NVML next and calls update() with the new layout

    # -- PodResources (which pods hold which devices; any thread) --------------------------

    def holders(self) -> Mapping[str, Sequence[str]]:
        """Unit -> pods holding it, as the kubelet last said for each pod that has not ended
        (a confirmed pod's devices stay its own until it ends: no call needed), and units of
        allocations not confirmed yet (their pod may not be in the watch yet, or not asked
        yet)."""
        if not self.health.synced(POD_WATCH):
            raise OSError("the node's pods are not listed yet: which pods hold devices is "
                          "unknown")
        out: dict[str, list[str]] = {}
        for h in self._known(self._asking()):
            if not h.resource.startswith(PREFIX):
                continue
            for d in h.device_ids:
                out.setdefault(unit_of(d), []).append(f"{h.ref.namespace}/{h.ref.pod}")
        if self.manager is not None:
            for unit in self.manager.unconfirmed_units():
                out.setdefault(unit, []).append(UNCONFIRMED)
        return out

    def _asking(self) -> dict[tuple[str, str], PodView]:
        """The pods on this node that ask for a device of tessera's and have not ended."""
        return {(p.namespace, p.name): p for p in self.pods()
                if p.phase not in ENDED and any(_device(r) for lim in p.limits.values()
                                                for r in lim)}

    def _known(self, asking: Mapping[tuple[str, str], PodView]) -> list[Held]:
        """What the kubelet last said those pods hold, oldest answer first (so that, where a
        device moved from one pod to another, the newer answer wins)."""
        with self._answers_lock:
            got = [(at, rows) for key, (uid, at, rows) in self._answers.items()
                   if key in asking and asking[key].uid == uid]
        return [h for _, rows in sorted(got, key=lambda a: a[0]) for h in rows]

    def _ask(self, manager: Manager) -> list[Held]:
        """Ask the kubelet about the pods whose answer can change something now (``pacing``:
        pending allocations' pods, oldest first, until every pending allocation is found;
        pods with a refused container every poll), at the daemon's pace; then what is known
        of every pod that has not ended. Raises OSError when the kubelet cannot be asked."""
        if not self.health.synced(POD_WATCH):
            raise OSError("the node's pods are not listed yet: which pods hold devices is "
                          "unknown")
        asking = self._asking()
        now = time.monotonic()
        with self._answers_lock:
            self._answers = {k: a for k, a in self._answers.items()
                             if k in asking and asking[k].uid == a[0]}
            asked = {k: a[1] for k, a in self._answers.items()}
        confirmed, refused = manager.confirmed()
        pending = manager.pending_keys()
        states = []
        for key, p in asking.items():
            mine = [ContainerRef(p.namespace, p.name, c) for c, lim in p.limits.items()
                    if any(_device(r) for r in lim)
                    and not (c in p.init and c in p.started)]  # an init container that ran
            states.append(PodState(key, p.created, any(r not in confirmed for r in mine),
                                   any(r in refused for r in mine)))
        order = to_ask(states, bool(pending), asked, now, self.opts.confirm_interval_s,
                       self.opts.poll_interval_s)
        if order and not self.backoff.quiet(now):
            def enough(got: Mapping[tuple[str, str], list[Held]]) -> bool:
                known = [h for rows in got.values() for h in rows] + self._known(asking)
                return pending <= set(confirm(known, pending))

            try:
                got = self.podres.answers(order, enough)
                self.backoff.answered()
            except KubeletBusy as exc:
                got = exc.args[1]
                wait = self.backoff.refused(time.monotonic())
                log.warning("the kubelet's PodResources refused a call (its rate limit): "
                            "quiet for a while", extra={"seconds": wait, "error": str(exc)})
            except grpc.RpcError as exc:
                raise OSError(f"kubelet PodResources at {self.opts.pod_resources_socket}: "
                              f"{exc.code().name}") from None
            at = time.monotonic()
            with self._answers_lock:
                for key, rows in got.items():
                    self._answers[key] = (asking[key].uid, at, rows)
        return self._known(asking)

    # -- pods bound to this node ------------------------------------------------------------

    async def watch_pods(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.pod_objs = {_key(o): o for o in obj.get("items") or []}
            elif typ == "DELETED":
                self.pod_objs.pop(_key(obj), None)
            else:
                self.pod_objs[_key(obj)] = obj
            views = []
            for o in self.pod_objs.values():
                try:
                    views.append(pod_view(o))
                except (KeyError, TypeError, ValueError) as exc:  # one odd pod, not all
                    log.warning("pod not understood", extra={"pod": "/".join(_key(o)),
                                                             "error": str(exc)})
            with self._pods_cond:
                self._views = tuple(views)
                self.pods_version += 1
                self._pods_cond.notify_all()
            self.registry.identify({(v.uid, name): cid for v in views
                                    for name, cid in v.container_ids.items()})
            self._wake.set()
        await follow(self.kube.watch(path("", "v1", "pods"),
                                     field_selector=f"spec.nodeName={self.opts.node_name}",
                                     name=POD_WATCH, health=self.health), handle, POD_WATCH)

    def pods(self) -> tuple[PodView, ...]:
        return self._views

    def wait_pods(self, seen: int, timeout: float) -> None:
        with self._pods_cond:
            self._pods_cond.wait_for(lambda: self.pods_version != seen, max(timeout, 0))

    # -- readiness ------------------------------------------------------------------------

    def not_ready(self) -> list[str]:
        out = []
        if not self.health.synced(POD_WATCH):
            out.append(f"{POD_WATCH}: not listed yet")
        if self.error is not None:
            out.append(f"device plugin: {self.error}")
        elif not self.gpus_read():
            out.append("device plugin: the GPUs not read yet")
        out += [f"device plugin {r}: not registered: {why}"
                for r, why in sorted(self.unregistered.items())]
        return out

    # -- the task ---------------------------------------------------------------------------

    def require_manager(self) -> Manager:
        if self.manager is None:
            raise AllocateError("the device plugin is not ready")
        return self.manager

    async def run(self) -> None:
        if self.manager is None:
            await asyncio.to_thread(self._prepare)
        self.error = None
        try:
            while True:
                try:
                    await self.step()
                except (ApiError, OSError, ValueError) as exc:
                    # the plugins keep serving: stopping them would make the kubelet count
                    # every device unhealthy and refuse the pods it is admitting
                    metrics.ERRORS.labels("device-plugin").inc()
                    log.exception("device plugin step failed", extra={"error": str(exc)})
                manager = self.require_manager()
                interval = (self.opts.confirm_interval_s if manager.pending()
                            else self.opts.poll_interval_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), interval)
                self._wake.clear()
        finally:
            for server in self.servers.values():
                await asyncio.to_thread(server.stop)
            self.servers = {}

    def _prepare(self) -> None:
        state = Path(self.opts.state_dir)
        try:
            lib_dir = library.install(self.opts.libtessera, state / LIB_DIR)
        except OSError as exc:
            self.error = str(exc)
            raise
        sim = None
        if self.opts.device_visibility == "sim":
            node = Path(self.opts.sim_node)
            sim = SimPaths(str(Path(self.opts.driver_root) / "lib"), str(node),
                           str(node) + ".state")
        config = PluginConfig(
            node=self.opts.node_name, shares_per_unit=self.opts.shares_per_unit,
            lib_dir=str(lib_dir), visibility=self.opts.device_visibility,  # type: ignore[arg-type]
            policy=self.opts.share_policy, sim=sim,  # type: ignore[arg-type]
            forget_after_s=FORGET_PENDING_S,
        )
        writer = BudgetWriter(state / CONTAINERS_DIR, int(self.opts.budget_wait_s * 1000))
        writer.empty_trash()
        self.manager = Manager(config, writer, self.pods, self._on_refused, self.registry)
        self.manager.update(self.node_state())
        log.info("device plugin prepared", extra={"libtessera": str(lib_dir),
                                                   "visibility": config.visibility})

    def _on_refused(self, pod: PodView, container: str, why: str) -> None:
        self._refused.append((pod, container, why))

    def gpus_read(self) -> bool:
        """Whether NVML has been read once since the daemon started."""
        with self._state_lock:
            return self._devices.snapshot is not None

    async def step(self) -> None:
        manager = self.require_manager()
        if not self.gpus_read():
            # Before NVML's first read no unit is known: confirming the allocations of
            # running containers now (after a restart or an upgrade) would refuse their
            # budgets for an unknown memory, and the node's capacity would read 0.
            return
        await asyncio.to_thread(self._serve, manager)
        await self._resolve(manager)
        await self._resize(manager)
        await self._write_capacity(manager)
        committed = await asyncio.to_thread(manager.commitments)
        if committed != self.committed:
            self.committed = committed
            self.on_commitments()

    def _serve(self, manager: Manager) -> None:
        """A plugin per advertised resource, registered; served again and re-registered
        when the kubelet restarted."""
        self._publish()
        for name in manager.advertised():
            server = self.servers.get(name)
            try:
                if server is None:
                    server = PluginServer(_Resource(self, name), self.opts.device_plugin_dir)
                    self.servers[name] = server
                    server.start()
                elif name in self.unregistered or server.kubelet_restarted():
                    log.info("serving and registering again", extra={"resource": name})
                    server.stop_serving()
                    server.start()
                else:
                    continue
            except grpc.RpcError as exc:
                why = f"kubelet registration: {exc.code().name}"
                if self.unregistered.get(name) != why:
                    log.warning("cannot register with the kubelet",
                                extra={"resource": name, "error": why})
                self.unregistered[name] = why
                metrics.ERRORS.labels("device-plugin").inc()
                continue
            self.unregistered.pop(name, None)

    async def _resolve(self, manager: Manager) -> None:
        if not self.health.synced(POD_WATCH):
            return  # a pod not known yet would count as ended
        if not self.gpus_read():
            return  # see step(): refusing now would take running containers' budgets away
        try:
            listing = await asyncio.to_thread(self._ask, manager)
        except OSError as exc:
            metrics.ERRORS.labels("podresources").inc()
            log.warning("cannot confirm allocations", extra={"error": str(exc)})
            return
        await asyncio.to_thread(manager.resolve, listing)
        refused, self._refused = self._refused, []
        for pod, container, why in refused:
            obj = self.pod_objs.get((pod.namespace, pod.name))
            if obj is None:
                continue
            metrics.API_WRITES.labels("event").inc()
            await post_event(self.kube, obj, "v1", "Pod", REFUSED_REASON,
                             f"container {container}: no GPU memory: {why}", "Warning",
                             NODE_DAEMON)

    async def _resize(self, manager: Manager) -> None:
        """Approved live resizes of this node's pods: decided, applied, and the outcome on
        the pod (conditional on the pod's resourceVersion: a pod that changed meanwhile is
        decided again at the next step, from what it says then)."""
        if not self.health.synced(POD_WATCH):
            return
        for key, obj in list(self.pod_objs.items()):
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            if awaiting(ann) is None:
                continue
            try:
                view = pod_view(obj)
            except (KeyError, TypeError, ValueError):
                continue
            outcome = await asyncio.to_thread(manager.resize, view)
            if outcome is None:
                continue
            meta = obj["metadata"]
            metrics.API_WRITES.labels("pod").inc()
            try:
                await self.kube.merge_patch(path("", "v1", "pods", key[0], key[1]), {
                    "metadata": {"resourceVersion": meta.get("resourceVersion"),
                                 "annotations": outcome.annotation_patch()}})
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise
                continue  # gone, or changed: the watch brings it back if there is more
            metrics.RESIZES.labels(outcome.status.state).inc()
            log.info("budget resize decided", extra={
                "pod": "/".join(key), "state": outcome.status.state,
                "reason": outcome.status.reason})
            if outcome.applied:
                await post_event(self.kube, obj, "v1", "Pod", REASON_RESIZED,
                                 resized_message(view.annotations, outcome), "Normal",
                                 NODE_DAEMON)
            else:
                await post_event(self.kube, obj, "v1", "Pod", REASON_RESIZE_REFUSED,
                                 f"budget request refused: {outcome.status.reason}",
                                 "Warning", NODE_DAEMON)

    async def _write_capacity(self, manager: Manager) -> None:
        node = self.node()
        if node is None:
            return
        s = manager.state
        status = node.get("status") or {}
        want = vgpu_capacity(s.units, s.sharing, max_pods(status))
        have = {k: v for k, v in (status.get("capacity") or {}).items() if k in want}
        have_alloc = {k: v for k, v in (status.get("allocatable") or {}).items() if k in want}
        if have == want and have_alloc == want:
            return
        metrics.API_WRITES.labels("node-status").inc()
        try:
            await self.kube.merge_patch(
                path("", "v1", "nodes", name=self.opts.node_name, sub="status"),
                capacity_patch(want))
        except ApiError as exc:
            metrics.ERRORS.labels("node-status").inc()
            log.warning("node capacity not written", extra={"error": str(exc)[:300]})
            return
        log.info("node capacity written", extra={"capacity": want})


def max_pods(status: Mapping[str, Any]) -> int:
    """How many pods the kubelet may run (its Node's ``pods`` capacity)."""
    try:
        return int(str((status.get("capacity") or {}).get("pods")))
    except ValueError:
        return DEFAULT_MAX_PODS


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace", "")), str(meta.get("name", "")))


def _unhealthy(u: Unit) -> Unit:
    return Unit(u.uuid, u.gpu_uuid, u.gpu_index, u.profile, u.memory_bytes, healthy=False)


def _device(resource: str) -> bool:
    """A resource tessera's device plugin allocates (shares or whole MIG instances)."""
    return resource == VGPU or resource.startswith(MIG_PREFIX)
