"""GPU nodes that are API objects only (no kubelet): what a scheduler sees of a node.

Each has tessera's inventory as a daemon would publish it (every GPU an H100-80GB, shared
whole as ``tessera.dev/vgpu`` units of ``shares`` shares), the capacity the device plugin
would advertise, a Ready condition, and a heartbeat (its Lease in ``kube-node-lease``
renewed every few seconds, as a kubelet does) so that kube-controller-manager never taints
it unreachable. Pods bound to them stay Pending: for schedulers and their benchmarks.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime as dt
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tessera.api.inventory import AdvertisedUnit, GPUInventory, node_labels, to_annotation
from tessera.api.names import GPU_POD, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.kube.client import ApiError, Kube, load_credentials, path

T = TypeVar("T")

H100_MIB = 81559


def gpu_node(name: str, gpus: int = 8, shares: int = 10, memory_mib: int = H100_MIB
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Node and its status (every GPU a unit of ``memory_mib``)."""
    inv = [GPUInventory(index=i, uuid=f"GPU-{name}-{i}", model="H100-80GB",
                        memory_mib=memory_mib, numa_node=i * 2 // gpus,
                        pci_bus_id=f"00000000:{0x10 + i:02X}:00.0",
                        nvlink_peers=tuple(f"GPU-{name}-{j}" for j in range(gpus) if j != i),
                        units=(AdvertisedUnit(uuid=f"GPU-{name}-{i}", resource=VGPU,
                                              memory_mib=memory_mib, shares=shares),))
           for i in range(gpus)]
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {**node_labels(inv), "kubernetes.io/hostname": name,
                                 "tessera.dev/api-node": "true"},
        "annotations": {"tessera.dev/gpus": to_annotation(inv)}}}
    res = {"cpu": "64", "memory": "1Ti", "pods": "1000", VGPU: str(gpus * shares),
           VGPU_MEMORY: str(gpus * memory_mib), VGPU_CORES: str(gpus * 100), GPU_POD: "1000"}
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "api node",
         "lastHeartbeatTime": now, "lastTransitionTime": now}]}
    return node, status


class ApiGPUNodes:
    """``with ApiGPUNodes(kubeconfig, count) as nodes: ...``: creates them, keeps them
    alive (an event loop of its own in a thread), deletes them."""

    def __init__(self, kubeconfig: str, count: int, gpus: int = 8, prefix: str = "gpu-",
                 shares: int = 10, memory_mib: int = H100_MIB) -> None:
        self.kubeconfig = kubeconfig
        self.names = [f"{prefix}{i:03d}" for i in range(count)]
        self.gpus, self.shares, self.memory_mib = gpus, shares, memory_mib
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="api-nodes")
        self._beat: concurrent.futures.Future[None] | None = None
        self.kube: Kube | None = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(300)

    def __enter__(self) -> ApiGPUNodes:
        self._thread.start()
        self._run(self._create())
        self._beat = asyncio.run_coroutine_threadsafe(self._heartbeat(), self.loop)
        return self

    async def _create(self) -> None:
        self.kube = Kube(load_credentials(self.kubeconfig))
        for n in self.names:
            node, status = gpu_node(n, self.gpus, self.shares, self.memory_mib)
            await self.kube.create(path("", "v1", "nodes"), node)
            await self.kube.merge_patch(path("", "v1", "nodes", None, n) + "/status",
                                        {"status": status})
        await self._renew()

    async def _renew(self) -> None:
        assert self.kube is not None
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        for n in self.names:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": n, "namespace": "kube-node-lease"},
                    "spec": {"holderIdentity": n, "leaseDurationSeconds": 40,
                             "renewTime": now}}
            url = path("coordination.k8s.io", "v1", "leases", "kube-node-lease")
            try:
                await self.kube.merge_patch(f"{url}/{n}", {"spec": body["spec"]})
            except ApiError as exc:
                if exc.status != 404:
                    raise
                await self.kube.create(url, body)

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(4)
            try:
                await self._renew()
            except (ApiError, OSError, TimeoutError) as exc:  # a missed beat risks a taint
                print(f"node heartbeat failed: {exc}")

    async def _delete(self) -> None:
        assert self.kube is not None
        for n in self.names:
            with contextlib.suppress(ApiError):
                await self.kube.delete(path("", "v1", "nodes", None, n))
        await self.kube.close()

    def __exit__(self, *_: Any) -> None:
        if self._beat is not None:
            self._beat.cancel()
        self._run(self._delete())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
