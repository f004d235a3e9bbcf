"""Live resize through the whole chain, on the test bed's real nodes: one command, figures
from one run.

    python bench/live_resize.py [--rounds N]

A local cluster with two real nodes (kubelet, containerd, runc over simulated GPUs), the
operator (two replicas) and ``tessera-node`` on each node, as in the end-to-end tests:
node-0's as a device plugin, node-1's as a DRA driver. Two pods launch kernels
(``cuda-spin``) the whole time: a device-plugin pod on node-0 (``tessera.dev/vgpu``) and a
DRA pod on node-1 (a claim from a ResourceClaimTemplate), each under the same GPUQuota, and
the same rounds run on each in turn. Each round writes a
``tessera.dev/budget-request`` on it (alternately 2048 MiB / 40 % cores and 1024 MiB / 30 %)
through the API, as ``tessera resize`` does, and measures, from the moment the API server
accepted the request:

1. the container's budget file rewritten on the node (polled every millisecond): from then
   on the container obeys the new memory budget at its next allocation (libtessera reads
   the file's generation on every call), and the core controller takes the new core budget
   as its target from its next period (the core split's convergence after a rewrite is
   ``bench/fairshare.py``'s "resize latency, node side");
2. ``Applied`` visible on the pod through the API (what ``tessera resize`` waits for).

A DRA claim's growth also withholds capacity: node-1 publishes its device with that much
less capacity and waits until the API server holds the slice, then lists the cluster's
claims, before it rewrites the file (docs/dra.md, "Live resize of a claim's budget").

Baseline, same run: the API round trip of an annotation write of the same size on the same
pod (a write nothing acts on), so the figures can be read as so many round trips.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "e2e"), str(REPO / "sim"), str(REPO / "core"),
                str(REPO / "operator"),
                str(REPO / "node-daemon")]

from tessera.api.names import (  # noqa: E402
    ANNOTATION_BUDGET_REQUEST,
    ANNOTATION_BUDGET_RESIZE,
    BUDGETED_CLAIMS,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    LABEL_BUDGETED,
)
from tessera.api.resize import ResizeStatus, digest  # noqa: E402
from tessera.kube.client import Kube, load_credentials, path  # noqa: E402
from tessera_e2e.controlplane.build import ensure_built, ensure_containerd  # noqa: E402
from tessera_e2e.controlplane.cluster import LocalCluster  # noqa: E402
from tessera_e2e.gpubed.bed import Bed, claim_pod, gpu_bed, gpu_pod, vgpu  # noqa: E402
from tessera_e2e.operator.replicas import render_chart, wait_until  # noqa: E402
from tessera_node.budget.formats import read_budget_file  # noqa: E402

NS = "bench-resize"
POD = "spinner"
DRA_POD = "dra-spinner"
DRA_NODE = "node-1"
SIZES = (("2048Mi", 40), ("1024Mi", 30))


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def budget_now(bed: Bed, node: str, files_dir: str) -> tuple[int | None, float | None] | None:
    """(memory, cores) of the node's one ready budget file (under ``files_dir``: a
    container's, or a claim's), or None while it is being rewritten (a torn read: the
    generation is odd or moved under the reader)."""
    files = list(bed.daemons[node].state_dir.glob(f"{files_dir}/*/budget"))
    try:
        budgets = [read_budget_file(f) for f in files]
    except (OSError, ValueError):
        return None
    ready = [b for b in budgets if b.state == "ready"]
    if len(ready) != 1:
        raise RuntimeError(f"expected one ready budget file on {node}, found {len(ready)}")
    e = ready[0].entries[0]
    return e.memory, e.cores


def watch_file(bed: Bed, node: str, files_dir: str, want: tuple[int, float],
               out: list[float], stop: threading.Event) -> None:
    """The monotonic time the budget file first holds ``want`` (memory, cores). The core
    controller rewrites the file's rate ten times a second, so the generation alone says
    nothing about a resize."""
    try:
        while not stop.is_set():
            if budget_now(bed, node, files_dir) == want:
                out.append(time.monotonic())
                return
            time.sleep(0.001)
    except Exception as exc:  # the round reports a file that never changed
        print(f"watching the budget file: {exc}", file=sys.stderr)


async def rounds(bed: Bed, n: int, pod_name: str, node: str, files_dir: str
                 ) -> dict[str, list[float]]:
    kube = Kube(load_credentials(str(bed.cluster.kubeconfig)))
    url = path("", "v1", "pods", NS, pod_name)
    to_file: list[float] = []
    to_applied: list[float] = []
    baseline: list[float] = []
    try:
        for i in range(n):
            memory, cores = SIZES[i % 2]
            text = json.dumps({"main": {"memory": memory, "cores": cores}, "@id": str(i)})
            # baseline: the same size of write on the same pod, which nothing acts on
            t0 = time.monotonic()
            await kube.merge_patch(url, {"metadata": {"annotations": {"bench/noop": text}}})
            baseline.append(time.monotonic() - t0)
            seen: list[float] = []
            stop = threading.Event()
            want = (int(memory.removesuffix("Mi")) << 20, float(cores))
            watcher = threading.Thread(target=watch_file,
                                       args=(bed, node, files_dir, want, seen, stop))
            watcher.start()
            t0 = time.monotonic()
            await kube.merge_patch(url, {"metadata": {"annotations": {
                ANNOTATION_BUDGET_REQUEST: text}}})
            accepted = time.monotonic()
            while True:
                pod = await kube.get(url)
                status = ResizeStatus.parse(
                    (pod["metadata"].get("annotations") or {}).get(ANNOTATION_BUDGET_RESIZE))
                if status is not None and status.request == digest(text) and \
                        status.state != "Approved":
                    break
                if time.monotonic() - t0 > 30:
                    raise RuntimeError("no outcome in 30 s")
                await asyncio.sleep(0.005)
            applied = time.monotonic()
            if status.state != "Applied":
                raise RuntimeError(f"round {i}: {status.state}: {status.reason}")
            watcher.join(10)
            stop.set()
            if not seen:
                raise RuntimeError(f"round {i}: Applied but the budget file never changed")
            to_file.append(seen[0] - accepted)
            to_applied.append(applied - accepted)
            await asyncio.sleep(0.2)
    finally:
        await kube.close()
    return {"file": to_file, "applied": to_applied, "baseline": baseline}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=40)
    args = ap.parse_args()
    ensure_containerd()
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(ensure_built(), nodes=2) as cluster, \
            gpu_bed(cluster, Path(tmp), node_args={
                DRA_NODE: ("--dra", "true", "--device-plugin", "false")}) as bed:
        # the chart's permissions for a DRA pool (the node's ResourceSlices), its DeviceClass
        out = cluster.kubectl("apply", "-f", "-", input=render_chart(values={"nodeDaemon": {
            "dra": {"nodeLabels": {"kubernetes.io/hostname": DRA_NODE}}}}))
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        out = cluster.kubectl("apply", "-f", "-", input=json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": DRA_DEVICE_CLASS},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]}}))
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        out = cluster.kubectl("create", "namespace", NS)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        cluster.wait_for_service_account(NS)
        bed.quota(NS)
        bed.apply(NS, gpu_pod(POD, "cuda-spin 0 1000 1", vgpu(1024, cores=30)))
        bed.apply(NS, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                       "metadata": {"name": "share"},
                       "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                           "deviceClassName": DRA_DEVICE_CLASS, "capacity": {"requests": {
                               "memory": "1024Mi", "cores": "30"}}}}]}}}})
        bed.apply(NS, claim_pod(DRA_POD, "cuda-spin 0 1000 2", template="share", node=DRA_NODE))
        for name, node in ((POD, "node-0"), (DRA_POD, DRA_NODE)):
            bed.wait_phase(NS, name, {"Running"}, 120)
            wait_until(f"{name} under a core controller",
                       lambda n=name, at=node: n in bed.core_busy(at, NS), 60, 0.5)
        wait_until("the DRA pod labelled by the operator", lambda: bed.pod(NS, DRA_POD)[
            "metadata"].get("labels", {}).get(LABEL_BUDGETED) == BUDGETED_CLAIMS, 30, 0.5)
        got = {"device plugin": asyncio.run(rounds(bed, args.rounds, POD, "node-0",
                                                   "containers")),
               "DRA claim": asyncio.run(rounds(bed, args.rounds, DRA_POD, DRA_NODE, "claims"))}
    print(f"live resize through the chain, {args.rounds} requests per path (grow and shrink "
          f"alternating), from the API server accepting the request:")
    for path_name, figures in got.items():
        ms = {k: [1000 * x for x in v] for k, v in figures.items()}
        print(f" {path_name}:")
        for key, what in (("file", "budget file rewritten on the node (memory obeyed from "
                                   "the next call)"),
                          ("applied", "Applied visible on the pod (what `tessera resize` "
                                      "waits for)"),
                          ("baseline", "baseline, same run: one annotation write's round "
                                       "trip")):
            v = ms[key]
            print(f"  {what}: p50 {statistics.median(v):.0f} ms, p99 {pct(v, 99):.0f} ms, "
                  f"max {max(v):.0f} ms")
        base = statistics.median(ms["baseline"])
        print(f"  request -> file: {statistics.median(ms['file']) / base:.1f} round trips "
              f"(p50)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
