"""Priority preemption over tessera's resources without Kueue, on the test bed's real kubelets
and the default scheduler: a higher-priority pod that needs a whole GPU's memory evicts the
lower-priority GPU pods holding that GPU, and no other; it then runs under its budget (its
whole-GPU allocation succeeds on the simulated GPU, whose memory the victims really gave
back, and one past its budget is refused)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.api.names import VGPU_MEMORY
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed[Any]]:
    with gpu_bed(node_cluster, tmp_path_factory.mktemp("tessera-preemption")) as b:
        yield b


@pytest.fixture
def high_priority(bed: Bed[Any], node_namespace: str) -> Iterator[str]:
    name = f"{node_namespace}-high"
    bed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": name}, "value": 1000}))
    yield name
    bed.kubectl("delete", "priorityclass", name, "--ignore-not-found")


def alive(bed: Bed[Any], ns: str, name: str) -> bool:
    out = bed.kubectl("get", "pod", "-n", ns, name, "-o", "json")
    return out.returncode == 0 and not json.loads(out.stdout)["metadata"].get(
        "deletionTimestamp")


def test_a_whole_gpu_pod_of_higher_priority_evicts_the_pods_on_that_gpu_only(
        bed: Bed[Any], node_namespace: str, high_priority: str) -> None:
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns)
    whole = int(bed.allocatable("node-0")[VGPU_MEMORY])  # MiB: the GPU's budgetable memory
    quarter = whole // 4
    lows = {f"low-{i}": "node-0" for i in range(3)} | {"low-other": "node-1"}
    out = bed.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": [
            gpu_pod(name, f"cuda-alloc {quarter - 100} && sleep 600", vgpu(quarter, cores=20),
                    node=node)
            for name, node in lows.items()]}))
    assert out.returncode == 0, out.stderr
    for name in lows:
        bed.wait_phase(ns, name, {"Running"}, 180)
    pod = gpu_pod("high", f"cuda-info && cuda-alloc {whole - 100} && ! cuda-alloc {whole + 512}",
                  vgpu(whole, cores=100), node="node-0")
    pod["spec"]["priorityClassName"] = high_priority
    bed.apply(ns, pod)
    done = bed.wait_phase(ns, "high", {"Succeeded", "Failed"}, 240)
    logs = bed.logs(ns, "high")
    assert done["status"]["phase"] == "Succeeded", logs
    # its budget: the whole GPU, all of it allocatable once the victims are gone
    assert f"allocated {whole - 100}" in logs.splitlines(), logs
    assert "CUDA_ERROR_OUT_OF_MEMORY" in logs, logs
    # the three pods on node-0's GPU, and not the one on node-1
    victims = [n for n, node in lows.items() if node == "node-0"]
    wait_until("the three victims gone", lambda: not any(alive(bed, ns, n) for n in victims),
               60, 1)
    assert alive(bed, ns, "low-other")
    assert bed.pod(ns, "low-other")["status"]["phase"] == "Running"
    out = bed.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                      "reason=Preempted")
    preempted = sorted(e["involvedObject"]["name"] for e in json.loads(out.stdout)["items"])
    assert preempted == victims, preempted
    print(f"\n[figures] priority preemption: {len(preempted)} pods preempted for one whole "
          f"GPU ({whole} MiB), none elsewhere")
