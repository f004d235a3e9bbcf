"""The gRPC side of tessera's DRA kubelet plugin: the registration socket the kubelet's plugin
watcher finds, the DRA service it then calls, and the registration's outcome for the daemon's
readiness. Every decision is the :class:`~.prepare.ClaimPreparer`'s.

* **Registration** (``pluginregistration.Registration``) on
  ``<kubelet root>/plugins_registry/gpu.tessera.dev-reg.sock``: ``GetInfo`` answers type
  ``DRAPlugin``, the driver's name, the DRA socket's absolute path and the services served,
  ``v1.DRAPlugin`` (both kubelets 1.34 and 1.37 take it, picking the first entry they
  support); ``NotifyRegistrationStatus`` says whether the kubelet took the plugin, and why
  not.
* **DRA** (``k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin``) on
  ``<kubelet root>/plugins/gpu.tessera.dev/dra.sock``: ``NodePrepareResources`` and
  ``NodeUnprepareResources``, one answer per claim (a claim that fails says why in its
  ``error``; the others are prepared).

The kubelet's plugin watcher registers every socket it finds in ``plugins_registry``, also
the ones there when it starts, so a restarted kubelet registers the plugin again by itself;
the plugin serves again when a socket of its own is gone (a wiped directory).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.api.names import DRA_DRIVER
from tessera_node import metrics
from tessera_node.dra.claims import ClaimError
from tessera_node.dra.prepare import ClaimPreparer, ClaimRef
from tessera_node.dra.proto import dra_v1_pb2, pluginregistration_pb2
from tessera_node.dra.proto import dra_v1_pb2_grpc as _dra_grpc
from tessera_node.dra.proto import pluginregistration_pb2_grpc as _reg_grpc

log = logging.getLogger("tessera_node.dra")
dra_grpc: Any = _dra_grpc  # generated without types
reg_grpc: Any = _reg_grpc

PLUGIN_TYPE = "DRAPlugin"
SERVICES = ("v1.DRAPlugin",)
"""The DRA services served, preferred first (``supported_versions`` in GetInfo)."""
REGISTRY_DIR = "plugins_registry"
PLUGINS_DIR = "plugins"
DRA_SOCKET = "dra.sock"


def registration_socket(kubelet_root: str | Path) -> Path:
    return Path(kubelet_root) / REGISTRY_DIR / f"{DRA_DRIVER}-reg.sock"


def dra_socket(kubelet_root: str | Path) -> Path:
    return Path(kubelet_root) / PLUGINS_DIR / DRA_DRIVER / DRA_SOCKET


class RegistrationState:
    """What the kubelet said of the plugin's registration (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.registered = False
        self.error: str | None = None

    def notify(self, registered: bool, error: str) -> None:
        with self._lock:
            self.registered, self.error = registered, (None if registered else error or "")

    def reset(self) -> None:
        self.notify(False, "")

    def not_ready(self) -> list[str]:
        with self._lock:
            if self.registered:
                return []
            if self.error:
                return [f"DRA plugin: the kubelet refused its registration: {self.error}"]
            return ["DRA plugin: not registered with the kubelet yet"]


class _Registration(reg_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, endpoint: Path, state: RegistrationState) -> None:
        self.endpoint = endpoint
        self.state = state

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(
            type=PLUGIN_TYPE, name=DRA_DRIVER, endpoint=str(self.endpoint),
            supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        self.state.notify(request.plugin_registered, request.error)
        if request.plugin_registered:
            log.info("registered with the kubelet", extra={"driver": DRA_DRIVER})
        else:
            log.warning("the kubelet refused the registration", extra={"error": request.error})
        return pluginregistration_pb2.RegistrationStatusResponse()


class _DraPlugin(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def __init__(self, preparer: ClaimPreparer) -> None:
        self.preparer = preparer

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = {}
        for c in request.claims:
            ref = ClaimRef(c.namespace, c.name, c.uid)
            try:
                devices = self.preparer.prepare(ref)
            except (ClaimError, OSError) as exc:
                metrics.ERRORS.labels("dra").inc()
                log.warning("claim not prepared", extra={
                    "claim": f"{c.namespace}/{c.name}", "uid": c.uid, "error": str(exc)})
                out[c.uid] = dra_v1_pb2.NodePrepareResourceResponse(
                    error=f"{DRA_DRIVER}: {exc}")
                continue
            out[c.uid] = dra_v1_pb2.NodePrepareResourceResponse(devices=[
                dra_v1_pb2.Device(request_names=list(d.request_names), pool_name=d.pool,
                                  device_name=d.device, cdi_device_ids=list(d.cdi_ids),
                                  **({"share_id": d.share_id} if d.share_id else {}))
                for d in devices])
        return dra_v1_pb2.NodePrepareResourcesResponse(claims=out)

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = {}
        for c in request.claims:
            try:
                self.preparer.unprepare(c.uid)
                out[c.uid] = dra_v1_pb2.NodeUnprepareResourceResponse()
            except (ClaimError, OSError) as exc:
                metrics.ERRORS.labels("dra").inc()
                out[c.uid] = dra_v1_pb2.NodeUnprepareResourceResponse(
                    error=f"{DRA_DRIVER}: {exc}")
        return dra_v1_pb2.NodeUnprepareResourcesResponse(claims=out)


MAX_SOCKET_PATH = 107
"""The longest path a unix socket can be bound at (``sun_path`` holds 108 bytes with its
terminating zero)."""


class DraServer:
    """Serves both sockets (``start``), and serves again when one of them is gone
    (``serve_again_if_gone``)."""

    def __init__(self, preparer: ClaimPreparer, kubelet_root: str | Path) -> None:
        self.preparer = preparer
        self.registration = registration_socket(kubelet_root)
        self.endpoint = dra_socket(kubelet_root)
        self.state = RegistrationState()
        self._server: Any = None

    def start(self) -> None:
        for sock in (self.registration, self.endpoint):
            if len(os.fsencode(sock)) > MAX_SOCKET_PATH:
                raise OSError(f"the DRA plugin's socket path {sock} is longer than a unix "
                              f"socket's path may be ({MAX_SOCKET_PATH} bytes): give a "
                              f"shorter --kubelet-root")
            sock.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
            sock.unlink(missing_ok=True)
        self.state.reset()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        dra_grpc.add_DRAPluginServicer_to_server(_DraPlugin(self.preparer), server)
        reg_grpc.add_RegistrationServicer_to_server(
            _Registration(self.endpoint, self.state), server)
        # the DRA socket first: the kubelet dials it as soon as it finds the registration one
        server.add_insecure_port(f"unix://{self.endpoint}")
        server.add_insecure_port(f"unix://{self.registration}")
        server.start()
        self._server = server
        log.info("DRA plugin serving", extra={"registration": str(self.registration),
                                               "endpoint": str(self.endpoint)})

    def serve_again_if_gone(self) -> bool:
        """Serve anew when a socket of the plugin's is gone; whether it did."""
        if self.registration.exists() and self.endpoint.exists():
            return False
        log.info("a DRA plugin socket is gone: serving again")
        self.stop()
        self.start()
        return True

    def not_ready(self) -> list[str]:
        if self._server is None:
            return ["DRA plugin: not serving"]
        return self.state.not_ready()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None
