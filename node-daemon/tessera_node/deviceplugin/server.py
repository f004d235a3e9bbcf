"""The gRPC side of one device plugin (one resource, one socket): serves the kubelet's
DevicePlugin service, registers with the kubelet, and re-registers when the kubelet
restarts (its socket is created anew). Every decision is the ``Resource``'s."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any, Protocol

import grpc

from tessera_node.container.response import ContainerResponse
from tessera_node.deviceplugin.devices import PluginDevice
from tessera_node.deviceplugin.proto import api_pb2
from tessera_node.deviceplugin.proto import api_pb2_grpc as _api_grpc

log = logging.getLogger(__name__)
api_pb2_grpc: Any = _api_grpc  # generated without types

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"


class AllocateError(Exception):
    """Allocate refused, with the reason the kubelet shows on the pod."""


class Resource(Protocol):
    """What a plugin server asks of the resource manager."""

    name: str

    def devices(self) -> list[PluginDevice]: ...

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int
                  ) -> list[str]: ...

    def allocate(self, device_ids: Sequence[str]) -> ContainerResponse: ...


class DeviceBoard:
    """The current device list and a version that moves when it changes (ListAndWatch)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._devices: list[PluginDevice] = []

    def publish(self, devices: list[PluginDevice]) -> None:
        with self._cond:
            if devices != self._devices:
                self._devices = list(devices)
                self._version += 1
                self._cond.notify_all()

    def wait(self, seen: int, timeout: float) -> tuple[int, list[PluginDevice]]:
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen, timeout)
            return self._version, list(self._devices)

    def close(self) -> None:
        with self._cond:
            self._version += 1
            self._cond.notify_all()


def socket_name(resource: str) -> str:
    """``tessera.dev/mig-1g.10gb`` -> ``tessera-mig-1g.10gb.sock``."""
    return "tessera-" + resource.split("/", 1)[-1] + ".sock"


def to_proto(resp: ContainerResponse) -> Any:
    return api_pb2.ContainerAllocateResponse(
        envs=dict(resp.envs),
        mounts=[api_pb2.Mount(container_path=m.container_path, host_path=m.host_path,
                              read_only=m.read_only) for m in resp.mounts],
        cdi_devices=[api_pb2.CDIDevice(name=n) for n in resp.cdi_devices],
    )


class _Servicer(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    def __init__(self, resource: Resource, board: DeviceBoard, stopping: threading.Event
                 ) -> None:
        self.resource = resource
        self.board = board
        self.stopping = stopping

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return api_pb2.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        seen = -1
        while context.is_active() and not self.stopping.is_set():
            version, devices = self.board.wait(seen, timeout=1.0)
            if version == seen:
                continue
            seen = version
            yield api_pb2.ListAndWatchResponse(
                devices=[api_pb2.Device(ID=d.id, health=d.health) for d in devices]
            )

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        out = []
        for r in request.container_requests:
            ids = self.resource.preferred(
                list(r.available_deviceIDs), list(r.must_include_deviceIDs), r.allocation_size
            )
            out.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=ids))
        return api_pb2.PreferredAllocationResponse(container_responses=out)

    def Allocate(self, request: Any, context: Any) -> Any:
        out = []
        for r in request.container_requests:
            try:
                out.append(to_proto(self.resource.allocate(list(r.devices_ids))))
            except AllocateError as exc:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return api_pb2.AllocateResponse(container_responses=out)

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        return api_pb2.PreStartContainerResponse()


class PluginServer:
    """One resource's plugin: ``start`` serves and registers; ``refresh`` publishes the
    resource's current devices; ``watch_kubelet`` (a loop) re-registers after a kubelet
    restart."""

    def __init__(self, resource: Resource, plugins_dir: str | os.PathLike[str]) -> None:
        self.resource = resource
        self.dir = Path(plugins_dir)
        self.socket = self.dir / socket_name(resource.name)
        self.board = DeviceBoard()
        self._stopping = threading.Event()
        self._server: Any = None
        self._kubelet_id: tuple[int, int] | None = None

    def refresh(self) -> None:
        self.board.publish(self.resource.devices())

    def start(self) -> None:
        self.refresh()
        if self.socket.exists():
            self.socket.unlink()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        api_pb2_grpc.add_DevicePluginServicer_to_server(
            _Servicer(self.resource, self.board, self._stopping), server
        )
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        self.register()

    def _kubelet_socket_id(self) -> tuple[int, int] | None:
        try:
            st = (self.dir / KUBELET_SOCKET).stat()
        except FileNotFoundError:
            return None
        return (st.st_ino, st.st_ctime_ns)

    def register(self, timeout: float = 5.0) -> None:
        """Register with the kubelet; grpc.RpcError when it does not answer."""
        ident = self._kubelet_socket_id()
        with grpc.insecure_channel(f"unix://{self.dir / KUBELET_SOCKET}") as ch:
            api_pb2_grpc.RegistrationStub(ch).Register(
                api_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=self.socket.name,
                    resource_name=self.resource.name,
                    options=api_pb2.DevicePluginOptions(get_preferred_allocation_available=True),
                ),
                timeout=timeout,
            )
        self._kubelet_id = ident
        log.info("registered %s with the kubelet as %s", self.resource.name, self.socket.name)

    def kubelet_restarted(self) -> bool:
        """The kubelet's socket is another file than the one registered with (the kubelet
        also deletes every plugin socket when it restarts), or our socket is gone."""
        ident = self._kubelet_socket_id()
        return ident is not None and (ident != self._kubelet_id or not self.socket.exists())

    def watch_kubelet(self, interval: float = 1.0) -> None:
        """Until ``stop``: when the kubelet restarts, serve again and re-register."""
        while not self._stopping.wait(interval):
            if not self.kubelet_restarted():
                continue
            try:
                self.stop_serving()
                self.start()
            except grpc.RpcError as exc:
                log.warning("re-registering %s failed: %s", self.resource.name, exc)

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0.5).wait()
            self._server = None

    def stop(self) -> None:
        self._stopping.set()
        self.board.close()
        self.stop_serving()
