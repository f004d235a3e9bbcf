"""Idle holders reclaimed by tessera itself (GPUQuota ``spec.idle``), on the test bed's real
kubelets with tessera-node's audit every 2 s: a pod that holds GPU memory and launches nothing
(``cuda-alloc MIB SECONDS`` holds its allocation without a kernel; ``cuda-spin`` beside it
paused) gets a ``GPUIdle`` Event and the ``tessera_pod_gpu_idle_seconds`` metric under
``Report``, and kernels again end the episode (a new Event only ``after`` the next pause);
under ``Evict`` it is evicted while a busy pod of the same quota (``cuda-spin``) keeps running;
a PodDisruptionBudget blocks the eviction, with a ``GPUIdleEvictionBlocked`` Event, until it
is removed; a holder of a whole MIG instance is judged by its kernel launches."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.api.names import API_VERSION
from tessera.api.resources import mig_resource_name
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.operator.replicas import wait_until

pytestmark = [pytest.mark.integration]

AFTER_S = 10
HOLD = "cuda-alloc 512 600"  # holds 512 MiB for 10 minutes, launches nothing
PAUSE = "/tmp/pause"


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed[Any]]:
    with gpu_bed(node_cluster, tmp_path_factory.mktemp("tessera-idle")) as b:
        yield b


def setup(bed: Bed[Any], ns: str, action: str) -> None:
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, idle={"after": f"{AFTER_S}s", "action": action})


def exec_sh(bed: Bed[Any], namespace: str, pod: str, script: str) -> None:
    out = bed.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c", script)
    assert out.returncode == 0, out.stderr


def gone(bed: Bed[Any], ns: str, name: str) -> bool:
    out = bed.kubectl("get", "pod", "-n", ns, name, "-o", "json")
    return out.returncode != 0 or bool(json.loads(out.stdout)["metadata"].get(
        "deletionTimestamp"))


def test_report_gives_an_event_and_a_metric_and_activity_resets(
        bed: Bed[Any], node_namespace: str) -> None:
    ns = node_namespace
    setup(bed, ns, "Report")
    # one container, two processes: one holds 512 MiB and never launches, the other spins
    # kernels while /tmp/pause is absent (paused from the start)
    bed.apply(ns, gpu_pod("holder", f": > {PAUSE}; {HOLD} & exec cuda-spin 0 1000 3 {PAUSE}",
                          vgpu(1024, cores=20)))
    bed.wait_phase(ns, "holder", {"Running"}, 120)
    t0 = time.monotonic()
    msgs = wait_until("a GPUIdle Event", lambda: bed.events(ns, "holder", "GPUIdle"), 60, 1)
    took = time.monotonic() - t0
    assert len(msgs) == 1, msgs
    assert "MiB of GPU memory" in msgs[0] and "reported only" in msgs[0], msgs
    assert f"after {AFTER_S}s, action Report" in msgs[0], msgs
    idle = dict(bed.samples("node-0", "tessera_pod_gpu_idle_seconds", ns))
    assert idle.get("holder", 0) >= AFTER_S, idle
    held = dict(bed.samples("node-0", "tessera_pod_gpu_idle_memory_bytes", ns))
    assert held.get("holder", 0) >= 512 << 20, held
    time.sleep(6)  # three more audits: still one Event, the pod untouched
    assert len(bed.events(ns, "holder", "GPUIdle")) == 1
    assert bed.pod(ns, "holder")["status"]["phase"] == "Running"
    # kernels again: the episode ends (the gauge goes); paused again: a new episode, a new
    # Event only `after` later
    exec_sh(bed, ns, "holder", f"rm {PAUSE}")
    wait_until("the idle gauge gone", lambda: "holder" not in dict(
        bed.samples("node-0", "tessera_pod_gpu_idle_seconds", ns)), 30, 1)
    exec_sh(bed, ns, "holder", f": > {PAUSE}")
    t1 = time.monotonic()
    wait_until("a second GPUIdle Event",
               lambda: len(bed.events(ns, "holder", "GPUIdle")) == 2, 60, 1)
    assert time.monotonic() - t1 >= AFTER_S - 2  # not before `after` (one audit's slack)
    assert bed.pod(ns, "holder")["status"]["phase"] == "Running"
    print(f"\n[figures] idle report: Event {took:.0f} s after Running (after {AFTER_S}s, "
          f"audit every 2 s)")


def test_evict_evicts_the_idle_pod_and_not_the_busy_one(bed: Bed[Any],
                                                         node_namespace: str) -> None:
    ns = node_namespace
    setup(bed, ns, "Evict")
    bed.apply(ns, {"apiVersion": "v1", "kind": "List", "items": [
        gpu_pod("idle", HOLD, vgpu(1024, cores=20)),
        gpu_pod("busy", "cuda-spin 0 1000 7", vgpu(1024, cores=20))]})
    for name in ("idle", "busy"):
        bed.wait_phase(ns, name, {"Running"}, 120)
    wait_until("the idle pod evicted", lambda: gone(bed, ns, "idle"), 90, 1)
    assert bed.events(ns, "idle", "GPUIdleEvicted"), "no GPUIdleEvicted Event"
    time.sleep(2 * AFTER_S)  # the busy pod stays, well past `after`
    assert not gone(bed, ns, "busy")
    assert bed.pod(ns, "busy")["status"]["phase"] == "Running"
    assert bed.events(ns, "busy", "GPUIdle") == []


def test_a_pdb_blocks_the_eviction_with_an_event(bed: Bed[Any], node_namespace: str) -> None:
    ns = node_namespace
    setup(bed, ns, "Evict")
    bed.apply(ns, {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                   "metadata": {"name": "keep"},
                   "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "kept"}}}})
    pod = gpu_pod("kept", HOLD, vgpu(1024, cores=20))
    pod["metadata"]["labels"] = {"app": "kept"}
    bed.apply(ns, pod)
    bed.wait_phase(ns, "kept", {"Running"}, 120)
    msgs = wait_until("a GPUIdleEvictionBlocked Event",
                      lambda: bed.events(ns, "kept", "GPUIdleEvictionBlocked"), 90, 1)
    assert "PodDisruptionBudget" in msgs[0], msgs
    time.sleep(4)
    assert not gone(bed, ns, "kept")
    assert len(bed.events(ns, "kept", "GPUIdleEvictionBlocked")) == 1  # once per episode
    out = bed.kubectl("delete", "pdb", "-n", ns, "keep")
    assert out.returncode == 0, out.stderr
    wait_until("evicted once the PDB is gone", lambda: gone(bed, ns, "kept"), 30, 1)


MIG_1G = mig_resource_name("1g.10gb")


def test_a_whole_mig_instance_is_judged_by_its_launches(bed: Bed[Any],
                                                        node_namespace: str) -> None:
    """Inside a MIG instance NVML has no per-process figure, and a whole instance has no core
    budget: use is the container's kernel launch count in its ledger (libtessera counts every
    launch). Paused, a holder of a whole 1g.10gb instance is reported; spinning, the episode
    ends. Last in the module: node-0 is partitioned, then reset."""
    ns = node_namespace
    setup(bed, ns, "Report")
    bed.apply("default", {
        "apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": "idle-mig"},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-0"}},
                 "layout": {"profiles": [{"name": "1g.10gb", "count": 7}]},
                 "sharing": "Whole", "deletionPolicy": "Reset"}})
    try:
        wait_until("node-0 advertising whole 1g.10gb instances",
                   lambda: bed.allocatable("node-0").get(MIG_1G) == "7", 180, 1)
        bed.apply(ns, gpu_pod("whole", f"{HOLD} & exec cuda-spin 0 1000 3 {PAUSE}",
                              {MIG_1G: "1"}))
        bed.wait_phase(ns, "whole", {"Running"}, 120)
        time.sleep(3 * AFTER_S)  # spinning: never idle
        assert bed.events(ns, "whole", "GPUIdle") == []
        exec_sh(bed, ns, "whole", f": > {PAUSE}")
        t0 = time.monotonic()
        msgs = wait_until("a GPUIdle Event", lambda: bed.events(ns, "whole", "GPUIdle"), 60, 1)
        took = time.monotonic() - t0
        assert len(msgs) == 1 and "reported only" in msgs[0], msgs
        assert took >= AFTER_S - 2, took  # not before `after` (one audit's slack)
        exec_sh(bed, ns, "whole", f"rm {PAUSE}")
        wait_until("the idle gauge gone", lambda: "whole" not in dict(
            bed.samples("node-0", "tessera_pod_gpu_idle_seconds", ns)), 30, 1)
        print(f"\n[figures] whole MIG instance: GPUIdle {took:.0f} s after the pause "
              f"(after {AFTER_S}s, audit every 2 s)")
    finally:
        bed.kubectl("delete", "pod", "-n", ns, "whole", "--wait=false")
        bed.kubectl("delete", "gpupartition", "idle-mig", "--wait=false")
    bed.wait_partition_removed("idle-mig")
