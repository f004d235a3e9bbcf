"""Pod start through tessera's DRA driver vs its device plugin, on the test bed's real nodes:
one command, figures from one run.

    python bench/dra_start.py [--pods N] [--wave K]

A local cluster with two real nodes (kubelet, containerd, runc over simulated GPUs), the
operator (two replicas) and ``tessera-node`` on each node, as in the end-to-end tests; one
namespace under a GPUQuota. Two phases, one after the other, on node-0's H100:

* **device plugin** (the daemons' default): each pod asks ``tessera.dev/vgpu`` with 1 GiB
  and 1 % cores (the pod webhook writes its budget; the device plugin allocates a share and
  writes its budget file);
* **DRA** (the daemons with ``--dra true --device-plugin false``, the chart's DeviceClass):
  each pod names a ResourceClaimTemplate asking 1 GiB and 1 % of a ``gpu.tessera.dev``
  device (the claims webhooks fill and hold it against the quota; kube-controller-manager
  makes the claim, the scheduler allocates its capacity, tessera-node prepares it: budget
  file and CDI spec).

* **DRA, MIG on demand** (issue 32; after the DRA phase, same daemons): node-0's GPU in a
  GPUPartition with ``migMode: OnDemand``; each pod's claim asks a ``1g.10gb`` instance (by
  CEL on ``migProfile``), so tessera-node makes the instance at prepare (``nvidia-smi mig
  -cgi 1g.10gb:<start> -C``) and destroys it at unprepare. The daemon's own metrics give
  the part of it that is ``nvidia-smi`` (the simulator's: a real driver takes longer).

* **device plugin, declared instance vs MIG on demand** (a bed of its own with
  tessera-scheduler, the operator's placement extender): each pod asks
  ``tessera.dev/mig-1g.10gb``. First node-0's GPU is partitioned into seven declared
  ``1g.10gb`` instances (the baseline: a free instance waits for each pod); then the same
  GPU in ``migMode: OnDemand`` with ``--on-demand-idle 0``: the scheduler finds no free
  instance, the placement service asks one in the partition's ``status.demand``,
  tessera-node makes and advertises it, the kubelet raises the Node's allocatable (the
  test bed's kubelets post their status every 4 s when it changes), and the scheduler tries
  the pod again. Between waves the bench waits for node-0's instances to be gone, so every
  pod's instance is made for it.

Pods are made ``--wave`` at a time (the device plugin offers 10 shares per GPU, an H100 up
to seven 1g.10gb); each is timed from its create call returning to the API showing its
container running (polled every 20 ms with one list of the namespace's pods), and the wave
is deleted before the next. The same container, command and node in every phase: the
difference is the path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "e2e"), str(REPO / "sim"), str(REPO / "core"),
                str(REPO / "operator"), str(REPO / "node-daemon")]

from tessera.api.names import (  # noqa: E402
    ANNOTATION_GPUS,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    SCHEDULER_NAME,
)
from tessera.api.resources import mig_resource_name  # noqa: E402
from tessera.kube.client import Kube, load_credentials, path  # noqa: E402
from tessera_e2e.controlplane.build import ensure_built, ensure_containerd  # noqa: E402
from tessera_e2e.controlplane.cluster import LocalCluster  # noqa: E402
from tessera_e2e.gpubed.bed import Bed, claim_pod, gpu_bed, gpu_pod, vgpu  # noqa: E402
from tessera_e2e.operator.replicas import render_chart, wait_until  # noqa: E402
from tessera_e2e.operator.scheduler import TesseraScheduler  # noqa: E402

NS = "bench-dra"
NODE = "node-0"
TEMPLATE = "gpu-1gi"
ON_DEMAND_TEMPLATE = "mig-1g10gb"
ON_DEMAND = "bench-on-demand"
COMMAND = "sleep 3600"


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def template() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRA_DEVICE_CLASS,
                "capacity": {"requests": {"memory": "1Gi", "cores": "1"}}}}]}}}}


def on_demand_template() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": ON_DEMAND_TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": DRA_DEVICE_CLASS, "selectors": [{"cel": {"expression": (
                    f'device.attributes["{DRA_DRIVER}"].migProfile == "1g.10gb"')}}]}}]}}}}


def on_demand(bed: Bed[Any], layout: dict[str, Any]) -> None:
    """node-0's GPU in a partition with ``layout``, once node-0 reports it Ready."""
    out = bed.cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
        "metadata": {"name": ON_DEMAND},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}},
                 "layout": layout}}))
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    generation = bed.get("gpupartition", ON_DEMAND)["metadata"]["generation"]
    wait_until(f"{NODE} applying {layout}", lambda: (bed.get(
        "gpupartition", ON_DEMAND).get("status") or {}).get("nodes", {}).get(NODE, {}).get(
        "observedGeneration") == generation and bed.get("gpupartition", ON_DEMAND)[
        "status"]["nodes"][NODE].get("phase") == "Ready", 120)


def instances_on(bed: Bed[Any]) -> int:
    """MIG instances node-0's inventory shows."""
    inv = json.loads(bed.get("node", NODE)["metadata"]["annotations"][ANNOTATION_GPUS])
    return sum(len(g.get("instances") or []) for g in inv)


def running(pod: dict[str, Any]) -> bool:
    return any("running" in (c.get("state") or {})
               for c in (pod.get("status") or {}).get("containerStatuses") or [])


def body(kind: str, name: str) -> dict[str, Any]:
    if kind == "dp":
        return gpu_pod(name, COMMAND, vgpu(1024, cores=1), NODE)
    if kind in ("mig", "dpod"):  # placed by tessera-scheduler (the webhook names it)
        return gpu_pod(name, COMMAND, {mig_resource_name("1g.10gb"): "1"}, NODE)
    return claim_pod(name, COMMAND, node=NODE,
                     template=TEMPLATE if kind == "dra" else ON_DEMAND_TEMPLATE)


async def phase(bed: Bed[Any], kind: str, pods: int, wave: int) -> list[float]:
    """Seconds from each pod's create call to its container shown running."""
    kube = Kube(load_credentials(str(bed.cluster.kubeconfig)))
    url = path("", "v1", "pods", NS)
    out: list[float] = []
    try:
        for w in range(0, pods, wave):
            names = [f"{kind}-{i}" for i in range(w, min(pods, w + wave))]
            created: dict[str, float] = {}
            for name in names:
                await kube.create(url, body(kind, name))
                created[name] = time.monotonic()
            seen: dict[str, float] = {}
            deadline = time.monotonic() + 120
            while len(seen) < len(names):
                items = (await kube.list(url)).get("items") or []
                now = time.monotonic()
                for p in items:
                    n = p["metadata"]["name"]
                    if n in created and n not in seen:
                        if running(p):
                            seen[n] = now
                        elif (p.get("status") or {}).get("phase") == "Failed":
                            raise RuntimeError(f"pod {n} failed: {json.dumps(p['status'])}")
                if now > deadline:
                    raise RuntimeError(f"{kind}: pods not running after 120 s: "
                                       f"{sorted(set(names) - set(seen))}")
                await asyncio.sleep(0.02)
            out += [seen[n] - created[n] for n in names]
            for name in names:
                await kube.delete(f"{url}/{name}")
            deadline = time.monotonic() + 120
            while any(p["metadata"]["name"] in created
                      for p in (await kube.list(url)).get("items") or []):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{kind}: wave {w // wave} not gone after 120 s")
                await asyncio.sleep(0.2)
            if kind == "dpod":  # every pod of the next wave gets an instance made for it
                await asyncio.to_thread(wait_until, "node-0's instances destroyed",
                                        lambda: instances_on(bed) == 0, 120, 0.2)
    finally:
        await kube.close()
    return out


def setup_namespace(bed: Bed[Any]) -> None:
    out = bed.cluster.kubectl("create", "namespace", NS)
    if out.returncode != 0 and "AlreadyExists" not in out.stderr:
        raise RuntimeError(out.stderr)
    bed.cluster.wait_for_service_account(NS)
    bed.quota(NS)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--wave", type=int, default=5)
    args = ap.parse_args()
    ensure_containerd()
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(ensure_built(), nodes=2) as cluster:
        with gpu_bed(cluster, Path(tmp) / "dp") as bed:
            setup_namespace(bed)
            results["device plugin"] = asyncio.run(phase(bed, "dp", args.pods, args.wave))
        with gpu_bed(cluster, Path(tmp) / "dp-mig",
                     operator_args=("--scheduler-name", SCHEDULER_NAME),
                     daemon_args=("--on-demand-idle", "0")) as bed:
            assert bed.operators is not None
            sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, bed.operators,
                                     Path(tmp) / "dp-mig").start()
            try:
                on_demand(bed, {"migMode": "Enabled", "profiles": [
                    {"name": "1g.10gb", "count": 7}]})
                wait_until(f"{NODE} advertising 7 1g.10gb", lambda: bed.allocatable(NODE).get(
                    mig_resource_name("1g.10gb")) == "7", 60)
                results["DP declared 1g"] = asyncio.run(phase(bed, "mig", args.pods,
                                                              args.wave))
                on_demand(bed, {"migMode": "Disabled"})
                on_demand(bed, {"migMode": "OnDemand"})
                results["DP on demand"] = asyncio.run(phase(bed, "dpod", args.pods,
                                                            args.wave))
                dp_made = (bed.daemons[NODE].metric("tessera_node_mig_on_demand_seconds_sum")
                           or 0, bed.daemons[NODE].metric(
                               "tessera_node_mig_on_demand_seconds_count") or 0)
                on_demand(bed, {"migMode": "Disabled"})
                bed.cluster.kubectl("delete", "gpupartition", ON_DEMAND)
            finally:
                sched.stop()
        with gpu_bed(cluster, Path(tmp) / "dra",
                     daemon_args=("--dra", "true", "--device-plugin", "false")) as bed:
            text = render_chart(values={"nodeDaemon": {"dra": {"nodeLabels": {"pool": "dra"}}}})
            out = cluster.kubectl("apply", "-f", "-", input=text)
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            out = cluster.kubectl("apply", "-f", "-", input=json.dumps({  # as the chart's
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": DRA_DEVICE_CLASS},
                "spec": {"selectors": [{"cel": {"expression":
                                                f'device.driver == "{DRA_DRIVER}"'}}]}}))
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            wait_until(f"{NODE}'s ResourceSlice", lambda: [
                s for s in bed.get("resourceslices", "--field-selector",
                                   f"spec.nodeName={NODE}")["items"]
                if s["spec"]["driver"] == DRA_DRIVER and s["spec"].get("devices")], 60)
            bed.apply(NS, template())
            results["DRA"] = asyncio.run(phase(bed, "dra", args.pods, args.wave))
            on_demand(bed, {"migMode": "OnDemand"})
            wait_until(f"{NODE}'s placements", lambda: any(
                d["name"] == "gpu0-mig0-1g10gb" for s in bed.get(
                    "resourceslices", "--field-selector", f"spec.nodeName={NODE}")["items"]
                for d in s["spec"].get("devices") or []), 60)
            bed.apply(NS, on_demand_template())
            results["DRA on demand"] = asyncio.run(phase(bed, "od", args.pods, args.wave))
            daemon = bed.daemons[NODE]
            made = (daemon.metric("tessera_node_mig_on_demand_seconds_sum") or 0,
                    daemon.metric("tessera_node_mig_on_demand_seconds_count") or 0)
            smi = {c: (daemon.metric("tessera_node_nvidia_smi_seconds_sum", command=c) or 0,
                       daemon.metric("tessera_node_nvidia_smi_seconds_count", command=c) or 0)
                   for c in ("create-gi", "destroy-ci", "destroy-gi")}
            destroyed = daemon.metric("tessera_node_mig_on_demand_total", action="destroy",
                                      result="ok")
            on_demand(bed, {"migMode": "Disabled"})
            bed.cluster.kubectl("delete", "gpupartition", ON_DEMAND)
    print(f"pod created -> container running on {NODE} (an H100), {args.pods} pods per "
          f"path, {args.wave} at a time, one run:")
    base = statistics.median(results["device plugin"])
    for what, xs in results.items():
        ms = [1000 * x for x in xs]
        print(f"  {what:<16} p50 {statistics.median(ms):6.0f} ms  p99 {pct(ms, 99):6.0f} ms  "
              f"max {max(ms):6.0f} ms  (x{statistics.median(xs) / base:.2f} of the device "
              f"plugin's p50)")
    print(f"  device plugin on demand: {dp_made[1]:.0f} instances made, "
          f"{dp_made[0] / max(dp_made[1], 1) * 1000:.0f} ms each (asked to NVML showing it)")
    print(f"  on demand: {made[1]:.0f} instances made, {made[0] / max(made[1], 1) * 1000:.0f} ms "
          f"each from prepare asking to NVML showing it; {destroyed or 0:.0f} destroyed")
    for c, (total, n) in smi.items():
        print(f"    nvidia-smi {c}: {n:.0f} commands, {total / max(n, 1) * 1000:.0f} ms each "
              "(the simulator's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
