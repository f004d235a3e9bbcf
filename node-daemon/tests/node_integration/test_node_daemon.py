"""tessera-node against the real API server and simulated GPU nodes: inventory, reports,
health, and no writes while nothing changes."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tessera.api.inventory import from_node
from tessera.api.names import (
    ANNOTATION_GPUS,
    ANNOTATION_NODE_FINDINGS,
    ANNOTATION_PARTITION_STATUS,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    LABEL_MIG_CAPABLE,
)
from tessera.api.node_report import parse_reports
from tessera.api.partition import NodePartitionStatus
from tessera.models import get_model
from tessera_e2e.gpubed.daemons import NodeDaemonProcess, node_json
from tessera_e2e.operator.replicas import json_stream, wait_until
from tessera_sim.node import gpu_uuid

from .conftest import StartDaemon

pytestmark = pytest.mark.integration


def annotations(cluster: Any, node: str) -> dict[str, str]:
    return node_json(cluster.kubectl, node)["metadata"].get("annotations") or {}


def reports(cluster: Any, node: str) -> dict[str, NodePartitionStatus]:
    return parse_reports(annotations(cluster, node).get(ANNOTATION_PARTITION_STATUS, "{}"))


def partition(cluster: Any, name: str, selector: dict[str, str],
              profiles: dict[str, int] | None) -> None:
    layout: dict[str, Any] = ({"migMode": "Disabled"} if profiles is None else
                              {"profiles": [{"name": k, "count": v}
                                            for k, v in profiles.items()]})
    body = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
            "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": selector}, "layout": layout}}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr


def events(cluster: Any, name: str) -> list[dict[str, Any]]:
    out = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                          f"involvedObject.name={name}", "-o", "json")
    assert out.returncode == 0, out.stderr
    return [e for e in json.loads(out.stdout)["items"]
            if (e.get("source") or {}).get("component") == "tessera-node"]


def test_inventory_of_h100_a100_and_a30_nodes_matches_the_contract(
        chart: Any, start_daemon: StartDaemon) -> None:
    nodes = {"H100-80GB": 8, "A100-40GB": 4, "A30-24GB": 2}
    daemons = {model: start_daemon([model] * n) for model, n in nodes.items()}
    for model, d in daemons.items():
        obj = wait_until(f"{d.node} inventory", lambda d=d: (o := node_json(
            chart.kubectl, d.node)) and ANNOTATION_GPUS in (
            o["metadata"].get("annotations") or {}) and o)
        labels = obj["metadata"]["labels"]
        assert labels[LABEL_GPU_PRODUCT] == model
        assert labels[LABEL_GPU_COUNT] == str(nodes[model])
        assert labels[LABEL_MIG_CAPABLE] == "true"
        inv = from_node(obj)
        assert inv.error is None
        assert [g.index for g in inv.gpus] == list(range(nodes[model]))
        for g in inv.gpus:
            assert g.uuid == gpu_uuid(d.node, g.index)
            assert (g.model, g.memory_mib) == (model, get_model(model).memory_mib)
            assert (g.mig_mode, g.instances) == ("disabled", ())
        assert d.get("/readyz") == (200, "ok")
        total = d.metric("tessera_gpu_memory_total_bytes", gpu="0", model=model)
        assert total == get_model(model).memory_mib << 20
        assert d.metric("tessera_gpu_mig_mode", gpu="0", mode="disabled") == 1


def test_a_mig_change_made_by_hand_shows_up(chart: Any, start_daemon: StartDaemon) -> None:
    d = start_daemon(["H100-80GB", "H100-80GB"])
    wait_until("inventory", lambda: ANNOTATION_GPUS in annotations(chart, d.node))
    assert d.sim.smi("-i", "1", "-mig", "1").returncode == 0
    made = d.sim.smi("mig", "-i", "1", "-cgi", "3g.40gb,1g.10gb", "-C")
    assert made.returncode == 0, made.stdout

    def gpu1() -> Any:
        return from_node(node_json(chart.kubectl, d.node)).gpu(1)
    g = wait_until("MIG instances in the inventory", lambda: (g := gpu1()) and g.instances
                   and g, 15)
    assert g.mig_mode == "enabled"
    # the simulator places like the driver: highest free start slot (3g at 4, then 1g at 3)
    assert sorted((i.profile, i.start) for i in g.instances) == [("1g.10gb", 3),
                                                                 ("3g.40gb", 4)]
    assert all(i.uuid.startswith("MIG-") for i in g.instances)
    assert from_node(node_json(chart.kubectl, d.node)).gpu(0).mig_mode == "disabled"
    assert d.metric("tessera_mig_instance_memory_total_bytes", gpu="1",
                    profile="3g.40gb") is not None
    assert d.sim.smi("mig", "-i", "1", "-dci").returncode == 0
    assert d.sim.smi("mig", "-i", "1", "-dgi").returncode == 0
    wait_until("instances gone", lambda: gpu1().instances == (), 15)
    assert d.metric("tessera_mig_instance_memory_total_bytes", gpu="1") is None


def test_reports_of_three_nodes_for_two_partitions_with_deletions(
        chart: Any, start_daemon: StartDaemon) -> None:
    pool = f"p{int(time.time() * 1000) % 10**8}"
    fast = ["--resync-interval", "1"]
    n1, n2 = (start_daemon(["H100-80GB"] * 2, {"pool": pool, "side": "a"}, fast)
              for _ in range(2))
    n3 = start_daemon(["H100-80GB"] * 2, {"pool": pool, "side": "b"}, fast)
    whole, mig = f"{pool}-whole", f"{pool}-mig"
    try:
        partition(chart, whole, {"pool": pool, "side": "a"}, None)
        time.sleep(1.1)  # creationTimestamp has seconds: `whole` is older, owns n1 and n2
        partition(chart, mig, {"pool": pool}, {"3g.40gb": 2})
        for d in (n1, n2):  # MIG already disabled: the layout is in place
            e = wait_until(f"{d.node} Ready", lambda d=d: reports(chart, d.node).get(whole))
            assert (e.phase, e.observed_generation, e.message) == ("Ready", 1, None)
            assert [g.index for g in e.gpus] == [0, 1]
            assert mig not in reports(chart, d.node)  # its GPUs belong to the older one
        e = wait_until("n3 Ready", lambda: (e := reports(chart, n3.node).get(mig))
                       and e.phase == "Ready" and e, 30)
        assert [sorted((i.profile, i.start) for i in g.instances) for g in e.gpus] == [
            [("3g.40gb", 0), ("3g.40gb", 4)]] * 2  # made by the daemon, at explicit starts
        time.sleep(3)  # resyncs every second: no Event twice
        ready = [ev for ev in events(chart, whole) if ev["reason"] == "NodeReady"]
        assert sorted(ev["message"].split(":")[0] for ev in ready) == sorted(
            f"node {d.node}" for d in (n1, n2))
        assert all(ev.get("count", 1) == 1 for ev in ready)
        assert len([ev for ev in events(chart, mig) if ev["reason"] == "NodeReady"]) == 1
        # deleting the older partition: its entries go, the other takes n1 and n2
        assert chart.kubectl("delete", "gpupartition", whole).returncode == 0
        for d in (n1, n2):
            wait_until(f"{d.node} follows {mig}", lambda d=d: set(reports(
                chart, d.node)) == {mig} and reports(chart, d.node)[mig].phase == "Ready", 30)
        assert chart.kubectl("delete", "gpupartition", mig).returncode == 0
        for d in (n1, n2, n3):
            wait_until(f"{d.node} report gone", lambda d=d: ANNOTATION_PARTITION_STATUS
                       not in annotations(chart, d.node))
    finally:
        chart.kubectl("delete", "gpupartition", whole, mig, "--ignore-not-found")


def test_nvml_failure_turns_ready_then_health_bad_and_back(
        chart: Any, start_daemon: StartDaemon) -> None:
    d = start_daemon(["A100-40GB"] * 4)
    wait_until("ready", lambda: d.get("/readyz")[0] == 200)
    # ready is NVML read and the watches listed; the report follows from the first pass
    published = wait_until("the inventory published",
                           lambda: annotations(chart, d.node).get(ANNOTATION_GPUS))
    d.sim.fault("nvmlDeviceGetCount_v2", -1, 999)  # every call fails: NVML_ERROR_UNKNOWN
    try:
        _, body = wait_until("not ready", lambda: (r := d.get("/readyz"))[0] == 503
                                  and r, 10)
        assert "nvml: NVML: Unknown Error" in body
        assert d.metric("tessera_node_nvml_up") == 0
        _, body = wait_until("unhealthy", lambda: (r := d.get("/healthz"))[0] == 503
                                  and r, 10)  # --stuck-after 3
        assert "nvml: failing for" in body
        assert (d.metric("tessera_node_errors_total", stage="nvml") or 0) > 0
        assert annotations(chart, d.node)[ANNOTATION_GPUS] == published  # never wiped
    finally:
        d.sim.fault("nvmlDeviceGetCount_v2", 0, 0)
    wait_until("healthy again", lambda: d.get("/healthz")[0] == 200
               and d.get("/readyz")[0] == 200, 10)
    assert d.metric("tessera_node_nvml_up") == 1


def test_other_gpu_managers_are_reported_and_left_alone(
        chart: Any, start_daemon: StartDaemon) -> None:
    pool = f"c{int(time.time() * 1000) % 10**8}"
    d = start_daemon(["H100-80GB"], {"pool": pool, "nvidia.com/mig.config": "all-disabled"})
    (d.plugin_dir / "nvidia-gpu.sock").touch()

    def kinds() -> list[str]:
        found = annotations(chart, d.node).get(ANNOTATION_NODE_FINDINGS, "[]")
        return sorted(f["kind"] for f in json.loads(found))
    wait_until("both findings", lambda: kinds() == ["OtherDevicePlugin", "OtherMigManager"],
               15)
    wait_until("an Event on the Node", lambda: {"OtherDevicePlugin", "OtherMigManager"} <= {
        e["reason"] for e in events(chart, d.node)})
    part = f"{pool}-mig"
    try:
        partition(chart, part, {"pool": pool}, {"7g.80gb": 1})
        e = wait_until("report", lambda: reports(chart, d.node).get(part))
        assert e.phase == "Failed"
        assert "leaves MIG to the other MIG manager" in (e.message or "")
        assert d.sim.smi("--query-gpu=mig.mode.current", "--format=csv,noheader"
                         ).stdout.strip() == "Disabled"  # nothing was changed
    finally:
        chart.kubectl("delete", "gpupartition", part, "--ignore-not-found")


def _writes(d: NodeDaemonProcess) -> float:
    return sum(d.metric("tessera_node_api_writes_total", kind=k) or 0
               for k in ("node", "event"))


def test_idle_daemon_writes_nothing_for_sixty_seconds(
        chart: Any, start_daemon: StartDaemon) -> None:
    pool = f"i{int(time.time() * 1000) % 10**8}"
    d = start_daemon(["H100-80GB"] * 8, {"pool": pool}, ["--resync-interval", "5"])
    part = f"{pool}-whole"
    try:
        partition(chart, part, {"pool": pool}, None)
        wait_until("Ready", lambda: (e := reports(chart, d.node).get(part)) and
                   e.phase == "Ready")
        time.sleep(2)
        before, writes_before = node_json(chart.kubectl, d.node), _writes(d)
        watch = subprocess.Popen(
            [str(chart.kubectl_path), "--kubeconfig", str(chart.kubeconfig), "get", "node",
             d.node, "--watch-only", "-o", "json"], stdout=subprocess.PIPE, text=True)
        time.sleep(60)  # twelve resyncs and 120 NVML reads
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
        changes = []
        for obj in json_stream(out):
            mine = [m for m in obj["metadata"].get("managedFields") or []
                    if m.get("manager") == "tessera-node"]
            old = [m for m in before["metadata"].get("managedFields") or []
                   if m.get("manager") == "tessera-node"]
            if mine != old or obj["metadata"].get("annotations") != before["metadata"].get(
                    "annotations"):
                changes.append(obj["metadata"]["resourceVersion"])
        assert changes == []
        assert _writes(d) == writes_before
        assert d.get("/readyz") == (200, "ok")
    finally:
        chart.kubectl("delete", "gpupartition", part, "--ignore-not-found")
