"""The device plugin's gRPC side as the daemon runs it: one plugin server per advertised
resource, each on its own socket, registered with the kubelet and registered again when the
kubelet restarted (I/O; ``server`` speaks the protocol, ``manager`` decides).

Each server asks a :class:`WaitingResource`: the resource manager's answer, with the calls
the kubelet makes around an allocation kept apart from a PodResources ``List``
(``listgate``), and an Allocate that finds no candidate pod, or a GetPreferredAllocation
that finds none without an allocation, waiting a little for the pod watch (the kubelet may
hear of a pod before the daemon does).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

import grpc

from tessera_node import metrics
from tessera_node.container.response import ContainerResponse
from tessera_node.deviceplugin.devices import PluginDevice
from tessera_node.deviceplugin.listgate import AllocationGate
from tessera_node.deviceplugin.manager import Manager
from tessera_node.deviceplugin.node_pods import NodePods
from tessera_node.deviceplugin.server import AllocateError, PluginServer, Resource
from tessera_node.settings import ALLOCATE_WAIT_S, PREFERRED_WAIT_S

log = logging.getLogger("tessera_node.deviceplugin")


class WaitingResource:
    """One resource as its plugin server sees it; Allocate waits a little for the pod watch."""

    def __init__(self, name: str, manager: Callable[[], Manager], gate: AllocationGate,
                 pods: NodePods) -> None:
        self.name = name
        self.manager = manager
        """The resource manager (AllocateError while the device plugin is not ready)."""
        self.gate = gate
        self.pods = pods

    def devices(self) -> list[PluginDevice]:
        return self.manager().resource(self.name).devices()

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int
                  ) -> list[str]:
        deadline = time.monotonic() + PREFERRED_WAIT_S
        while time.monotonic() < deadline:  # the pod being admitted: not in the watch yet?
            seen = self.pods.version
            if self.manager().knows_next(self.name, size):
                break
            self.pods.wait_change(seen, deadline - time.monotonic())
        with self.gate.answering(then_allocate=True):
            return self.manager().resource(self.name).preferred(available, must_include,
                                                                 size)

    def allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        with self.gate.answering(then_allocate=False):
            return self._allocate(device_ids)

    def _allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        started = time.monotonic()
        deadline = started + ALLOCATE_WAIT_S
        while True:
            seen = self.pods.version
            try:
                resp = self.manager().allocate(self.name, device_ids)
            except AllocateError as exc:
                if time.monotonic() >= deadline or "pending pod" not in str(exc):
                    metrics.ALLOCATIONS.labels(self.name, "refused").inc()
                    log.warning("Allocate refused", extra={"resource": self.name,
                                                           "devices": list(device_ids),
                                                           "error": str(exc)})
                    raise
                self.pods.wait_change(seen, deadline - time.monotonic())
                continue
            except Exception as exc:  # a fault of the daemon's: the kubelet shows this text
                metrics.ALLOCATIONS.labels(self.name, "refused").inc()
                metrics.ERRORS.labels("device-plugin").inc()
                log.exception("Allocate failed", extra={"resource": self.name,
                                                        "devices": list(device_ids)})
                raise AllocateError(
                    f"tessera-node failed answering Allocate ({type(exc).__name__}: {exc}); "
                    f"its log on this node has the details") from exc
            seconds = time.monotonic() - started
            metrics.ALLOCATIONS.labels(self.name, "ok").inc()
            metrics.ALLOCATE_SECONDS.labels(self.name).observe(seconds)
            log.info("Allocate", extra={"resource": self.name, "devices": list(device_ids),
                                        "seconds": round(seconds, 4)})
            return resp


class PluginServers:
    def __init__(self, plugins_dir: str, resource: Callable[[str], Resource]) -> None:
        self.plugins_dir = plugins_dir
        self.resource = resource
        """The resource a new server answers for, by name."""
        self.servers: dict[str, PluginServer] = {}
        self.unregistered: dict[str, str] = {}
        """Resource -> why the kubelet did not take its registration."""

    def serve(self, names: Iterable[str]) -> None:
        """A plugin per advertised resource, registered; served again and re-registered
        when the kubelet restarted (blocking)."""
        for name in names:
            server = self.servers.get(name)
            try:
                if server is None:
                    server = PluginServer(self.resource(name), self.plugins_dir)
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

    def refresh(self) -> None:
        """Every server sends its device list again if it changed (any thread)."""
        for server in list(self.servers.values()):
            server.refresh()

    def stop(self) -> None:
        """Stop serving (blocking)."""
        for server in self.servers.values():
            server.stop()
        self.servers = {}

    def not_ready(self) -> list[str]:
        return [f"device plugin {r}: not registered: {why}"
                for r, why in sorted(self.unregistered.items())]
