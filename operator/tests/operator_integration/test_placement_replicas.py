"""The placement service with two replicas against the real API server and a real
kube-scheduler (tessera-scheduler): GPU nodes are API objects with tessera's inventory (no
kubelet), so pods are bound and stay Pending.

A burst of pods, each of which one unit alone can hold, placed while the Lease holder is
killed: the other replica takes over from the pods' records, and no unit ever holds two.
Calls reach both replicas through the Service port; the one that does not lead forwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import ANNOTATION_PLACEMENT, SCHEDULER_NAME, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera_e2e.operator.api_nodes import ApiGPUNodes
from tessera_e2e.operator.replicas import OperatorProcess
from tessera_e2e.operator.scheduler import TesseraScheduler

from .conftest import Operators
from .harness import kubectl_json, wait_until
from .test_quota_admission import quota, setup_ns

pytestmark = pytest.mark.integration

UNIT_MIB = 9984  # an H100's 1g.10gb
NODES, GPUS = 3, 4


@pytest.fixture
def scheduler(cluster: Any, ops: Operators, tmp_path: Path) -> Iterator[TesseraScheduler]:
    sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, ops, tmp_path).start()
    yield sched
    sched.stop()


@pytest.fixture
def gpu_nodes(cluster: Any) -> Iterator[ApiGPUNodes]:
    with ApiGPUNodes(str(cluster.kubeconfig), NODES, GPUS, prefix="place-",
                     memory_mib=UNIT_MIB) as nodes:
        yield nodes


def gpu_pod(ns: str, name: str, mem: int) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"schedulerName": SCHEDULER_NAME,
                                "terminationGracePeriodSeconds": 0,
                                "containers": [{"name": "main", "image": "busybox",
                                                "resources": {"limits": {
                                                    VGPU: "1", VGPU_MEMORY: str(mem),
                                                    VGPU_CORES: "10"}}}]}})


def _forwarded(rep: OperatorProcess) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in rep.metrics().splitlines()
               if line.startswith('tessera_placement_forwarded_total{outcome="ok"}'))


@pytest.fixture
def follower_scheduler(cluster: Any, ops: Operators,
                       tmp_path: Path) -> Iterator[tuple[TesseraScheduler, OperatorProcess]]:
    """tessera-scheduler whose extender URL is the replica that does not hold the Lease
    (the Service spreads connections, but kube-scheduler keeps one alive, so through the
    Service which replica answers is chance)."""
    leader = ops.leader()
    follower = next(r for r in ops.replicas.values() if r is not leader)
    sched = TesseraScheduler(cluster.bin_dir, cluster.kubeconfig, ops, tmp_path,
                             url=f"https://127.0.0.1:{follower.webhook_port}").start()
    yield sched, follower
    sched.stop()


def test_a_burst_with_the_leader_killed_never_puts_two_pods_on_one_unit(
        cluster: Any, namespace: str, ops: Operators, scheduler: TesseraScheduler,
        gpu_nodes: ApiGPUNodes) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 1000, "memory": "400Gi"}))
    units = NODES * GPUS
    names = [f"p{i:02d}" for i in range(units + 2)]  # two more than fit
    for i, name in enumerate(names):
        out = cluster.kubectl("create", "-f", "-", input=gpu_pod(ns, name, 6000))
        assert out.returncode == 0, out.stderr
        if i == units // 2:
            ops.leader().kill()
    try:
        def bound() -> dict[str, Any] | None:
            pods = kubectl_json(cluster, "get", "pods", "-n", ns)["items"]
            done = {p["metadata"]["name"]: p for p in pods if p["spec"].get("nodeName")}
            return done if len(done) == units else None
        placed = wait_until("every unit's pod bound", bound, 120)
    finally:
        ops.ensure_running()
    held = []
    for p in placed.values():
        rec = json.loads(p["metadata"]["annotations"][ANNOTATION_PLACEMENT])
        assert rec["node"] == p["spec"]["nodeName"]
        held += rec["containers"]["main"][VGPU]
    assert len(held) == units and len(set(held)) == units, held
    time.sleep(3)
    pods = kubectl_json(cluster, "get", "pods", "-n", ns)["items"]
    left = [p for p in pods if not p["spec"].get("nodeName")]
    assert len(left) == 2, [p["metadata"]["name"] for p in left]
    events = kubectl_json(cluster, "get", "events", "-n", ns, "--field-selector",
                          f"involvedObject.name={left[0]['metadata']['name']},"
                          "reason=FailedScheduling")["items"]
    assert any(f"largest free unit {UNIT_MIB - 6000} MiB < 6000 MiB" in e["message"]
               for e in events), [e["message"] for e in events]


def test_the_replica_that_does_not_lead_forwards_to_the_one_that_does(
        cluster: Any, namespace: str, ops: Operators,
        follower_scheduler: tuple[TesseraScheduler, OperatorProcess],
        gpu_nodes: ApiGPUNodes) -> None:
    ns = namespace
    _, follower = follower_scheduler
    setup_ns(cluster, ns, quota(ns, hard={"cores": 1000, "memory": "400Gi"}))
    before = _forwarded(follower)
    for i in range(6):
        out = cluster.kubectl("create", "-f", "-", input=gpu_pod(ns, f"f{i}", 1000))
        assert out.returncode == 0, out.stderr

    def six_bound() -> dict[str, Any] | None:
        bound = _bound_pods(cluster, ns)
        return bound if len(bound) == 6 else None
    placed = wait_until("six pods bound", six_bound, 60)
    # every pod was placed by the leader: a filter and a bind per pod went through the
    # follower, and each bound pod carries the leader's record
    assert _forwarded(follower) - before >= 12
    for p in placed.values():
        rec = json.loads(p["metadata"]["annotations"][ANNOTATION_PLACEMENT])
        assert rec["node"] == p["spec"]["nodeName"]


@pytest.fixture
def high_priority(cluster: Any) -> Iterator[str]:
    name = "tessera-test-high"
    cluster.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": 1000}))
    yield name
    cluster.kubectl("delete", "priorityclass", name, "--ignore-not-found")


def _with_priority(manifest: str, cls: str) -> str:
    body = json.loads(manifest)
    body["spec"]["priorityClassName"] = cls
    return json.dumps(body)


def _bound_pods(cluster: Any, ns: str) -> dict[str, Any]:
    return {p["metadata"]["name"]: p for p in kubectl_json(cluster, "get", "pods", "-n", ns)[
        "items"] if p["spec"].get("nodeName")}


@pytest.mark.parametrize("shares,low_mib,high_mib,path", [
    # the Node's totals are full: kube-scheduler's preemption proposes the node and the
    # extender's preempt verb names the victims
    (1, 6000, 6000, "scheduler"),
    # the totals hold the pod, no unit does: the scheduler finds no victim; the filter evicts
    (10, 6000, 6000, "filter"),
])
def test_a_higher_priority_pod_preempts_exactly_the_pods_of_one_unit(
        cluster: Any, namespace: str, ops: Operators, scheduler: TesseraScheduler,
        high_priority: str, shares: int, low_mib: int, high_mib: int, path: str) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 1000, "memory": "400Gi"}))
    with ApiGPUNodes(str(cluster.kubeconfig), 1, 2, prefix=f"pre-{path}-", shares=shares,
                     memory_mib=UNIT_MIB):
        for i in range(2):
            out = cluster.kubectl("create", "-f", "-", input=gpu_pod(ns, f"low{i}", low_mib))
            assert out.returncode == 0, out.stderr
        wait_until("both low pods bound", lambda: len(_bound_pods(cluster, ns)) == 2, 60)
        out = cluster.kubectl("create", "-f", "-", input=_with_priority(
            gpu_pod(ns, "high", high_mib), high_priority))
        assert out.returncode == 0, out.stderr
        bound = wait_until("the high-priority pod bound", lambda: (
            b if "high" in (b := _bound_pods(cluster, ns)) else None), 90)
        assert len(bound) == 2, sorted(bound)  # exactly one low pod went
        lows = [n for n in bound if n.startswith("low")]
        assert len(lows) == 1, sorted(bound)
        high = json.loads(bound["high"]["metadata"]["annotations"][ANNOTATION_PLACEMENT])
        low = json.loads(bound[lows[0]]["metadata"]["annotations"][ANNOTATION_PLACEMENT])
        assert high["containers"]["main"][VGPU] != low["containers"]["main"][VGPU]
        if path == "filter":
            events = kubectl_json(cluster, "get", "events", "-n", ns, "--field-selector",
                                  "reason=Preempted")["items"]
            assert any("preempted by" in e["message"] and f"{ns}/high" in e["message"]
                       for e in events), [e["message"] for e in events]
