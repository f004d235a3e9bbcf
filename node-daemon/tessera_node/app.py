"""``tessera-node run``: wire the reconciler's parts together and run them until a signal."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal

from tessera.api.names import NODE_DAEMON
from tessera.kube import serve
from tessera.kube.client import Kube, load_credentials
from tessera.kube.health import Health, supervise
from tessera_node.audit.runner import AuditRunner
from tessera_node.cores.runner import CoreControl
from tessera_node.device.hostlock import GPULocks
from tessera_node.device.nvml import NvmlReader
from tessera_node.device.smi import NvidiaSmi
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import Unit, units
from tessera_node.deviceplugin.node_pods import NodePods
from tessera_node.deviceplugin.registry import ContainerRegistry, SetUpContainer
from tessera_node.deviceplugin.service import DevicePlugin
from tessera_node.dra.publisher import SlicePublisher
from tessera_node.dra.resizer import ClaimResizer
from tessera_node.dra.service import AllocatedClaims, DraPlugin
from tessera_node.dra.state import DraDevices
from tessera_node.layout.enact import SmiEnactor
from tessera_node.layout.holders import DeviceHolders, NoHolders
from tessera_node.layout.instances import DemandRunner, InstanceMaker, units_held_by_pods
from tessera_node.node.own_node import OwnNode
from tessera_node.node.reconciler import NodeReconciler
from tessera_node.settings import Options

log = logging.getLogger("tessera_node")


async def run(opts: Options) -> None:
    kube = Kube(load_credentials(opts.kubeconfig), user_agent=NODE_DAEMON)
    health = Health(stuck_after_s=opts.stuck_after_s)
    reader = NvmlReader(opts.driver_root)
    smi = NvidiaSmi.locate(opts.nvidia_smi, opts.driver_root)
    try:
        os.makedirs(opts.state_dir, exist_ok=True)
    except OSError as exc:
        log.warning("state directory not usable", extra={"dir": opts.state_dir,
                                                         "error": str(exc)})
    changed = asyncio.Event()  # what the Node should say may have changed: reconcile
    own = OwnNode(kube, opts.node_name, health, changed.set)
    registry = ContainerRegistry()  # the containers tessera set up here (audit, core control)
    loop = asyncio.get_running_loop()

    def withdrawn() -> None:  # the enactor's thread: the inventory is to leave them out
        loop.call_soon_threadsafe(changed.set)

    plugin = (DevicePlugin(kube, opts, health, own.current, registry,
                           on_commitments=changed.set, on_withdrawn=withdrawn)
              if opts.device_plugin else None)
    # -- DRA (--dra; docs/dra.md): the node's ResourceSlices (withdrawn from before a MIG
    # change) and the kubelet plugin, which maps a claim's devices back to the units
    # published and counts its prepared claims as holders of their units
    offer = DraDevices(opts.shares_per_unit, reserved_known=not opts.dra)
    publisher = (SlicePublisher(kube, opts.node_name, health, offer, opts.resync_interval_s,
                                on_finding=changed.set) if opts.dra else None)
    # the pods bound to the node (who uses which claim): the device plugin's watch, or one
    # of the DRA plugin's own where there is no device plugin
    pods_changed = asyncio.Event()  # a DRA node's pods changed: live resizes to answer
    pods = (plugin.pods if plugin is not None
            else NodePods(kube, opts.node_name, health, lambda views: pods_changed.set())
            if opts.dra else None)
    resizer: ClaimResizer | None = None

    def claims_changed() -> None:  # the prepared claims were read, resized or unprepared
        if resizer is not None:
            resizer.republish()
        loop.call_soon_threadsafe(changed.set)  # the partitions' reports name their claims

    dra = (DraPlugin(kube, opts, offer.present, lambda: snapshot_units(reconciler.snapshot),
                     lambda: list(pods.objects.values()) if pods is not None else [],
                     claims_changed)
           if opts.dra else None)
    if dra is not None and publisher is not None and pods is not None:
        resizer = ClaimResizer(kube, pods, dra, publisher, offer, pods_changed,
                               opts.poll_interval_s)
    holders: DeviceHolders = (plugin.held if plugin is not None
                              else dra if dra is not None else NoHolders())
    # a MIG change on a DRA node also waits for claims allocated here but not prepared yet
    enacting: DeviceHolders = (AllocatedClaims(dra) if plugin is None and dra is not None
                               else holders)
    advertiser = plugin.devices if plugin is not None else publisher
    enactor = SmiEnactor(smi, reader, GPULocks(opts.state_dir), enacting,
                         advertiser=advertiser,
                         recheck_s=opts.retry_interval_s, allow_reset=opts.allow_gpu_reset)
    await asyncio.to_thread(enactor.prepare)
    if dra is not None:  # claims on GPUs in migMode OnDemand: their instances made at prepare
        dra.maker, dra.on_demand = InstanceMaker(enactor), offer.on_demand_models
    # the instances of on-demand GPUs: made for the pods the operator asks them for (device
    # plugin), destroyed once nothing holds them (both paths: a DRA node's unprepare
    # destroys its claim's, this the ones no claim holds, e.g. of a claim deleted unprepared)
    demand = (DemandRunner(InstanceMaker(enactor), plugin.devices, units_held_by_pods(plugin),
                           opts.on_demand_idle_s) if plugin is not None
              else DemandRunner(InstanceMaker(enactor), publisher, dra.units_held,
                                opts.on_demand_idle_s, keeps=dra.keeps_instance)
              if dra is not None and publisher is not None else None)
    reconciler = NodeReconciler(kube, opts, reader, enactor, health, holders, own, changed, plugin,
                                publisher, dra.made_for if dra is not None else dict, demand)

    def not_ready() -> list[str]:
        # a DRA node's own pod watch: before it listed, a claim's processes have no pod
        pods_unlisted = (["pods: not listed yet (who uses which claim)"]
                         if plugin is None and pods is not None and not pods.listed() else [])
        return (reconciler.not_ready() + (plugin.not_ready() if plugin is not None else [])
                + (dra.not_ready() if dra is not None else []) + pods_unlisted)

    runner = await serve.start(serve.health_app(health, not_ready=not_ready),
                               opts.metrics_host, opts.metrics_port)
    log.info("started", extra={"node": opts.node_name, "metricsPort": opts.metrics_port,
                               "driverRoot": opts.driver_root, "nvidiaSmi": smi.path})

    def containers() -> list[SetUpContainer]:  # what tessera set up: containers and claims
        return registry.snapshot() + (dra.containers() if dra is not None else [])

    def unit_indexes() -> dict[str, int]:
        return ((plugin.unit_indexes() if plugin is not None else {})
                | (dra.unit_indexes() if dra is not None else {}))

    auditor = AuditRunner(kube, opts.node_name, containers, reader,
                          opts.audit_interval_s, opts.audit_slack_mib)
    parts = {"node-watch": own.watch, "partition-watch": reconciler.watch_partitions,
             "devices": reconciler.poll_devices, "reconcile": reconciler.reconcile_loop,
             "audit": auditor.run}
    if plugin is not None or dra is not None:
        cores = CoreControl(containers, unit_indexes, reader, opts.core_interval_s)
        parts |= {"core-control": cores.run}
    if pods is not None:
        parts |= {"pod-watch": pods.watch}
    if plugin is not None:
        parts |= {"device-plugin": plugin.run}
    if publisher is not None and dra is not None:  # DRA
        parts |= {"dra-slice-watch": publisher.watch, "dra-publish": publisher.run,
                  "dra-plugin": dra.run}
    if resizer is not None:
        parts |= {"dra-resize": resizer.run}
    tasks = []
    for name, work in parts.items():
        task = asyncio.create_task(supervise(name, work, health), name=name)
        health.track(name, task)
        tasks.append(task)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        await reconciler.work.close()
        await runner.cleanup()
        await kube.close()
        reader.close()
        log.info("stopped", extra={"node": opts.node_name})


# -- the DRA kubelet plugin's device numbers -------------------------------------------------

def snapshot_units(snapshot: DeviceSnapshot | None) -> list[Unit]:
    """The units NVML showed last, with their device numbers."""
    return [] if snapshot is None else units(snapshot)
