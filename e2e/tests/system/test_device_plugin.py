"""tessera's device plugin on the real kubelet: budgeted pods run on the test bed's nodes.

tessera-node runs on each real node as a DaemonSet pod would (the node's namespaces, the
kubelet's sockets and /var/lib/tessera at their standard places, the node's simulated GPUs
as its driver); the operator runs too, so GPUQuota admission writes each pod's
``tessera.dev/budget``. Pods run the workload image's CUDA programs over the simulated
libcuda, with libtessera loaded by the ``ld.so.preload`` Allocate mounts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from tessera.api.names import API_VERSION, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.api.resources import mig_resource_name
from tessera.mig.catalog import profile
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import BUDGET_WAIT_S, SHARES, Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until
from tessera_node.budget.formats import read_budget_file as read_budget

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

MIG_1G = mig_resource_name("1g.10gb")
MIB = 1 << 20
SMI_MEMORY = "--query-gpu=memory.total,memory.used,memory.free --format=csv,noheader,nounits"


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed]:
    with gpu_bed(node_cluster, tmp_path_factory.mktemp("tessera-nodes")) as b:
        yield b


def test_the_plugin_registers_and_the_nodes_advertise_shares_and_capacity(bed: Bed) -> None:
    for node, d in bed.daemons.items():  # node-0: one H100-80GB, node-1: one A100-40GB
        alloc = wait_until(f"{node} advertising {VGPU}", lambda node=node: (
            a if (a := bed.allocatable(node)).get(VGPU) == str(SHARES) else None), 60)
        # vgpu-memory is the GPU's memory as NVML (and so nvidia-smi) reports it
        smi = d.smi("--query-gpu=memory.total", "--format=csv,noheader,nounits")
        assert smi.returncode == 0, smi.stderr
        assert alloc[VGPU_MEMORY] == smi.stdout.strip(), (alloc, smi.stdout)
        assert alloc[VGPU_CORES] == "100", alloc
        assert (d.plugin_dir / "tessera-vgpu.sock").is_socket()
        status, body = d.get("/readyz")
        assert status == 200, body


def test_a_vgpu_pod_runs_under_its_budget_and_is_refused_past_it(
    bed: Bed, node_namespace: str
) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    bed.apply(node_namespace, gpu_pod(
        "budgeted", f"nvidia-smi && nvidia-smi {SMI_MEMORY} && nvml-info && cuda-info && "
        "cuda-alloc 1000 && cuda-alloc 1100", vgpu(1024)))
    done = bed.wait_phase(node_namespace, "budgeted", {"Succeeded", "Failed"})
    logs = bed.logs(node_namespace, "budgeted")
    assert done["status"]["phase"] == "Failed", logs
    state = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 1, (state, logs)
    print(f"\n[figures] one vgpu pod: create->container start "
          f"{_seconds(state['startedAt']) - _seconds(done['metadata']['creationTimestamp']):.0f}s")
    lines = logs.splitlines()
    # cuMemGetInfo inside shows the budget: 1024 MiB in total, all of it free
    gpu_line = next(line for line in lines if line.startswith("0 "))
    assert gpu_line.split()[-2:] == ["1024", "1024"], logs
    assert "devices 1" in lines and "allocated 1000" in lines and "freed" in lines, logs
    # NVML's memory info (what nvidia-smi shows) too: index, name, uuid, total, used, free
    nvml = next(line for line in lines if line.startswith("0, ")).split(", ")
    assert nvml[-3:] == ["1024", "0", "1024"] and nvml[2] == gpu_line.split()[-3], logs
    assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in lines, logs
    assert "allocated 1100" not in lines, logs
    # the image's nvidia-smi (the simulator's, over the mounted libnvidia-ml.so.1 that
    # libtessera wraps) shows the budget as the GPU's memory, as HAMi's does
    assert "1024, 0, 1024" in lines, logs  # --query-gpu=memory.total,memory.used,memory.free
    table = [line for line in lines if line.startswith("|") and "MiB /" in line]
    assert len(table) == 1 and "0MiB / 1024MiB" in table[0], logs
    assert "NVIDIA-SMI" in logs and "Processes:" in logs, logs


def partition(sharing: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUPartition",
            "metadata": {"name": "node0-mig"},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-0"}},
                     "layout": {"profiles": [{"name": "1g.10gb", "count": 7}]},
                     "sharing": sharing, "deletionPolicy": "Reset"}}


def test_mig_instances_whole_then_shared_then_mig_disabled_again(
    bed: Bed, node_namespace: str
) -> None:
    """A partition's layout and its sharing change what node-0 advertises: seven whole
    1g.10gb instances, then 70 vgpu shares over them, then the whole GPU again. A pod of
    each kind runs and is refused past its instance or budget."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    bed.apply("default", partition("Whole"))
    try:
        alloc = wait_until("node-0 advertising 7 whole 1g.10gb instances", lambda: (
            a if (a := bed.allocatable("node-0")).get(MIG_1G) == "7"
            and a.get(VGPU) == "0" else None), 180, 1)
        assert alloc[VGPU_MEMORY] == "0" and alloc[VGPU_CORES] == "0", alloc
        bed.apply(node_namespace, gpu_pod(
            "whole", "cuda-info && cuda-alloc 9000 && cuda-alloc 12000", {MIG_1G: "1"}))
        done = bed.wait_phase(node_namespace, "whole", {"Succeeded", "Failed"})
        logs = bed.logs(node_namespace, "whole")
        assert done["status"]["phase"] == "Failed", logs
        lines = logs.splitlines()
        gpu_line = next(line for line in lines if line.startswith("0 "))
        total = int(gpu_line.split()[-2])
        # one instance: its memory as the model table (and nvidia-smi) says
        assert total == profile("H100-80GB", "1g.10gb").memory_mib, logs
        assert "MIG 1g.10gb" in gpu_line, logs
        assert "devices 1" in lines and "allocated 9000" in lines, logs
        assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in lines, logs

        bed.apply("default", partition("Shares"))
        alloc = wait_until("node-0 advertising 70 shares over its instances", lambda: (
            a if (a := bed.allocatable("node-0")).get(VGPU) == str(7 * SHARES)
            and a.get(MIG_1G) == "0" else None), 60, 1)
        assert alloc[VGPU_MEMORY] == str(7 * total) and alloc[VGPU_CORES] == "700", alloc
        bed.apply(node_namespace, gpu_pod(
            "shared", "cuda-info && cuda-alloc 2000 && cuda-alloc 2100", vgpu(2048)))
        done = bed.wait_phase(node_namespace, "shared", {"Succeeded", "Failed"})
        logs = bed.logs(node_namespace, "shared")
        lines = logs.splitlines()
        gpu_line = next(line for line in lines if line.startswith("0 "))
        assert gpu_line.split()[-2:] == ["2048", "2048"] and "MIG 1g.10gb" in gpu_line, logs
        assert "allocated 2000" in lines and "allocated 2100" not in lines, logs
        assert "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in lines, logs
        bed.kubectl("delete", "pod", "-n", node_namespace, "shared")
        burst_each_alone_on_an_instance(bed, node_namespace, total)
        overcommit_is_refused_with_an_event(bed, node_namespace)
    finally:
        bed.kubectl("delete", "gpupartition", "node0-mig", "--wait=false")
    bed.wait_partition_removed("node0-mig")


BURST_REPETITIONS = 10


def burst_each_alone_on_an_instance(bed: Bed, namespace: str, instance_mib: int) -> None:
    """Issue 34's burst, without any scheduler extender: pods of 6000 MiB created at once
    (one ``kubectl apply``) onto node-0's seven shared 1g.10gb instances (one H100 on the
    test bed), one pod per instance, so the kubelet must use every instance: every pod runs
    under its budget, each alone on its instance, none refused; ten times over."""
    n = 7
    times = []
    for rep in range(BURST_REPETITIONS):
        names = [f"burst-{rep}-{i}" for i in range(n)]
        started = time.time()
        out = bed.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [
                gpu_pod(m, "cuda-info && cuda-alloc 5000 && sleep 3600", vgpu(6000))
                for m in names]}))
        assert out.returncode == 0, out.stderr

        def all_allocated(names: list[str] = names) -> dict[str, str] | None:
            items = {p["metadata"]["name"]: p["status"] for p in json.loads(bed.kubectl(
                "get", "pods", "-n", namespace, "-o", "json").stdout)["items"]}
            ended = {m: items[m] for m in names
                     if items.get(m, {}).get("phase") in ("Succeeded", "Failed")}
            assert not ended, {m: (st, bed.logs(namespace, m)) for m, st in ended.items()}
            if any(items.get(m, {}).get("phase") != "Running" for m in names):
                return None
            logs = {m: bed.logs(namespace, m) for m in names}
            return logs if all("allocated 5000" in x for x in logs.values()) else None

        logs = wait_until(f"repetition {rep}: {n} pods allocated", all_allocated, 180, 1)
        times.append(time.time() - started)
        seen = {}
        for m, text in logs.items():
            gpu = next(x for x in text.splitlines() if x.startswith("0 ")).split()
            assert gpu[-2:] == ["6000", "6000"] and "MIG 1g.10gb" in text, (m, text)
            seen[m] = gpu[-3]
        assert len(set(seen.values())) == n, seen  # each alone on its instance
        refused = bed.kubectl("get", "events", "-n", namespace, "-o", "json",
                              "--field-selector", "reason=GPUBudgetRefused")
        assert json.loads(refused.stdout)["items"] == [], refused.stdout
        bed.kubectl("delete", "pod", "-n", namespace, *names)
    print(f"\n[figures] {n} pods of 6000 MiB at once onto {n} shared 1g.10gb instances of "
          f"{instance_mib} MiB, {BURST_REPETITIONS} repetitions: all running, each alone, "
          f"none refused; apply -> all allocated "
          f"{', '.join(f'{t:.1f}' for t in times)} s")


def overcommit_is_refused_with_an_event(bed: Bed, namespace: str) -> None:
    """Two pods of 6000 MiB each admitted onto one ~10 GiB instance while the daemon cannot
    confirm them yet: once it can, one gets its budget, the other a refused budget file (no
    GPU memory, the reason on stderr) and an Event saying why. The daemon counts its own
    allocations not confirmed yet, so it would offer the second pod another instance; a
    daemon restarted between the two has lost them (the first's budget is not known until
    it is confirmed), offers the second the same instance, and both Allocates fit what is
    confirmed. The scheduler cannot see this: the node has room for both."""
    d = bed.daemons["node-0"]
    d.podres.held.set()
    try:
        # their first GPU call after the daemon can confirm (within --budget-wait of it)
        bed.apply(namespace, gpu_pod("first", "sleep 45; cuda-alloc 5000", vgpu(6000)))
        bed.wait_phase(namespace, "first", {"Running", "Succeeded", "Failed"})
        bed.restart_daemon("node-0")
        bed.apply(namespace, gpu_pod("second", "sleep 15; cuda-alloc 5000", vgpu(6000)))
        bed.wait_phase(namespace, "second", {"Running", "Succeeded", "Failed"})
    finally:
        d.podres.held.clear()
    outcome = {}
    for name in ("first", "second"):
        done = bed.wait_phase(namespace, name, {"Succeeded", "Failed"})
        outcome[name] = (done["status"]["phase"], bed.logs(namespace, name))
    phases = sorted(p for p, _ in outcome.values())
    assert phases == ["Failed", "Succeeded"], outcome
    refused = next(n for n, (p, _) in outcome.items() if p == "Failed")
    logs = outcome[refused][1]
    assert "would exceed" in logs and "CUDA_ERROR_OUT_OF_MEMORY" in logs, logs
    events = wait_until("the refused pod's Event", lambda: json.loads(bed.kubectl(
        "get", "events", "-n", namespace, "-o", "json", "--field-selector",
        f"involvedObject.name={refused},reason=GPUBudgetRefused").stdout)["items"], 30)
    assert "would exceed" in events[0]["message"], events
    assert events[0]["type"] == "Warning" and events[0]["source"]["component"] == \
        "tessera-node", events


def test_a_pending_budget_waits_for_a_slow_daemon_then_refuses(
    bed: Bed, node_namespace: str
) -> None:
    """While the daemon cannot tell which pod an allocation is for (its PodResources calls
    fail), the container's budget file is pending: libtessera's first GPU call waits for
    it, a bounded time. Confirmed within the wait: the program runs under its budget.
    Not: GPU memory is refused with one clear line."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    d = bed.daemons["node-1"]
    d.podres.held.set()
    try:
        bed.apply(node_namespace, gpu_pod("impatient", "cuda-alloc 100", vgpu(1024),
                                          node="node-1"))
        done = bed.wait_phase(node_namespace, "impatient", {"Succeeded", "Failed"})
    finally:
        d.podres.held.clear()
    logs = bed.logs(node_namespace, "impatient")
    assert done["status"]["phase"] == "Failed", logs
    assert f"budget not ready after {BUDGET_WAIT_S * 1000} ms" in logs, logs
    assert "CUDA_ERROR_OUT_OF_MEMORY" in logs, logs

    d.podres.held.set()
    try:
        bed.apply(node_namespace, gpu_pod(
            "patient", "t=$(date +%s); cuda-alloc 100 && echo waited $(($(date +%s) - t))",
            vgpu(1024), node="node-1"))
        bed.wait_phase(node_namespace, "patient", {"Running", "Succeeded", "Failed"})
        pending = [read_budget(p).state for p in d.state_dir.glob("containers/*/budget")]
        assert "pending" in pending, pending
        time.sleep(3)
    finally:
        d.podres.held.clear()
    done = bed.wait_phase(node_namespace, "patient", {"Succeeded", "Failed"})
    logs = bed.logs(node_namespace, "patient")
    assert done["status"]["phase"] == "Succeeded", logs
    lines = logs.splitlines()
    assert "allocated 100" in lines, logs
    waited = int(next(line for line in lines if line.startswith("waited")).split()[1])
    assert 2 <= waited <= BUDGET_WAIT_S, logs


def test_a_pod_setting_nvidia_visible_devices_itself_gets_nothing_more(
    bed: Bed, node_namespace: str
) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    every = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "all"}
    bed.apply(node_namespace, gpu_pod("sneaky", "cuda-info", {}, env=every))
    bed.apply(node_namespace, gpu_pod("budgeted-sneaky", "cuda-info", vgpu(1024), env=every))
    sneaky = bed.wait_phase(node_namespace, "sneaky", {"Succeeded", "Failed"})
    logs = bed.logs(node_namespace, "sneaky")
    assert sneaky["status"]["phase"] == "Failed" and "libcuda.so.1" in logs, logs
    budgeted = bed.wait_phase(node_namespace, "budgeted-sneaky", {"Succeeded", "Failed"})
    logs = bed.logs(node_namespace, "budgeted-sneaky")
    assert budgeted["status"]["phase"] == "Succeeded", logs
    lines = logs.splitlines()
    assert "devices 1" in lines, logs
    assert next(x for x in lines if x.startswith("0 ")).split()[-2:] == ["1024", "1024"], logs


def test_kubelet_restart_re_registration_running_pods_keep_budgets(
    bed: Bed, node_namespace: str
) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    bed.apply(node_namespace, gpu_pod("keeper", "cuda-info; exec sleep 3600", vgpu(2048),
                                      node="node-1"))
    bed.wait_phase(node_namespace, "keeper", {"Running"})
    before = wait_until("keeper's output", lambda: bed.logs(node_namespace, "keeper"), 30)
    assert " 2048 2048" in before, before
    bed.restart_kubelet("node-1")

    def exec_info() -> str:
        out = bed.kubectl("exec", "-n", node_namespace, "keeper", "--", "cuda-info")
        return str(out.stdout) if out.returncode == 0 else ""

    again = wait_until("cuda-info in the running pod", exec_info, 60)
    assert again.splitlines()[0].split()[-2:] == ["2048", "2048"], again
    bed.apply(node_namespace, gpu_pod("after", "cuda-info", vgpu(1024), node="node-1"))
    done = bed.wait_phase(node_namespace, "after", {"Succeeded", "Failed"})
    logs = bed.logs(node_namespace, "after")
    assert done["status"]["phase"] == "Succeeded" and " 1024 1024" in logs, logs


def test_twenty_pods_at_once(bed: Bed, node_namespace: str) -> None:
    """20 budgeted pods created at once fill both nodes' 20 shares; each runs under its own
    budget. Prints the figures docs/node-daemon.md quotes."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    files_before = {n: len(list(d.state_dir.glob("containers/*/budget")))
                    for n, d in bed.daemons.items()}
    names = [f"many-{i:02d}" for i in range(20)]
    manifests = [gpu_pod(n, "cuda-info && cuda-alloc 1000", vgpu(1024), node=None)
                 for n in names]
    started = time.time()
    out = bed.kubectl("apply", "-n", node_namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": manifests}))
    assert out.returncode == 0, out.stderr
    def all_done() -> list[dict[str, Any]] | None:
        items: list[dict[str, Any]] = json.loads(bed.kubectl(
            "get", "pods", "-n", node_namespace, "-o", "json").stdout)["items"]
        done = [p for p in items if p["status"].get("phase") in ("Succeeded", "Failed")]
        return items if len(done) == 20 else None

    pods = wait_until("20 pods done", all_done, 300, 1)
    elapsed = time.time() - started
    failed = {p["metadata"]["name"]: (p["status"].get("reason"), p["status"].get("message"),
                                      bed.logs(node_namespace, p["metadata"]["name"]))
              for p in pods if p["status"]["phase"] != "Succeeded"}
    assert not failed, "\n".join(f"{n}: {why}" for n, why in sorted(failed.items()))
    # both nodes' shares are used (a pod that ended gives its share back at once)
    per_node = {n: sum(p["spec"]["nodeName"] == n for p in pods) for n in bed.daemons}
    assert all(per_node.values()), per_node
    uuids = set()
    for p in pods:
        lines = bed.logs(node_namespace, p["metadata"]["name"]).splitlines()
        gpu = next(x for x in lines if x.startswith("0 ")).split()
        assert gpu[-2:] == ["1024", "1024"] and "allocated 1000" in lines, lines
        uuids.add(gpu[-3])
    assert len(uuids) == 2, uuids  # one GPU per node
    # the daemons asked the kubelet with Get only: a List during an Allocate can make the
    # kubelet hand one share to two pods, which then share one budget (listgate.py)
    for n, d in bed.daemons.items():
        calls = (d.metric("tessera_node_podresources_calls_total", method="Get"),
                 d.metric("tessera_node_podresources_calls_total", method="List"))
        assert calls[0] and calls[1] == 0, (n, calls)
    # every container's files went with its pod
    for n, d in bed.daemons.items():
        wait_until(f"{n}'s budget files removed", lambda n=n, d=d: len(list(
            d.state_dir.glob("containers/*/budget"))) <= files_before[n], 30)
    to_start = sorted(_seconds(p["status"]["containerStatuses"][0]["state"]["terminated"][
        "startedAt"]) - _seconds(p["metadata"]["creationTimestamp"]) for p in pods)
    allocs = {n: (d.metric("tessera_node_allocate_seconds_sum"),
                  d.metric("tessera_node_allocate_seconds_count"))
              for n, d in bed.daemons.items()}
    print(f"\n[figures] 20 pods at once: all Succeeded in {elapsed:.1f}s ({per_node}); "
          f"create->container "
          f"start p50 {to_start[9]:.0f}s max {to_start[-1]:.0f}s; Allocate (sum s, count) "
          f"per daemon so far {allocs}")


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()


def test_the_audit_knows_the_containers_the_plugin_set_up(bed: Bed, node_namespace: str
                                                          ) -> None:
    """The daemon's audit reads the device plugin's registry: a budgeted container's GPU
    memory is counted as its own (per-container metrics), not as a foreign process."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    bed.apply(node_namespace, gpu_pod("audited", "cuda-alloc 500 60", vgpu(1024),
                                      node="node-1"))
    bed.wait_phase(node_namespace, "audited", {"Running"})
    wait_until("the allocation", lambda: "allocated 500" in bed.logs(node_namespace,
                                                                     "audited"), 30)
    d = bed.daemons["node-1"]
    labels = {"namespace": node_namespace, "pod": "audited", "container": "main"}
    used = wait_until("the container's memory in its metrics", lambda: (
        v if (v := d.metric("tessera_container_memory_used_bytes", **labels)) else None), 30)
    assert used >= 500 * MIB, used
    assert d.metric("tessera_container_memory_budget_bytes", **labels) == 1024 * MIB
    assert d.metric("tessera_container_over_budget", **labels) == 0
    assert not d.metric("tessera_node_foreign_gpu_processes"), "counted as foreign"
    bed.kubectl("delete", "pod", "-n", node_namespace, "audited", "--wait=false")
