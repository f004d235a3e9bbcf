"""Core time shared by budget, lent while idle, and budgets resized while pods run: through
real pods on two real nodes (node-0: one simulated H100-80GB, node-1: one A100-40GB) with
tessera installed by ``helm install`` of charts/tessera (the ``chart_bed`` fixture): the
operator Deployment, and the ``tessera-node`` DaemonSet running its core controllers.

The achieved shares are the daemon's own per-container counters
(``tessera_container_core_busy_seconds_total``: NVML's per-process busy time, attributed to
containers), read over a window as Prometheus' ``rate()`` would."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tessera.api.budget import parse_budget_annotation as parse_budget
from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_BUDGET_RESIZE,
    ANNOTATION_GPU_COMMITMENTS,
    REASON_RESIZED,
)
from tessera_e2e.chart.bed import ChartDaemon
from tessera_e2e.gpubed.bed import Bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until
from tessera_node.budget.formats import read_budget_file as read_budget

pytestmark = pytest.mark.integration

PAUSE = "/tmp/pause"
GO = "/tmp/go"
MIB = 1 << 20


@pytest.fixture(scope="module")
def bed(chart_bed: Bed[ChartDaemon]) -> Bed[ChartDaemon]:
    """tessera as `helm install` of charts/tessera put it on this module's two nodes."""
    return chart_bed


def spinner(name: str, cores: int, seed: int, node: str = "node-0") -> dict[str, Any]:
    return gpu_pod(name, f"cuda-spin 0 1000 {seed} {PAUSE}", vgpu(1024, cores=cores), node)


def counter(bed: Bed, node: str, name: str, namespace: str) -> float:
    return sum(v for _, v in bed.samples(node, name, namespace))


def exec_sh(bed: Bed, namespace: str, pod: str, script: str) -> None:
    out = bed.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr


def test_core_budgets_split_a_gpu_idle_time_is_lent_and_taken_back_and_resized(
    bed: Bed, chart_namespace: str
) -> None:
    """Two pods with core budgets 30 and 70 saturate node-0's GPU: each gets its budget's
    share of the busy time (±2 points over 10 s). One goes idle: the other absorbs the GPU
    (lending counted on the quota). It comes back: it regains its budget. Both are resized
    live to 50 % (`tessera resize`): they obey without a restart."""
    ns = chart_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns)
    bed.apply(ns, spinner("thirty", 30, 1))
    bed.apply(ns, spinner("seventy", 70, 2))
    for name in ("thirty", "seventy"):
        bed.wait_phase(ns, name, {"Running"})
    wait_until("both containers under a core controller", lambda: len(
        bed.core_busy("node-0", ns)) == 2, 60, 1)
    time.sleep(3)  # the controller learns the kernels' cost

    got, wall = bed.busy_window("node-0", ns, 10)
    total = sum(got.values())
    shares = {p: round(100 * v / total, 2) for p, v in got.items()}
    print(f"achieved shares over 10 s: {shares}, GPU busy {total / wall:.3f}")
    # one GPU is busy at most all the time: more means a process's busy time was credited
    # to two containers (the window's edges may add one 0.1 s control period)
    assert total <= 1.03 * wall, (got, wall)
    assert abs(shares["thirty"] - 30) <= 2 and abs(shares["seventy"] - 70) <= 2, shares

    lent0 = counter(bed, "node-0", "tessera_quota_core_lent_seconds_total", ns)
    exec_sh(bed, ns, "thirty", f": > {PAUSE}")
    time.sleep(2)
    got, wall = bed.busy_window("node-0", ns, 3)
    assert got["thirty"] / wall < 0.02, got  # idle
    assert got["seventy"] / wall >= 0.90, (got, wall)  # took what thirty left idle
    print(f"lending: seventy busy {got['seventy'] / wall:.3f} of the GPU while thirty idles")
    assert counter(bed, "node-0", "tessera_quota_core_lent_seconds_total", ns) > lent0

    exec_sh(bed, ns, "thirty", f"rm {PAUSE}")
    time.sleep(1)
    got, _ = bed.busy_window("node-0", ns, 4)
    share = 100 * got["thirty"] / sum(got.values())
    assert share >= 28, got  # its budget back
    print(f"reclaim: thirty back at {share:.1f} % of the busy time")

    # resized live to 50/50 (the one that shrinks first, so the quota always holds both)
    for pod in ("seventy", "thirty"):
        r = bed.resize(ns, pod, "--cores", "50")
        assert r.returncode == 0, (r.stdout, r.stderr)
    time.sleep(1)
    got, _ = bed.busy_window("node-0", ns, 6)
    shares = {p: round(100 * v / sum(got.values()), 2) for p, v in got.items()}
    assert abs(shares["thirty"] - 50) <= 2 and abs(shares["seventy"] - 50) <= 2, shares
    print(f"after the live resize to 50/50: {shares}")
    for name in ("thirty", "seventy"):
        bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")


def budget_files(bed: Bed, node: str) -> list[tuple[int, float]]:
    """(memory MiB, cores) of every ready budget file on the node."""
    out = []
    for p in bed.daemons[node].state_dir.glob("containers/*/budget"):
        b = read_budget(p)
        if b.state == "ready":
            out += [((e.memory or 0) // MIB, e.cores or 100.0) for e in b.entries]
    return out


def test_a_running_pods_budget_is_resized_and_a_resize_the_gpu_cannot_hold_is_refused(
    bed: Bed, chart_namespace: str
) -> None:
    """On node-1 (40960 MiB): a pod with 1024 MiB cannot allocate 1500 MiB; resized to 2 GiB
    and 40 % cores while it runs (`tessera resize`), the same process allocates it: status
    Applied, an Event, the budget file, the Node's commitments. The 30000 MiB pod's
    resize to 39000 MiB, within the quota but beyond what the GPU has beside grower's
    2 GiB, is refused by the node, and the operator restores its budget."""
    ns = chart_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, {"memory": "64Gi", "cores": 400, "pods": 10}, {"memory": "40Gi", "cores": 100})
    bed.apply(ns, gpu_pod("big", "cuda-alloc 100 600", vgpu(30000, cores=30), "node-1"))
    bed.apply(ns, gpu_pod("grower", f"cuda-alloc 1500; echo before $?; "
                                    f"while [ ! -e {GO} ]; do sleep 0.2; done; "
                                    f"cuda-alloc 1500; echo after $?",
                          vgpu(1024, cores=30), "node-1"))
    for name in ("big", "grower"):
        bed.wait_phase(ns, name, {"Running"})
    wait_until("grower refused past its budget", lambda: "before 1" in bed.logs(ns, "grower"),
               60)

    r = bed.resize(ns, "grower", "--memory", "2Gi", "--cores", "40")
    assert r.returncode == 0, (r.stdout, r.stderr)
    pod = bed.pod(ns, "grower")
    ann = pod["metadata"]["annotations"]
    assert json.loads(ann[ANNOTATION_BUDGET_RESIZE])["state"] == "Applied", ann
    main = parse_budget(ann[ANNOTATION_BUDGET]).containers["main"]
    assert (main.memory_bytes // MIB, main.cores) == (2048, 40)
    assert (2048, 40.0) in budget_files(bed, "node-1")  # the file the container reads
    # the daemon posts the Event after it patches the pod, and writes the Node's
    # commitments in its next pass: both are read until they come (or the wait ends)
    wait_until("the BudgetResized Event", lambda: any(
        e["reason"] == REASON_RESIZED and "main: 2048 MiB, 40% cores" in e["message"]
        for e in bed.get("events", "-n", ns, "--field-selector",
                         "involvedObject.name=grower")["items"]), 30, 0.5)

    def commitments() -> list[tuple[int, int]]:  # per GPU: MiB committed, containers
        ann = bed.get("node", "node-1")["metadata"].get("annotations") or {}
        committed = json.loads(ann.get(ANNOTATION_GPU_COMMITMENTS) or "{}")
        return [(g["committed"] // MIB, g["containers"]) for g in committed.values()]
    wait_until("the Node's commitments with grower's 2 GiB (node-1 has one GPU)",
               lambda: commitments() == [(30000 + 2048, 2)], 30, 0.5)

    # the node refuses what the GPU cannot hold beside grower's 2 GiB, though the quota
    # allows it; the operator restores the previous budget
    r = bed.resize(ns, "big", "--memory", "39000Mi")
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "on this node: memory budgets on GPU-" in r.stderr, r.stderr
    wait_until("big's previous budget restored", lambda: parse_budget(
        bed.pod(ns, "big")["metadata"]["annotations"][ANNOTATION_BUDGET]
    ).containers["main"].memory_bytes // MIB == 30000, 30, 0.5)
    assert (30000, 30.0) in budget_files(bed, "node-1")  # untouched

    exec_sh(bed, ns, "grower", f": > {GO}")
    bed.wait_phase(ns, "grower", {"Succeeded", "Failed"})
    lines = bed.logs(ns, "grower").splitlines()
    assert "after 0" in lines and "allocated 1500" in lines, lines  # the same pod, no restart
    bed.kubectl("delete", "pod", "-n", ns, "big", "--wait=false")
