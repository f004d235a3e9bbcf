"""The chain users buy tessera for, on two real nodes (node-0: one H100-80GB, node-1: one
A100-40GB, both simulated) with tessera installed as users install it, by ``helm install`` of
charts/tessera (the operator Deployment and the ``tessera-node`` DaemonSet, from the images
the test bed builds; the ``chart_bed`` fixture): a GPUPartition enacted and Ready, a
GPUQuota'd namespace running a Job of GPU pods under their budgets, the quota's usage
following the pods, the node's components (kubelet, the daemon's pod) restarting under
running pods, and a layout change that waits for the pod holding an instance.

What one part alone does (the plugin's advertising, a pending budget, overcommit, the audit)
is tested in test_device_plugin.py; here the parts run together."""

from __future__ import annotations

from typing import Any

import pytest

from tessera.api.names import API_VERSION, VGPU, VGPU_CORES
from tessera.api.resources import mig_resource_name
from tessera.mig.catalog import profile
from tessera_e2e.chart.bed import ChartDaemon
from tessera_e2e.gpubed.bed import SHARES, Bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until
from tessera_node.budget.formats import read_budget_file as read_budget

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

MIG_1G = mig_resource_name("1g.10gb")
GO = "/tmp/go"
WAIT_FOR_GO = f"while [ ! -e {GO} ]; do sleep 0.5; done"
"""Pods that must outlive a step wait for the test to say go (``kubectl exec``)."""


@pytest.fixture(scope="module")
def bed(chart_bed: Bed[ChartDaemon]) -> Bed[ChartDaemon]:
    """tessera as `helm install` of charts/tessera put it on this module's two nodes."""
    return chart_bed


def go(bed: Bed, namespace: str, pod: str) -> None:
    out = bed.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c", f": > {GO}")
    assert out.returncode == 0, out.stderr


def gpu_line(logs: str) -> list[str]:
    """cuda-info's line for device 0: ``0 <name...> <uuid> <total MiB> <free MiB>``."""
    return next(line for line in logs.splitlines() if line.startswith("0 ")).split()


def quota_used(bed: Bed, namespace: str) -> dict[str, Any]:
    used: dict[str, Any] = (bed.get("gpuquota", "-n", namespace, "team").get("status")
                            or {}).get("used") or {}
    return used


def gq_row(bed: Bed, namespace: str) -> list[str]:
    """`kubectl get gq`'s row: NAME CORES MEMORY PODS READY AGE ([] until all are set)."""
    out = bed.kubectl("get", "gq", "-n", namespace, "--no-headers")
    assert out.returncode == 0, out.stderr
    row = list(out.stdout.split())
    return row if len(row) == 6 else []


def budgets_in_force(bed: Bed, namespace: str, pods: list[str], when: str) -> None:
    """A new process in each running pod sees its 1 GiB budget and is refused past it."""
    for name in pods:
        # right after a kubelet restart, exec fails until the kubelet knows its pods again
        out = wait_until(f"exec in {name} {when}", lambda name=name: (
            o if (o := bed.kubectl("exec", "-n", namespace, name, "--", "sh", "-c",
                                   "cuda-info; cuda-alloc 1025; echo exit $?")).returncode == 0
            else None), 60, 1)
        files = {p.parent.name: read_budget(p).state for p in
                 bed.daemons["node-1"].state_dir.glob("containers/*/budget")}
        lines = out.stdout.splitlines()
        assert gpu_line(out.stdout)[-2:] == ["1024", "1024"], (when, out.stdout, files)
        assert "exit 1" in lines and "allocated 1025" not in lines, (when, out.stdout)


def job(name: str, pods: int, command: str, limits: dict[str, str], node: str
        ) -> dict[str, Any]:
    template = gpu_pod(name, command, limits, node=node)
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"parallelism": pods, "completions": pods, "backoffLimit": 0,
                     "template": {"spec": template["spec"]}}}


def test_a_job_under_a_quota_runs_under_budgets_through_restarts(
    bed: Bed, chart_namespace: str
) -> None:
    """Three Job pods of 1 GiB each on node-1: each sees its budget (CUDA and NVML), is
    refused one MiB past it, and the quota counts them; the kubelet and then tessera-node
    restart while they run: their budgets stay in force and a new pod still schedules; the
    Job completes and the quota's usage goes back down."""
    bed.cluster.wait_for_service_account(chart_namespace)
    bed.quota(chart_namespace, {"memory": "8Gi", "cores": 400, "pods": 5},
              {"memory": "4Gi", "cores": 100})
    wait_until("the quota counting nothing yet", lambda: gq_row(bed, chart_namespace)[1:4]
               == ["0/400", "0/8Gi", "0/5"], 30)
    command = (f"nvml-info && cuda-info && cuda-alloc 1000; cuda-alloc 1025; "
               f"echo past-budget-exit $?; {WAIT_FOR_GO}; cuda-alloc 1025; "
               f"echo after-restarts-exit $?")
    bed.apply(chart_namespace, job("chain", 3, command, vgpu(1024, cores=30), "node-1"))

    def running() -> list[dict[str, Any]] | None:
        pods: list[dict[str, Any]] = bed.get("pods", "-n", chart_namespace, "-l",
                                             "job-name=chain")["items"]
        up = [p for p in pods if p["status"].get("phase") == "Running"]
        return up if len(up) == 3 else None

    pods = wait_until("the Job's 3 pods running", running, 120, 1)
    names = sorted(p["metadata"]["name"] for p in pods)
    assert {p["spec"]["nodeName"] for p in pods} == {"node-1"}
    for name in names:
        logs = wait_until(f"{name} past its budget", lambda name=name: (
            out if "past-budget-exit" in (out := bed.logs(chart_namespace, name)) else None), 60)
        lines = logs.splitlines()
        assert gpu_line(logs)[-2:] == ["1024", "1024"], logs  # cuMemGetInfo: the budget
        nvml = next(line for line in lines if line.startswith("0, ")).split(", ")
        assert nvml[-3:] == ["1024", "0", "1024"], logs  # what nvidia-smi shows
        assert "allocated 1000" in lines, logs
        assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in lines, logs
        assert "past-budget-exit 1" in lines and "allocated 1025" not in lines, logs

    used = quota_used(bed, chart_namespace)
    assert used["pods"] == 3 and used["cores"] == 90, used
    assert gq_row(bed, chart_namespace)[1:4] == ["90/400", "3Gi/8Gi", "3/5"]

    # the kubelet restarts under the running pods: the plugin registers again, the running
    # containers keep their budgets
    bed.restart_kubelet("node-1")
    budgets_in_force(bed, chart_namespace, names, "after the kubelet restarted")
    # then tessera-node restarts (its pod deleted, the DaemonSet makes a new one): still in
    # force
    bed.restart_daemon("node-1")
    budgets_in_force(bed, chart_namespace, names, "after tessera-node restarted")
    # a new pod still schedules and runs under its own budget
    bed.apply(chart_namespace, gpu_pod("after", "cuda-info", vgpu(2048, cores=10),
                                      node="node-1"))
    done = bed.wait_phase(chart_namespace, "after", {"Succeeded", "Failed"})
    logs = bed.logs(chart_namespace, "after")
    assert done["status"]["phase"] == "Succeeded", logs
    assert gpu_line(logs)[-2:] == ["2048", "2048"], logs

    for name in names:
        go(bed, chart_namespace, name)
    def complete() -> dict[str, Any] | None:
        j: dict[str, Any] = bed.get("job", "-n", chart_namespace, "chain")
        conditions = j["status"].get("conditions", [])
        return j if any(c["type"] == "Complete" and c["status"] == "True"
                        for c in conditions) else None

    finished = wait_until("the Job complete", complete, 90, 1)
    assert finished["status"]["succeeded"] == 3, finished["status"]
    for name in names:
        lines = bed.logs(chart_namespace, name).splitlines()
        assert "after-restarts-exit 1" in lines and "allocated 1025" not in lines, lines
    wait_until("the quota's usage back to zero", lambda: quota_used(
        bed, chart_namespace).get("pods") == 0, 60, 1)
    assert gq_row(bed, chart_namespace)[1:4] == ["0/400", "0/8Gi", "0/5"]


def partition(layout: list[dict[str, Any]], sharing: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUPartition",
            "metadata": {"name": "chain-mig"},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-0"}},
                     "layout": {"profiles": layout}, "sharing": sharing,
                     "deletionPolicy": "Reset"}}


def gpart_ready(bed: Bed, layout: str) -> list[str] | None:
    out = bed.kubectl("get", "gpart", "chain-mig", "--no-headers")
    row = out.stdout.split() if out.returncode == 0 else []
    # NAME SELECTED READY LAYOUT AGE
    return row if row[1:4] == ["1", "1", layout] else None


def test_a_partition_then_a_layout_change_that_waits_for_the_pod_on_an_instance(
    bed: Bed, chart_namespace: str
) -> None:
    """node-0 is partitioned into seven whole 1g.10gb instances (Ready, the layout in
    `kubectl get gpart`); a pod holds one; the layout is changed to one shared 3g.40gb
    instance: the node waits for the pod (WaitingForIdle names it) and completes the change
    when the pod ends; two budgeted pods then share that one instance."""
    bed.cluster.wait_for_service_account(chart_namespace)
    bed.quota(chart_namespace)
    bed.apply("default", partition([{"name": "1g.10gb", "count": 7}], "Whole"))
    try:
        wait_until("the partition Ready", lambda: gpart_ready(bed, "7x1g.10gb"), 180, 1)
        wait_until("node-0 advertising 7 instances", lambda: bed.allocatable(
            "node-0").get(MIG_1G) == "7", 60, 1)
        bed.apply(chart_namespace, gpu_pod("holder", f"cuda-info; {WAIT_FOR_GO}",
                                          {MIG_1G: "1"}))
        bed.wait_phase(chart_namespace, "holder", {"Running"})
        logs = wait_until("holder's output", lambda: bed.logs(chart_namespace, "holder"), 30)
        line = gpu_line(logs)
        assert "MIG 1g.10gb" in " ".join(line), logs
        assert int(line[-2]) == profile("H100-80GB", "1g.10gb").memory_mib, logs

        bed.apply("default", partition([{"name": "3g.40gb", "count": 1}], "Shares"))
        holder = f"pod {chart_namespace}/holder"

        def waiting() -> dict[str, Any] | None:
            node = (bed.get("gpupartition", "chain-mig").get("status") or {}).get(
                "nodes", {}).get("node-0", {})
            return node if node.get("phase") == "WaitingForIdle" else None

        first = wait_until("node-0 WaitingForIdle", waiting, 120, 1)
        # A whole instance's container starts without waiting for the daemon to confirm its
        # allocation through PodResources: the first report may say "a container allocated,
        # its pod not confirmed yet"; the next pass (the poll interval) names the pod.
        report = wait_until(f"node-0's WaitingForIdle naming {holder}", lambda: (
            r if (r := waiting()) and holder in r.get("message", "") else None), 30, 1)
        assert holder in first["message"] or "not confirmed yet" in first["message"], first
        assert report.get("reason") == "InUse", report
        lgi = bed.daemons["node-0"].smi("mig", "-lgi")
        assert lgi.stdout.count("MIG 1g.10gb") == 7, lgi.stdout  # nothing was torn down
        go(bed, chart_namespace, "holder")
        done = bed.wait_phase(chart_namespace, "holder", {"Succeeded", "Failed"})
        assert done["status"]["phase"] == "Succeeded", bed.logs(chart_namespace, "holder")
        wait_until("the new layout Ready", lambda: gpart_ready(bed, "1x3g.40gb"), 180, 1)
        alloc = wait_until("node-0 advertising shares of one instance", lambda: (
            a if (a := bed.allocatable("node-0")).get(VGPU) == str(SHARES)
            and a.get(MIG_1G) == "0" else None), 60, 1)
        assert alloc[VGPU_CORES] == "100", alloc

        for name, mib in (("pair-a", 4096), ("pair-b", 8192)):
            bed.apply(chart_namespace, gpu_pod(
                name, f"cuda-info && cuda-alloc {mib - 24} && cuda-alloc {mib + 1}", vgpu(mib)))
        seen = {}
        for name, mib in (("pair-a", 4096), ("pair-b", 8192)):
            done = bed.wait_phase(chart_namespace, name, {"Succeeded", "Failed"})
            logs = bed.logs(chart_namespace, name)
            assert done["status"]["phase"] == "Failed", logs  # refused past its budget
            line = gpu_line(logs)
            assert "MIG 3g.40gb" in " ".join(line) and line[-2:] == [str(mib)] * 2, logs
            assert f"allocated {mib - 24}" in logs.splitlines(), logs
            assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in logs, logs
            seen[name] = line[-3]
        assert seen["pair-a"] == seen["pair-b"], seen  # one instance, two budgets
    finally:
        bed.kubectl("delete", "gpupartition", "chain-mig", "--wait=false")
    bed.wait_partition_removed("chain-mig")

