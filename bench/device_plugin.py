"""Device plugin benchmark: one Allocate, over the kubelet's gRPC, tessera's vs a bare plugin.

A node of 8 H100s with 10 ``tessera.dev/vgpu`` shares each and 80 pending pods that each ask
for one share with a budget. Each Allocate (a unix-socket gRPC call, as the kubelet makes
it) goes to tessera's plugin (device checks, the pending pods' fit, the pending budget file,
ledger directory and record written, the response with its mounts), and, in the same run,
to a bare plugin over the same server code that answers an empty response: the honest
baseline is the gRPC round trip itself. Prints median and 99th percentile of both and their
ratio. Run: ``python bench/device_plugin.py``.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, VGPU
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container.response import ContainerResponse
from tessera_node.deviceplugin.devices import PluginDevice, Unit, share_id
from tessera_node.deviceplugin.manager import Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import pod_view
from tessera_node.deviceplugin.proto import api_pb2
from tessera_node.deviceplugin.proto import api_pb2_grpc as _api_grpc
from tessera_node.deviceplugin.server import KUBELET_SOCKET, PluginServer
from tessera_node.settings import FORGET_PENDING_S

api_grpc: Any = _api_grpc
GIB = 1 << 30
GPUS, SHARES, ROUNDS = 8, 10, 5


class Registration(api_grpc.RegistrationServicer):  # type: ignore[misc]
    def Register(self, request: Any, context: Any) -> Any:
        return api_pb2.Empty()


class Bare:
    """The baseline plugin: the same device list, an empty answer, no checks."""

    name = VGPU

    def __init__(self, devices: list[PluginDevice]) -> None:
        self._devices = devices

    def devices(self) -> list[PluginDevice]:
        return self._devices

    def preferred(self, available: Sequence[str], must_include: Sequence[str], size: int
                  ) -> list[str]:
        return list(available)[:size]

    def allocate(self, device_ids: Sequence[str]) -> ContainerResponse:
        return ContainerResponse()


def pod(i: int) -> dict[str, Any]:
    budget = BudgetAnnotation(containers={"main": PerShareBudget(shares=1, memory_bytes=GIB,
                                                           cores=10)}).to_annotation()
    return {"metadata": {"name": f"p{i:03d}", "namespace": "ns", "uid": f"u{i}",
                         "annotations": {ANNOTATION_BUDGET: budget}},
            "spec": {"nodeName": "n1", "containers": [
                {"name": "main", "resources": {"limits": {VGPU: "1"}}}]},
            "status": {"phase": "Pending"}}


def time_allocates(socket: Path, ids: list[str]) -> list[float]:
    out = []
    with grpc.insecure_channel(f"unix://{socket}") as ch:
        stub = api_grpc.DevicePluginStub(ch)
        for d in ids:
            req = api_pb2.AllocateRequest(container_requests=[
                api_pb2.ContainerAllocateRequest(devices_ids=[d])])
            started = time.perf_counter()
            stub.Allocate(req, timeout=10)
            out.append((time.perf_counter() - started) * 1000.0)
    return out


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="tessera-dp-bench-") as tmp:
        root = Path(tmp)
        kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_grpc.add_RegistrationServicer_to_server(Registration(), kubelet)
        kubelet.add_insecure_port(f"unix://{root / KUBELET_SOCKET}")
        kubelet.start()
        units = [Unit(f"GPU-{g:08d}-0000-0000-0000-000000000000",
                      f"GPU-{g:08d}-0000-0000-0000-000000000000", g, None, 80 * GIB, True)
                 for g in range(GPUS)]
        pods = [pod_view(pod(i)) for i in range(GPUS * SHARES)]
        writer = BudgetWriter(root / "containers", pending_wait_ms=5000)
        lib = root / "lib"
        lib.mkdir()
        manager = Manager(PluginConfig(node="n1", shares_per_unit=SHARES, lib_dir=str(lib),
                                       visibility="cdi", forget_after_s=FORGET_PENDING_S),
                          writer, lambda: pods, lambda p, c, why: None)
        manager.update(NodeState(units=units))
        tessera = PluginServer(manager.resource(VGPU), root)
        tessera.start()
        bare = PluginServer(Bare(manager.advertised()[VGPU]), root / "bare")
        (root / "bare").mkdir()
        (root / "bare" / KUBELET_SOCKET).symlink_to(root / KUBELET_SOCKET)
        bare.start()
        # each container gets one share on its own unit; every GPU's shares in turn
        ids = [share_id(u.uuid, k) for k in range(SHARES) for u in units]
        t_ms: list[float] = []
        b_ms: list[float] = []
        for _ in range(ROUNDS):  # interleaved: both see the same machine load
            b_ms += time_allocates(bare.socket, ids)
            t_ms += time_allocates(tessera.socket, ids)
        tessera.stop()
        bare.stop()
        kubelet.stop(0)

    def q(xs: list[float], p: float) -> float:
        return sorted(xs)[min(len(xs) - 1, int(p * len(xs)))]

    tm, bm = statistics.median(t_ms), statistics.median(b_ms)
    print(f"Allocate over gRPC, {len(t_ms)} calls each ({GPUS} GPUs x {SHARES} shares, "
          f"{len(pods)} pending pods, {ROUNDS} rounds)")
    print(f"{'plugin':<8} {'median ms':>9} {'p99 ms':>7}")
    print(f"{'bare':<8} {bm:>9.3f} {q(b_ms, 0.99):>7.3f}")
    print(f"{'tessera':<8} {tm:>9.3f} {q(t_ms, 0.99):>7.3f}")
    print(f"tessera / bare: median x{tm / bm:.2f}, p99 x{q(t_ms, 0.99) / q(b_ms, 0.99):.2f}; "
          f"tessera's own work per Allocate: {tm - bm:.3f} ms (median)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
