"""Placement on the device-plugin path, on the test bed's real kubelets: tessera-scheduler
(a second kube-scheduler of the release, whose extender is the operator's placement service)
binds a GPU pod only where one GPU or MIG instance holds each container's budget, records
the units in the Binding, and the device plugin gives the container exactly those.

node-0's H100 is partitioned into seven shared ``1g.10gb`` instances (9,984 MiB each),
node-1's A100-40GB into three shared ``2g.10gb``: ten units, each of which holds one 6,000
MiB pod and no two. The operator runs with ``--scheduler-name
tessera-scheduler``: the pod webhook hands every GPU pod to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.api.names import (
    ANNOTATION_GPU_MODELS_EXCLUDE,
    ANNOTATION_GPU_POLICY,
    ANNOTATION_GPUS,
    ANNOTATION_PLACEMENT,
    API_VERSION,
    SCHEDULER_NAME,
    VGPU,
)
from tessera.mig.catalog import profile
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import SHARES, Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.operator.scheduler import TesseraScheduler

pytestmark = [pytest.mark.integration]

UNIT_MIB = profile("H100-80GB", "1g.10gb").memory_mib
PARTITIONS = (("node0-shared", "node-0", "1g.10gb", 7),   # one H100: 7 units of 9,984 MiB
              ("node1-shared", "node-1", "2g.10gb", 3))   # one A100-40GB: 3 of ~9.6 GiB


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed[Any]]:
    logdir = tmp_path_factory.mktemp("tessera-placement")
    with gpu_bed(node_cluster, logdir,
                 operator_args=("--scheduler-name", SCHEDULER_NAME)) as b:
        assert b.operators is not None
        sched = TesseraScheduler(node_cluster.bin_dir, node_cluster.kubeconfig, b.operators,
                                 logdir).start()
        b.scheduler = sched  # type: ignore[attr-defined]
        for name, node, prof, count in PARTITIONS:
            b.apply("default", {
                "apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": name},
                "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": node}},
                         "layout": {"profiles": [{"name": prof, "count": count}]},
                         "sharing": "Shares", "deletionPolicy": "Reset"}})
        try:
            for _, node, prof, count in PARTITIONS:
                want = count * gpus(b, node)
                wait_until(f"{node} publishing {count} shared {prof} units", lambda node=node,
                           prof=prof, want=want: len(units_of(b, node, prof)) == want, 240, 1)
                wait_until(f"{node} advertising their shares", lambda node=node, want=want: (
                    b.allocatable(node).get(VGPU) == str(want * SHARES)), 60, 1)
            yield b
        finally:
            sched.stop()
            for name, _, _, _ in PARTITIONS:
                b.kubectl("delete", "gpupartition", name, "--wait=false")
            for name, node, _, _ in PARTITIONS:
                try:
                    b.wait_partition_removed(name, node)
                except TimeoutError as exc:
                    raise AssertionError((node, b.allocatable(node), b.kubectl(
                        "get", "node", node, "-o", "jsonpath={.metadata.annotations}").stdout
                        [:3000])) from exc


@pytest.fixture
def scheduler(bed: Bed[Any]) -> TesseraScheduler:
    sched: TesseraScheduler = bed.scheduler  # type: ignore[attr-defined]
    return sched


def gpus(bed: Bed[Any], node: str) -> int:
    out = bed.kubectl("get", "node", node, "-o", "json")
    return len(json.loads(json.loads(out.stdout)["metadata"]["annotations"]
                          .get(ANNOTATION_GPUS, "[]")))


def units_of(bed: Bed[Any], node: str, prof: str = "1g.10gb") -> list[dict[str, Any]]:
    """The shared units of MIG profile ``prof`` that node publishes in its inventory."""
    out = bed.kubectl("get", "node", node, "-o", "json")
    inv = json.loads(json.loads(out.stdout)["metadata"]["annotations"].get(
        ANNOTATION_GPUS, "[]"))
    return [u for g in inv for u in (g.get("units") or [])
            if u["resource"] == VGPU and u.get("profile") == prof]


def record(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][ANNOTATION_PLACEMENT])


def failed_scheduling(bed: Bed[Any], ns: str, name: str) -> list[str]:
    out = bed.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                      f"involvedObject.name={name},reason=FailedScheduling")
    return [e["message"] for e in json.loads(out.stdout)["items"]]


def test_a_pod_no_unit_holds_stays_pending_and_says_why(bed: Bed[Any],
                                                         node_namespace: str) -> None:
    """12,000 MiB on node-0, whose largest unit has 9,984 MiB (69,888 MiB free in total):
    never bound, never sent to a kubelet; FailedScheduling names the largest free unit."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    bed.apply(node_namespace, gpu_pod("too-big", "cuda-info", vgpu(12000)))
    msgs = wait_until("FailedScheduling", lambda: failed_scheduling(
        bed, node_namespace, "too-big"), 60)
    assert f"node-0: largest free unit {UNIT_MIB} MiB < 12000 MiB" in msgs[0], msgs
    time.sleep(3)
    pod = bed.pod(node_namespace, "too-big")
    assert pod["spec"]["schedulerName"] == SCHEDULER_NAME, pod["spec"]
    assert not pod["spec"].get("nodeName"), pod["spec"]
    assert pod["status"]["phase"] == "Pending", pod["status"]
    print(f"\n[figures] FailedScheduling: {msgs[0]}")


def test_ten_pods_at_once_each_alone_on_a_unit_in_every_repetition(
        bed: Bed[Any], node_namespace: str) -> None:
    """Ten 6,000 MiB pods in one apply onto the ten units (room for one each, none to
    spare): all ten run at once under their budgets, each on its own unit, none refused,
    ten times over. (Each holds its unit until the test deletes it: a pod that ended would
    rightly give its unit to the next.)"""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    names = [f"burst-{i}" for i in range(10)]
    for rep in range(10):
        started = time.monotonic()
        items = [gpu_pod(n, "cuda-info && cuda-alloc 5900 && sleep 600", vgpu(6000),
                         node=None) for n in names]
        out = bed.kubectl("apply", "-n", node_namespace, "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": items}))
        assert out.returncode == 0, out.stderr
        try:
            for n in names:
                bed.wait_phase(node_namespace, n, {"Running", "Succeeded", "Failed"}, 180)
        except TimeoutError as exc:
            raise AssertionError((rep, {n: failed_scheduling(bed, node_namespace, n)[-2:]
                                        for n in names})) from exc
        wait_until("every pod allocated its 5900 MiB", lambda: all(
            "allocated 5900" in bed.logs(node_namespace, n) for n in names), 120)
        elapsed = time.monotonic() - started
        pods = {n: bed.pod(node_namespace, n) for n in names}
        assert all(p["status"]["phase"] == "Running" for p in pods.values()), {
            n: p["status"]["phase"] for n, p in pods.items()}
        units = [u for p in pods.values() for us in record(p)["containers"]["main"].values()
                 for u in us]
        assert len(set(units)) == 10, (rep, units)
        refused = [m for n in names for m in bed.events(node_namespace, n, "GPUBudgetRefused")]
        assert not refused, (rep, refused)
        print(f"\n[figures] repetition {rep}: ten pods running on ten units, each with its "
              f"5900 MiB, {elapsed:.1f}s after the apply")
        out = bed.kubectl("delete", "pod", "-n", node_namespace, *names, "--wait=true",
                          "--grace-period=1")
        assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("policy", ["binpack", "spread"])
def test_binpack_fills_one_unit_spread_uses_two(bed: Bed[Any], node_namespace: str,
                                                policy: str) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    names = [f"{policy}-{i}" for i in range(2)]
    for n in names:  # one after the other, both running at once
        pod = gpu_pod(n, "cuda-info && sleep 600", vgpu(2000))
        pod["metadata"]["annotations"] = {ANNOTATION_GPU_POLICY: policy}
        bed.apply(node_namespace, pod)
        bed.wait_phase(node_namespace, n, {"Running"}, 120)
    units = {next(iter(record(bed.pod(node_namespace, n))["containers"]["main"].values()))[0]
             for n in names}
    assert len(units) == (1 if policy == "binpack" else 2), units
    bed.kubectl("delete", "pod", "-n", node_namespace, *names, "--grace-period=1")


def test_model_exclusion_sends_the_pod_to_the_other_model(bed: Bed[Any],
                                                          node_namespace: str) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    pod = gpu_pod("no-h100", "cuda-info", vgpu(1024), node=None)
    pod["metadata"]["annotations"] = {ANNOTATION_GPU_MODELS_EXCLUDE: "H100-80GB"}
    bed.apply(node_namespace, pod)
    done = bed.wait_phase(node_namespace, "no-h100", {"Succeeded", "Failed"}, 120)
    assert done["spec"]["nodeName"] == "node-1", done["spec"]
    assert record(done)["node"] == "node-1"


def test_a_bad_policy_is_refused_at_admission_with_the_reason(bed: Bed[Any],
                                                              node_namespace: str) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    pod = gpu_pod("bad-policy", "cuda-info", vgpu(1024))
    pod["metadata"]["annotations"] = {ANNOTATION_GPU_POLICY: "pack"}
    out = bed.kubectl("apply", "-n", node_namespace, "-f", "-", input=json.dumps(pod))
    assert out.returncode != 0
    assert ANNOTATION_GPU_POLICY in out.stderr and "binpack" in out.stderr, out.stderr


def test_a_forged_placement_is_removed_at_admission(bed: Bed[Any],
                                                    node_namespace: str) -> None:
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    pod = gpu_pod("forged", "cuda-info", vgpu(1024))
    unit = units_of(bed, "node-0")[0]["uuid"]
    pod["metadata"]["annotations"] = {ANNOTATION_PLACEMENT: json.dumps(
        {"version": 1, "node": "node-0", "containers": {"main": {VGPU: [unit]}}})}
    bed.apply(node_namespace, pod)
    done = bed.wait_phase(node_namespace, "forged", {"Succeeded", "Failed"}, 120)
    # what it carries now is tessera's own choice, written in the Binding
    assert done["status"]["phase"] == "Succeeded"
    assert record(done)["node"] == done["spec"]["nodeName"]


def test_with_the_operator_down_pods_stay_pending_then_run_when_it_is_back(
        bed: Bed[Any], node_namespace: str, scheduler: TesseraScheduler) -> None:
    """Fail closed: a GPU pod admitted while tessera ran, scheduled while no replica can
    answer, is not bound (FailedScheduling says why); back up, it runs on its unit."""
    ops = bed.operators
    assert ops is not None
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    scheduler.stop()
    bed.apply(node_namespace, gpu_pod("waits", "cuda-info", vgpu(1024)))
    ops.stop_all()
    try:
        scheduler.start()
        msgs = wait_until("FailedScheduling while tessera is down", lambda: failed_scheduling(
            bed, node_namespace, "waits"), 60)
        assert "placement" in msgs[-1] or "extender" in msgs[-1], msgs
        time.sleep(5)
        pod = bed.pod(node_namespace, "waits")
        assert not pod["spec"].get("nodeName"), pod["spec"]
        print(f"\n[figures] with tessera down: {msgs[-1][:200]}")
    finally:
        ops.ensure_running()
    done = bed.wait_phase(node_namespace, "waits", {"Succeeded", "Failed"}, 120)
    assert done["status"]["phase"] == "Succeeded"
    assert record(done)["node"] == "node-0"


def test_a_leader_killed_in_the_middle_of_a_burst_double_books_nothing(
        bed: Bed[Any], node_namespace: str) -> None:
    """The Lease holder is killed while ten 6,000 MiB pods are being placed: the other
    replica takes over from the pods' records (a consistent read) and every pod still ends
    alone on its unit."""
    ops = bed.operators
    assert ops is not None
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    names = [f"failover-{i}" for i in range(10)]
    items = [gpu_pod(n, "cuda-info && cuda-alloc 5900 && sleep 600", vgpu(6000), node=None)
             for n in names]
    out = bed.kubectl("apply", "-n", node_namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": items}))
    assert out.returncode == 0, out.stderr
    ops.leader().kill()
    try:
        wait_until("every pod allocated its 5900 MiB", lambda: all(
            "allocated 5900" in bed.logs(node_namespace, n) for n in names), 240)
    finally:
        ops.ensure_running()
    pods = {n: bed.pod(node_namespace, n) for n in names}
    assert all(p["status"]["phase"] == "Running" for p in pods.values())
    units = [u for p in pods.values() for us in record(p)["containers"]["main"].values()
             for u in us]
    assert len(set(units)) == 10, units
    bed.kubectl("delete", "pod", "-n", node_namespace, *names, "--wait=true",
                "--grace-period=1")


def test_a_higher_priority_pod_preempts_one_pod_of_one_unit(
        bed: Bed[Any], node_namespace: str) -> None:
    """Every unit holds a low-priority 6,000 MiB pod; the nodes' totals still hold one
    more (so kube-scheduler's own preemption finds no victim): a high-priority pod of 6,000
    MiB evicts exactly one of them, and runs on its unit under its budget."""
    bed.cluster.wait_for_service_account(node_namespace)
    bed.quota(node_namespace)
    high = f"{node_namespace}-high"
    bed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": high}, "value": 1000}))
    try:
        lows = [f"low-{i}" for i in range(10)]
        out = bed.kubectl("apply", "-n", node_namespace, "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [
                gpu_pod(n, "cuda-alloc 5900 && sleep 600", vgpu(6000), node=None)
                for n in lows]}))
        assert out.returncode == 0, out.stderr
        for n in lows:
            bed.wait_phase(node_namespace, n, {"Running"}, 180)
        pod = gpu_pod("high", "cuda-info && cuda-alloc 5900", vgpu(6000), node=None)
        pod["spec"]["priorityClassName"] = high
        bed.apply(node_namespace, pod)
        done = bed.wait_phase(node_namespace, "high", {"Succeeded", "Failed"}, 180)
        assert done["status"]["phase"] == "Succeeded", bed.logs(node_namespace, "high")
        left = [n for n in lows if bed.kubectl("get", "pod", "-n", node_namespace, n,
                                               "-o", "name").returncode == 0
                and not bed.pod(node_namespace, n)["metadata"].get("deletionTimestamp")]
        assert len(left) == 9, left
        out = bed.kubectl("get", "events", "-n", node_namespace, "-o", "json",
                          "--field-selector", "reason=Preempted")
        msgs = [e["message"] for e in json.loads(out.stdout)["items"]]
        assert len(msgs) == 1 and f"{node_namespace}/high" in msgs[0], msgs
        print(f"\n[figures] preemption: {msgs[0]}")
    finally:
        bed.kubectl("delete", "priorityclass", high, "--ignore-not-found")
