"""MIG on demand on the device-plugin path, on the test bed's real kubelets: node-0's H100
belongs to a GPUPartition with ``migMode: OnDemand``; pods asking
``tessera.dev/mig-<profile>`` that no instance can hold get one made for them (the operator's
placement service asks it in the partition's ``status.demand``, node-0's tessera-node makes
it with ``nvidia-smi`` and advertises it, tessera-scheduler places the pod on it); a pod that
cannot fit stays Pending; a pod's instance is destroyed once it is gone, its neighbours'
containers untouched.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.api.names import (
    ANNOTATION_GPUS,
    ANNOTATION_PARTITION_STATUS,
    ANNOTATION_PLACEMENT,
    SCHEDULER_NAME,
)
from tessera.api.node_report import parse_reports
from tessera.api.resources import mig_resource_name
from tessera.mig.planner import Instance, validate
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.operator.scheduler import TesseraScheduler

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

NODE = "node-0"
PARTITION = "node0-on-demand"
IDLE_S = 3
"""tessera-node's --on-demand-idle here: an instance no pod holds goes after 3 s."""
H100 = "H100-80GB"
GI_ROW = re.compile(r"^\|\s+(\d+)\s+MIG (\S+)\s+\d+\s+\d+\s+(\d+):\d+\s+\|$")


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed[Any]]:
    logdir = tmp_path_factory.mktemp("tessera-on-demand")
    with gpu_bed(node_cluster, logdir, operator_args=("--scheduler-name", SCHEDULER_NAME),
                 daemon_args=("--on-demand-idle", str(IDLE_S))) as b:
        sched = TesseraScheduler(node_cluster.bin_dir, node_cluster.kubeconfig,
                                 b.operators, logdir).start()
        b.apply("default", {
            "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
            "metadata": {"name": PARTITION},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": NODE}},
                     "layout": {"migMode": "OnDemand"}, "deletionPolicy": "Reset"}})
        try:
            # every profile is a resource from the start, with none free
            wait_until("node-0 advertising mig-3g.40gb (none yet)", lambda: b.allocatable(
                NODE).get(mig_resource_name("3g.40gb")) == "0", 120, 1)
            yield b
        finally:
            sched.stop()
            b.kubectl("delete", "gpupartition", PARTITION, "--wait=false")
            b.wait_partition_removed(PARTITION, NODE)


def instances(bed: Bed[Any]) -> list[tuple[int, str, int]]:
    """(GPU, profile, start) of node-0's GPU instances, as ``nvidia-smi mig -lgi`` lists."""
    out = bed.daemons[NODE].smi("mig", "-lgi").stdout
    return sorted((int(m[1]), m[2], int(m[3])) for line in out.splitlines()
                  if (m := GI_ROW.match(line.strip())))


def units(bed: Bed[Any]) -> dict[str, tuple[int, str | None, int | None]]:
    """MIG unit UUID -> (GPU, profile, start), as node-0's inventory publishes its units."""
    inv = json.loads(bed.get("node", NODE)["metadata"]["annotations"][ANNOTATION_GPUS])
    return {u["uuid"]: (g["index"], u.get("profile"), u.get("start")) for g in inv
            for u in g.get("units") or []}


def report_pods(bed: Bed[Any]) -> dict[tuple[int, str, int], str | None]:
    """(GPU, profile, start) -> the pod node-0's report says the instance is for."""
    raw = (bed.get("node", NODE)["metadata"].get("annotations") or {}).get(
        ANNOTATION_PARTITION_STATUS)
    entry = parse_reports(raw).get(PARTITION) if raw else None
    return {(g.index, i.profile, i.start): i.pod for g in (entry.gpus if entry else [])
            for i in g.instances}


def events(bed: Bed[Any], ns: str, name: str, reason: str) -> list[str]:
    out = bed.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                      f"involvedObject.name={name},reason={reason}")
    return [e["message"] for e in json.loads(out.stdout)["items"]]


def mig_pod(name: str, prof: str, node: str | None = None) -> dict[str, Any]:
    return gpu_pod(name, "cuda-info; sleep 3600", {mig_resource_name(prof): "1"}, node=node)


def test_pods_get_instances_made_for_them_and_a_gone_pods_instance_is_destroyed(
        bed: Bed[Any], node_namespace: str) -> None:
    ns, daemon = node_namespace, bed.daemons[NODE]
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns)
    pods = {"big": "3g.40gb", "mid": "2g.20gb", "small": "1g.10gb"}
    gpus = len(json.loads(bed.get("node", NODE)["metadata"]["annotations"][ANNOTATION_GPUS]))
    try:
        created = time.monotonic()
        for name, prof in pods.items():
            bed.apply(ns, mig_pod(name, prof))
        for name in pods:
            bed.wait_phase(ns, name, {"Running"}, 120)
        running_s = time.monotonic() - created
        got = instances(bed)
        placed: dict[str, tuple[int, str, int]] = {}
        for name, prof in pods.items():
            pod = bed.get("pod", "-n", ns, name)
            assert pod["spec"]["nodeName"] == NODE
            (uuid,) = json.loads(pod["metadata"]["annotations"][ANNOTATION_PLACEMENT])[
                "containers"]["main"][mig_resource_name(prof)]
            msgs = events(bed, ns, name, "MIGInstanceRequested")
            assert msgs and f"{prof} instance" in msgs[0] and NODE in msgs[0], msgs
            where = re.search(r"GPU (\d+), slot (\d+)", msgs[0])
            assert where is not None, msgs
            placed[name] = (int(where[1]), prof, int(where[2]))
            assert placed[name] in got, (placed[name], got)  # made where it was asked
            # placed on that very instance (the inventory's unit there is the record's)
            assert units(bed).get(uuid) == placed[name], (uuid, units(bed))
            out = bed.kubectl("exec", "-n", ns, name, "--", "cuda-info")
            assert out.returncode == 0 and "devices 1" in out.stdout, out.stdout + out.stderr
        assert sorted(placed.values()) == got  # nothing else made
        for g in range(gpus):  # each GPU's instances valid together (the planner's rules)
            validate(H100, [Instance(p, s) for i, p, s in got if i == g])
        print(f"[figures] on demand (device plugin): three pods (3g.40gb, 2g.20gb, 1g.10gb) "
              f"running {running_s:.1f}s after they were created, instances at "
              f"{ {n: (g, s) for n, (g, _, s) in placed.items()} }")
        assert daemon.metric("tessera_node_mig_on_demand_total", action="create",
                             result="ok") == 3
        mine = {v: f"{ns}/{n}" for n, v in placed.items()}
        wait_until("node-0's report naming the pods", lambda: report_pods(bed) == mine, 30)
        wait_until("status.demand emptied once the pods are placed", lambda: not (
            bed.get("gpupartition", PARTITION).get("status") or {}).get("demand"), 30)

        # a pod that cannot fit beside them anywhere waits, and nothing is made for it
        bed.apply(ns, mig_pod("whole", "7g.80gb"))
        msgs = wait_until("FailedScheduling", lambda: events(bed, ns, "whole",
                                                             "FailedScheduling"), 60)
        assert "7g.80gb" in msgs[0], msgs
        time.sleep(2)  # a round of the placement service at least
        assert not events(bed, ns, "whole", "MIGInstanceRequested")
        assert bed.get("pod", "-n", ns, "whole")["status"]["phase"] == "Pending"
        assert instances(bed) == got
        bed.kubectl("delete", "pod", "-n", ns, "whole", "--wait=true")

        # a pod gone: its instance destroyed after the grace, the neighbours untouched
        # the grace runs from when the daemon sees the pod's containers gone: after the
        # delete began, and before the API object is gone (the kubelet reports the pod ended
        # first), so it is measured from the delete's start
        deleting_at = time.monotonic()
        out = bed.kubectl("delete", "pod", "-n", ns, "mid", "--wait=true")
        assert out.returncode == 0, out.stderr
        wait_until("the 2g.20gb instance destroyed", lambda: placed["mid"] not in instances(
            bed), 60, 0.2)
        destroyed_s = time.monotonic() - deleting_at
        assert destroyed_s >= IDLE_S, destroyed_s
        assert daemon.metric("tessera_node_mig_on_demand_total", action="destroy",
                             result="ok") == 1
        for name in ("big", "small"):
            bed.assert_untouched(ns, name)
        print(f"[figures] on demand (device plugin): a gone pod's instance destroyed "
              f"{destroyed_s:.1f}s after its delete began (grace {IDLE_S}s)")
    finally:
        for name in [*pods, "whole"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=false")
        for name in [*pods, "whole"]:
            bed.kubectl("delete", "pod", "-n", ns, name, "--wait=true")
        wait_until("node-0's instances destroyed", lambda: instances(bed) == [], 60, 0.5)


def test_nothing_is_made_for_a_pod_that_may_not_run_on_the_on_demand_node(
        bed: Bed[Any], node_namespace: str) -> None:
    """A pod whose node selector names another node: the scheduler keeps it Pending, and
    no instance is made on node-0 for it (it could never use one there)."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns)
    try:
        bed.apply(ns, mig_pod("elsewhere", "1g.10gb", node="node-1"))
        wait_until("FailedScheduling", lambda: events(bed, ns, "elsewhere",
                                                      "FailedScheduling"), 60)
        time.sleep(2)
        assert not events(bed, ns, "elsewhere", "MIGInstanceRequested")
        assert instances(bed) == []
        assert not (bed.get("gpupartition", PARTITION).get("status") or {}).get("demand")
    finally:
        bed.kubectl("delete", "pod", "-n", ns, "elsewhere", "--wait=true")
