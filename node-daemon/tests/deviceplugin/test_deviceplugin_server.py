"""The plugin server against a fake kubelet over real gRPC on unix sockets: registration,
ListAndWatch updates on MIG and health changes, preferred allocation, Allocate, and
re-registration after the kubelet restarts (its socket created anew)."""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, VGPU
from tessera_node.budget.writer import BudgetWriter
from tessera_node.deviceplugin.devices import Unit
from tessera_node.deviceplugin.manager import Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import PodView
from tessera_node.deviceplugin.proto import api_pb2
from tessera_node.deviceplugin.proto import api_pb2_grpc as _grpc
from tessera_node.deviceplugin.server import KUBELET_SOCKET, PluginServer
from tessera_node.settings import FORGET_PENDING_S

api_grpc: Any = _grpc
GIB = 1 << 30
G0 = "GPU-00000000-0000-0000-0000-000000000000"
G1 = "GPU-11111111-1111-1111-1111-111111111111"


class FakeKubelet(api_grpc.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, plugins_dir: Path) -> None:
        self.registered: queue.Queue[Any] = queue.Queue()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix://{plugins_dir / KUBELET_SOCKET}")
        self.server.start()

    def Register(self, request: Any, context: Any) -> Any:
        self.registered.put(request)
        return api_pb2.Empty()

    def stop(self) -> None:
        self.server.stop(0).wait()


@pytest.fixture
def plugins_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # unix socket paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def pod() -> PodView:
    budget = BudgetAnnotation(containers={"main": PerShareBudget(
        shares=1, memory_bytes=GIB, cores=50)}).to_annotation()
    return PodView("u", "ns", "p", "n1", "Pending", False, {"main": {VGPU: 1}}, frozenset(),
                   {ANNOTATION_BUDGET: budget})


def test_register_watch_allocate_and_reregister(plugins_dir: Path) -> None:
    kubelet = FakeKubelet(plugins_dir)
    manager = Manager(
        PluginConfig(node="n1", shares_per_unit=2, lib_dir="/opt/tessera/lib/v1",
                     visibility="volume-mounts", forget_after_s=FORGET_PENDING_S),
        BudgetWriter(plugins_dir / "state", 1000), lambda: [pod()], lambda *a: None,
    )
    manager.update(NodeState(units=[Unit(G0, G0, 0, None, 80 * GIB, True)]))
    plugin = PluginServer(manager.resource(VGPU), plugins_dir)
    plugin.start()
    watcher = threading.Thread(target=plugin.watch_kubelet, kwargs={"interval": 0.05})
    watcher.start()
    try:
        reg = kubelet.registered.get(timeout=10)
        assert (reg.version, reg.resource_name, reg.endpoint) == (
            "v1beta1", VGPU, "tessera-vgpu.sock")
        assert reg.options.get_preferred_allocation_available
        with grpc.insecure_channel(f"unix://{plugins_dir / reg.endpoint}") as ch:
            stub = api_grpc.DevicePluginStub(ch)
            opts = stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=10)
            assert opts.get_preferred_allocation_available and not opts.pre_start_required
            stream = stub.ListAndWatch(api_pb2.Empty(), timeout=30)
            first = next(stream)
            assert [(d.ID, d.health) for d in first.devices] == [
                (f"{G0}::0", "Healthy"), (f"{G0}::1", "Healthy")]
            # a GPU appears, another turns unhealthy: one update
            manager.update(NodeState(units=[Unit(G0, G0, 0, None, 80 * GIB, False),
                                            Unit(G1, G1, 1, None, 80 * GIB, True)]))
            plugin.refresh()
            second = next(stream)
            assert {(d.ID, d.health) for d in second.devices} == {
                (f"{G0}::0", "Unhealthy"), (f"{G0}::1", "Unhealthy"),
                (f"{G1}::0", "Healthy"), (f"{G1}::1", "Healthy")}
            pref = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
                container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                    available_deviceIDs=[f"{G1}::0", f"{G1}::1"], allocation_size=1)]),
                timeout=10)
            assert list(pref.container_responses[0].deviceIDs) == [f"{G1}::0"]
            resp = stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[f"{G1}::0"])]), timeout=10)
            mounts = {m.container_path: (m.host_path, m.read_only)
                      for m in resp.container_responses[0].mounts}
            assert mounts["/run/tessera/budget"][1] is True
            assert mounts[f"/var/run/nvidia-container-devices/{G1}"] == ("/dev/null", True)
            with pytest.raises(grpc.RpcError) as err:
                stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[f"{G0}::0"])]), timeout=10)
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "unhealthy" in (err.value.details() or "")
            stream.cancel()
        # the kubelet restarts: a new socket (and plugin sockets deleted)
        kubelet.stop()
        (plugins_dir / KUBELET_SOCKET).unlink(missing_ok=True)
        (plugins_dir / "tessera-vgpu.sock").unlink(missing_ok=True)
        kubelet = FakeKubelet(plugins_dir)
        again = kubelet.registered.get(timeout=20)
        assert again.resource_name == VGPU and (plugins_dir / again.endpoint).exists()
    finally:
        plugin.stop()
        watcher.join(timeout=10)
        kubelet.stop()
