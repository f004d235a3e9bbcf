"""Placement benchmark: pods scheduled per second and scheduling latency with tessera's
extender (tessera-scheduler, a second kube-scheduler of the release calling the operator's
placement service) against the default kube-scheduler alone, in the same run, on the same
cluster: 500 GPU pods onto 50 nodes x 8 H100s (API objects with tessera's inventory, no
kubelet: :mod:`tessera_e2e.operator.api_nodes`), each pod one ``tessera.dev/vgpu`` share of
8,000 MiB and 10 % cores, created as fast as one client can.

Both phases' pods pass tessera's webhook alike (admission is not what is compared); only the
scheduler differs (``spec.schedulerName``). Latency: a pod's create returned -> the watch
shows it bound (this process's clock). Goal: tessera's p99 <= 1.5x the default's.

    .venv/bin/python bench/placement.py            # PODS=500 NODES=50 ROUNDS=1
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "core"), str(REPO / "operator"), str(REPO / "e2e")]

from tessera.api.names import SCHEDULER_NAME, VGPU, VGPU_CORES, VGPU_MEMORY  # noqa: E402
from tessera.kube.client import Kube, load_credentials, path  # noqa: E402
from tessera_e2e.controlplane.build import build_inputs  # noqa: E402
from tessera_e2e.controlplane.cache import default_layout  # noqa: E402
from tessera_e2e.controlplane.cluster import LocalCluster  # noqa: E402
from tessera_e2e.operator.api_nodes import ApiGPUNodes  # noqa: E402
from tessera_e2e.operator.replicas import LocalOperators  # noqa: E402
from tessera_e2e.operator.scheduler import TesseraScheduler  # noqa: E402
from tessera_e2e.operator.service import KernelService  # noqa: E402

PODS = int(os.environ.get("PODS", "500"))
NODES = int(os.environ.get("NODES", "50"))
ROUNDS = int(os.environ.get("ROUNDS", "1"))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def pod(name: str, scheduler: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "busybox", "resources": {
                         "limits": {VGPU: "1", VGPU_MEMORY: "8000", VGPU_CORES: "10"}}}]}}


def phase(cluster: LocalCluster, ns: str, scheduler: str) -> dict[str, float]:
    """Create PODS pods in ``ns`` for ``scheduler``; latencies create -> bound (the pod
    watch's event, this process's clock)."""
    created: dict[str, float] = {}
    bound: dict[str, float] = {}

    async def run() -> float:
        kube = Kube(load_credentials(str(cluster.kubeconfig)))
        gate = asyncio.Semaphore(8)
        all_bound = asyncio.Event()
        ready = asyncio.Event()

        async def watch() -> None:
            async for typ, obj in kube.watch(path("", "v1", "pods", ns)):
                if typ == "SYNC":
                    ready.set()
                    continue
                name = obj["metadata"]["name"]
                if (obj.get("spec") or {}).get("nodeName") and name not in bound:
                    bound[name] = time.monotonic()
                    if len(bound) == PODS:
                        all_bound.set()

        async def create(i: int) -> None:
            name = f"p{i:04d}"
            async with gate:
                await kube.create(path("", "v1", "pods", ns), pod(name, scheduler))
            created[name] = time.monotonic()

        watcher = asyncio.create_task(watch())
        try:
            await asyncio.wait_for(ready.wait(), 30)
            start = time.monotonic()
            await asyncio.gather(*(create(i) for i in range(PODS)))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(all_bound.wait(), 600)
            return start
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await kube.close()

    start = asyncio.run(run())
    lat = [bound[n] - created[n] for n in created if n in bound]
    last = max(bound.values()) if bound else time.monotonic()
    return {"bound": len(bound), "pods_per_s": len(bound) / (last - start),
            "p50_ms": pct(lat, 50) * 1000, "p99_ms": pct(lat, 99) * 1000,
            "create_s": max(created.values()) - start}


def main() -> None:
    layout = default_layout()
    cluster = LocalCluster(layout.bin_dir(build_inputs().pins), layout, report=lambda _: None,
                           controllers=True)
    cluster.start()
    logdir = Path(tempfile.mkdtemp(prefix="tessera-bench-placement-"))
    ops = LocalOperators(cluster.kubectl, cluster.kubeconfig, logdir).setup()
    ops.proxy = KernelService().start()  # type: ignore[assignment]
    try:
        ops.ensure_running()
        sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, ops, logdir).start()
        with ApiGPUNodes(str(cluster.kubeconfig), NODES):
            for r in range(ROUNDS):
                for label, scheduler in (("default kube-scheduler", "default-scheduler"),
                                         ("tessera-scheduler + extender", SCHEDULER_NAME)):
                    ns = f"bench-{r}-{'tessera' if scheduler == SCHEDULER_NAME else 'plain'}"
                    cluster.kubectl("create", "namespace", ns)
                    cluster.wait_for_service_account(ns)
                    got = phase(cluster, ns, scheduler)
                    print(f"{label:32s} {got['bound']:.0f}/{PODS} bound, "
                          f"{got['pods_per_s']:.1f} pods/s, p50 {got['p50_ms']:.0f} ms, "
                          f"p99 {got['p99_ms']:.0f} ms (creates took {got['create_s']:.1f}s)",
                          flush=True)
                    cluster.kubectl("delete", "namespace", ns, "--wait=false")
        sched.stop()
    finally:
        ops.stop_all()
        cluster.stop()


if __name__ == "__main__":
    main()
