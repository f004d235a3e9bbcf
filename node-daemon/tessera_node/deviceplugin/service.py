"""The device plugin inside tessera-node (the supervised task ``device-plugin``): its parts,
and the step that drives them.

* what the node's GPUs offer (:class:`~.node_devices.NodeDevices`: NVML's GPUs and the
  partitions' sharing, handed in by the reconciler after every pass, less what the MIG
  enactor withdrew: the daemon's ``Advertiser``);
* the pods bound to this node (:class:`~.node_pods.NodePods`, the pod watch);
* which pod holds which device, as the kubelet said (:class:`~.held.HeldDevices`, paced
  PodResources calls: the daemon's ``DeviceHolders``);
* one plugin server per resource, registered with the kubelet
  (:class:`~.plugins.PluginServers`);
* the resource manager (:class:`~.manager.Manager`: units, budget files, allocations),
  created once libtessera is installed.

Each step (on every change of the node's devices or pods, at least every
``--poll-interval``, every ``--confirm-interval`` while an allocation waits for its pod):
serve and register; confirm allocations (budget files ready, or refused with an Event on the
pod) and remove what ended pods leave; answer approved live resizes
(:mod:`.resize_answers`); write the Node's vgpu capacity (:mod:`.capacity`); recompute the
GPU commitments the reconciler writes on the Node.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from tessera.api.names import NODE_DAEMON
from tessera.kube.client import ApiError, Kube, Obj
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera_node import metrics
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container import library
from tessera_node.container.response import SimPaths
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.capacity import write_capacity
from tessera_node.deviceplugin.devices import Sharing
from tessera_node.deviceplugin.held import HeldDevices
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.manager import Manager, PluginConfig
from tessera_node.deviceplugin.matcher import PodView
from tessera_node.deviceplugin.node_devices import NodeDevices
from tessera_node.deviceplugin.node_pods import POD_WATCH, NodePods
from tessera_node.deviceplugin.plugins import PluginServers, WaitingResource
from tessera_node.deviceplugin.registry import ContainerRegistry
from tessera_node.deviceplugin.resize_answers import answer_resizes
from tessera_node.deviceplugin.server import AllocateError
from tessera_node.settings import CONTAINERS_DIR, FORGET_PENDING_S, LIB_DIR, Options

log = logging.getLogger("tessera_node.deviceplugin")

REFUSED_REASON = "GPUBudgetRefused"


class DevicePlugin:
    def __init__(self, kube: Kube, opts: Options, health: Health,
                 node: Callable[[], Obj | None], registry: ContainerRegistry,
                 on_commitments: Callable[[], None] = lambda: None,
                 on_withdrawn: Callable[[], None] = lambda: None) -> None:
        """``on_withdrawn``: the MIG enactor withdrew devices (called from its thread); the
        Node's inventory is to leave them out."""
        self.kube = kube
        self.opts = opts
        self.node = node
        """The daemon's own Node as last seen (None: not yet)."""
        self.registry = registry
        self.on_commitments = on_commitments
        self.committed: str | None = None
        """``tessera.dev/gpu-commitments`` as last computed (the reconciler writes it on the
        Node; ``on_commitments`` is called when it changes)."""
        self.manager: Manager | None = None
        self.devices = NodeDevices(self._publish, on_withdrawn)
        self.pods = NodePods(kube, opts.node_name, health, self._pods_changed)
        self.gate = AllocationGate()
        self.held = HeldDevices(opts, self.pods, self.gate, lambda: self.manager)
        self.plugins = PluginServers(opts.device_plugin_dir, self._resource)
        self._wake = asyncio.Event()
        self._refused: list[tuple[PodView, str, str]] = []
        self.error: str | None = "not started yet"

    # -- the reconciler's side ------------------------------------------------------------

    def update(self, snapshot: DeviceSnapshot | None, sharing: Mapping[str, Sharing],
               profiles: frozenset[str]) -> None:
        """What NVML shows and how the node's partitions share their GPUs (after every
        reconcile pass)."""
        self.devices.update(snapshot, sharing, profiles)
        self._wake.set()

    def unit_indexes(self) -> dict[str, int]:
        """The units the plugin hands out now (GPU or MIG UUID) -> their GPU's NVML index."""
        manager = self.manager
        return {} if manager is None else {u.uuid: u.gpu_index for u in manager.state.units}

    def not_ready(self) -> list[str]:
        out = []
        if not self.pods.listed():
            out.append(f"{POD_WATCH}: not listed yet")
        if self.error is not None:
            out.append(f"device plugin: {self.error}")
        elif not self.devices.read_once():
            out.append("device plugin: the GPUs not read yet")
        return out + self.plugins.not_ready()

    # -- changes ------------------------------------------------------------------------------

    def _publish(self) -> None:
        """Give the manager the node's units and every plugin its device list (blocking,
        any thread)."""
        if self.manager is None:
            return
        self.manager.update(self.devices.state())
        self.plugins.refresh()

    def _pods_changed(self, views: tuple[PodView, ...]) -> None:
        self.registry.identify({(v.uid, name): cid for v in views
                                for name, cid in v.container_ids.items()})
        self._wake.set()

    def _resource(self, name: str) -> WaitingResource:
        return WaitingResource(name, self.require_manager, self.gate, self.pods)

    # -- the task -----------------------------------------------------------------------------

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
            await asyncio.to_thread(self.plugins.stop)

    def _prepare(self) -> None:
        state = Path(self.opts.state_dir)
        try:
            lib_dir = library.install(self.opts.libtessera, state / LIB_DIR)
        except OSError as exc:
            self.error = str(exc)
            raise
        sim = None
        if self.opts.device_visibility == "sim":
            sim = SimPaths.of(str(Path(self.opts.driver_root) / "lib"), self.opts.sim_node)
        config = PluginConfig(
            node=self.opts.node_name, shares_per_unit=self.opts.shares_per_unit,
            lib_dir=str(lib_dir), visibility=self.opts.device_visibility,  # type: ignore[arg-type]
            forget_after_s=FORGET_PENDING_S,
            policy=self.opts.share_policy, sim=sim,  # type: ignore[arg-type]
        )
        writer = BudgetWriter(state / CONTAINERS_DIR, int(self.opts.budget_wait_s * 1000))
        writer.empty_trash()
        self.manager = Manager(config, writer, self.pods.views, self._on_refused,
                               self.registry)
        self.manager.update(self.devices.state())
        log.info("device plugin prepared", extra={"libtessera": str(lib_dir),
                                                   "visibility": config.visibility})

    def _serve(self, manager: Manager) -> None:
        """Every plugin its device list; a plugin per advertised resource, registered."""
        self._publish()
        self.plugins.serve(manager.advertised())

    def _on_refused(self, pod: PodView, container: str, why: str) -> None:
        self._refused.append((pod, container, why))

    async def step(self) -> None:
        manager = self.require_manager()
        if not self.devices.read_once():
            # Before NVML's first read no unit is known: confirming the allocations of
            # running containers now (after a restart or an upgrade) would refuse their
            # budgets for an unknown memory, and the node's capacity would read 0.
            return
        await asyncio.to_thread(self._serve, manager)
        await self._confirm(manager)
        await answer_resizes(self.kube, self.pods, manager)
        node = self.node()
        if node is not None:
            await write_capacity(self.kube, self.opts.node_name, node, manager.state)
        committed = await asyncio.to_thread(manager.commitments)
        if committed != self.committed:
            self.committed = committed
            self.on_commitments()

    async def _confirm(self, manager: Manager) -> None:
        """Confirm pending allocations from what the kubelet says the pods hold (ready, or
        refused with an Event on the pod), and remove what ended pods leave."""
        if not self.pods.listed():
            return  # a pod not known yet would count as ended
        if not self.devices.read_once():
            return  # see step(): refusing now would take running containers' budgets away
        try:
            listing = await asyncio.to_thread(self.held.ask, manager)
        except OSError as exc:
            metrics.ERRORS.labels("podresources").inc()
            log.warning("cannot confirm allocations", extra={"error": str(exc)})
            return
        await asyncio.to_thread(manager.resolve, listing)
        refused, self._refused = self._refused, []
        for pod, container, why in refused:
            obj = self.pods.objects.get((pod.namespace, pod.name))
            if obj is None:
                continue
            metrics.API_WRITES.labels("event").inc()
            await post_event(self.kube, obj, "v1", "Pod", REFUSED_REASON,
                             f"container {container}: no GPU memory: {why}", "Warning",
                             NODE_DAEMON)
