"""GPUPartition against the real API server: selection, conditions, kubectl wait, warnings."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tessera.api.inventory import GPUInventory, node_labels, to_annotation
from tessera.api.node_report import ANNOTATION_PARTITION_STATUS, parse_reports
from tessera.api.node_report import to_annotation as to_report_annotation
from tessera.api.partition import NodePartitionStatus

from .conftest import Operators
from .harness import kubectl_json, wait_until

pytestmark = pytest.mark.integration


def node_json(name: str, model: str = "H100-80GB", gpus: int = 2, **labels: str) -> str:
    inv = [GPUInventory(index=i, uuid=f"GPU-{name}-{i}", model=model, memory_mib=81559)
           for i in range(gpus)]
    return json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {**node_labels(inv), **labels},
        "annotations": {"tessera.dev/gpus": to_annotation(inv)}}})


def partition_json(name: str, selector: dict[str, Any], profiles: dict[str, int] | None,
                   **extra: Any) -> str:
    layout: dict[str, Any] = ({"migMode": "Disabled"} if profiles is None else
                              {"profiles": [{"name": k, "count": v} for k, v in profiles.items()]})
    return json.dumps({"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
                       "metadata": {"name": name},
                       "spec": {"nodeSelector": selector, "layout": layout, **extra}})


def report(cluster: Any, part: str, node: str, phase: str, gen: int, msg: str = "") -> None:
    """Write this node's report for ``part`` as its daemon would: into the
    ``tessera.dev/partition-status`` annotation of its own Node (other partitions' entries
    kept), with the Node's resourceVersion as precondition."""
    obj = kubectl_json(cluster, "get", "node", node)
    meta = obj["metadata"]
    reports = parse_reports((meta.get("annotations") or {}).get(
        ANNOTATION_PARTITION_STATUS, "{}"))
    reports[part] = NodePartitionStatus(phase=phase, observed_generation=gen,  # type: ignore[arg-type]
                                        message=msg or None)
    out = cluster.kubectl("patch", "node", node, "--type=merge", "-p", json.dumps({
        "metadata": {"resourceVersion": meta["resourceVersion"], "annotations": {
            ANNOTATION_PARTITION_STATUS: to_report_annotation(reports)}}}))
    assert out.returncode == 0, out.stderr


def cond(cluster: Any, part: str, typ: str) -> tuple[str, str, str]:
    st = kubectl_json(cluster, "get", "gpupartition", part).get("status") or {}
    for c in st.get("conditions") or []:
        if c["type"] == typ:
            return c["status"], c["reason"], c.get("message", "")
    return "", "", ""


@pytest.fixture
def pool(cluster: Any) -> Iterator[str]:
    """A unique node pool label value; its nodes and partitions are deleted afterwards."""
    name = f"pool-{uuid.uuid4().hex[:6]}"
    yield name
    cluster.kubectl("delete", "gpupartition", "-l", f"test-pool={name}", "--wait=false")
    cluster.kubectl("delete", "node", "-l", f"pool={name}", "--wait=false")


def test_ready_after_every_node_reports_and_deselection(
        cluster: Any, ops: Operators, pool: str) -> None:
    nodes = [f"{pool}-n{i}" for i in range(3)]
    for n in nodes:
        out = cluster.kubectl("create", "-f", "-", input=node_json(n, pool=pool))
        assert out.returncode == 0, out.stderr
    part = f"{pool}-mig"
    doc = json.loads(partition_json(part, {"matchLabels": {"pool": pool}}, {"3g.40gb": 2}))
    doc["metadata"]["labels"] = {"test-pool": pool}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(doc))
    assert out.returncode == 0, out.stderr
    wait_until("selected nodes", lambda: (kubectl_json(cluster, "get", "gpupartition", part)
                                          .get("status") or {}).get("selectedNodes") == nodes)
    wait_until("Progressing", lambda: cond(cluster, part, "Progressing")[0] == "True")
    assert "no report" in cond(cluster, part, "Progressing")[2]
    for n in nodes[:2]:
        report(cluster, part, n, "Ready", 1)
    report(cluster, part, nodes[2], "Applying", 1)
    wait_until("still progressing on n2", lambda: f"{nodes[2]} (Applying)" in cond(
        cluster, part, "Progressing")[2])
    report(cluster, part, nodes[2], "Ready", 1)
    out = cluster.kubectl("wait", "--for=condition=Ready", f"gpupartition/{part}",
                          "--timeout=20s")
    assert out.returncode == 0, out.stderr
    st = kubectl_json(cluster, "get", "gpupartition", part)["status"]
    assert st["readyNodeCount"] == 3 and st["layout"] == "2x3g.40gb"
    # the operator copied each daemon's report from its Node into status.nodes
    assert {n: e["phase"] for n, e in st["nodes"].items()} == dict.fromkeys(nodes, "Ready")
    # a node leaves the pool: deselected, its entry removed, still Ready
    out = cluster.kubectl("label", "node", nodes[0], f"pool={pool}-other", "--overwrite")
    assert out.returncode == 0
    wait_until("entry removed", lambda: nodes[0] not in (kubectl_json(
        cluster, "get", "gpupartition", part)["status"].get("nodes") or {}))
    assert cond(cluster, part, "Ready")[0] == "True"
    cluster.kubectl("delete", "node", nodes[0])
    # a failed node degrades, naming node and reason
    report(cluster, part, nodes[1], "Failed", 1, "GPU 1 has running processes")
    wait_until("Degraded", lambda: cond(cluster, part, "Degraded")[0] == "True")
    _, reason, message = cond(cluster, part, "Degraded")
    assert reason == "NodeFailed" and f"{nodes[1]}: GPU 1 has running processes" in message
    # the node recovers: its entry loses the old message (no stale field, no rewrite loop)
    report(cluster, part, nodes[1], "Ready", 1)
    wait_until("recovered", lambda: cond(cluster, part, "Degraded")[0] == "False")
    entry = kubectl_json(cluster, "get", "gpupartition", part)["status"]["nodes"][nodes[1]]
    assert entry["phase"] == "Ready" and "message" not in entry, entry
    # a spec change is a new generation: Ready waits for fresh reports
    cluster.kubectl("patch", "gpupartition", part, "--type=merge", "-p",
                    '{"spec":{"layout":{"profiles":[{"name":"7g.80gb","count":1}]}}}')
    wait_until("generation 2 pending", lambda: "want 2" in cond(cluster, part, "Progressing")[2])
    events = cluster.kubectl("get", "events", "-n", "default", "--field-selector",
                             f"involvedObject.name={part}", "-o", "json")
    reasons = {e["reason"] for e in json.loads(events.stdout)["items"]}
    assert {"Applied", "NodeFailed"} <= reasons


def test_conflicts_degrade_the_later_partition_and_warn(
        cluster: Any, ops: Operators, pool: str) -> None:
    n = f"{pool}-n0"
    assert cluster.kubectl("create", "-f", "-", input=node_json(n, pool=pool)).returncode == 0
    first = json.loads(partition_json(f"{pool}-a", {"matchLabels": {"pool": pool}}, None))
    first["metadata"]["labels"] = {"test-pool": pool}
    assert cluster.kubectl("apply", "-f", "-", input=json.dumps(first)).returncode == 0
    second = json.loads(partition_json(f"{pool}-b", {"matchLabels": {"pool": pool}},
                                       {"1g.10gb": 7}, gpus={"indices": [1]}))
    second["metadata"]["labels"] = {"test-pool": pool}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(second))
    assert out.returncode == 0, out.stderr
    assert f"Warning: node {n}: GPU 1 belongs to older gpupartition/{pool}-a" in out.stderr
    wait_until("conflict", lambda: cond(cluster, f"{pool}-b", "Degraded")[1] == "GPUClaimed")
    assert cond(cluster, f"{pool}-a", "Degraded")[0] == "False"


def test_layout_no_model_can_hold_is_rejected_with_field_and_reason(
        cluster: Any, ops: Operators, pool: str) -> None:
    out = cluster.kubectl("apply", "-f", "-", input=partition_json(
        f"{pool}-bad", {}, {"7g.80gb": 2}))
    assert out.returncode != 0
    assert ('admission webhook "gpupartitions.tessera.dev" denied the request: spec.layout: '
            "fits no GPU model") in out.stderr, out.stderr


def reset_partition_applied(cluster: Any, pool: str, part: str) -> tuple[str, str]:
    """A node of the pool and a Reset partition of it, holding its finalizer, that the
    node reports applied at generation 1: (node, partition)."""
    n = f"{pool}-n0"
    assert cluster.kubectl("create", "-f", "-", input=node_json(n, pool=pool)).returncode == 0
    doc = json.loads(partition_json(part, {"matchLabels": {"pool": pool}}, {"3g.40gb": 2},
                                    deletionPolicy="Reset"))
    doc["metadata"]["labels"] = {"test-pool": pool}
    assert cluster.kubectl("apply", "-f", "-", input=json.dumps(doc)).returncode == 0
    wait_until("finalizer", lambda: "tessera.dev/reset" in (kubectl_json(
        cluster, "get", "gpupartition", part)["metadata"].get("finalizers") or []))
    report(cluster, part, n, "Ready", 1)
    return n, part


def test_reset_deletion_waits_for_the_daemons_and_retain_does_not(
        cluster: Any, ops: Operators, pool: str) -> None:
    n, part = reset_partition_applied(cluster, pool, f"{pool}-reset")
    assert cluster.kubectl("delete", "gpupartition", part, "--wait=false").returncode == 0
    obj = kubectl_json(cluster, "get", "gpupartition", part)
    gen = obj["metadata"]["generation"]
    assert obj["metadata"].get("deletionTimestamp") and gen == 2
    wait_until("reset pending", lambda: "want 2" in cond(cluster, part, "Progressing")[2])
    report(cluster, part, n, "Ready", gen)  # the daemon reset the GPUs
    wait_until("gone", lambda: cluster.kubectl("get", "gpupartition", part).returncode != 0)
    retain = f"{pool}-retain"
    assert cluster.kubectl("apply", "-f", "-", input=partition_json(
        retain, {"matchLabels": {"pool": pool}}, None)).returncode == 0
    assert not kubectl_json(cluster, "get", "gpupartition", retain)["metadata"].get(
        "finalizers")
    assert cluster.kubectl("delete", "gpupartition", retain, "--timeout=10s").returncode == 0


def test_a_restarted_leader_keeps_the_reset_finalizer(
        cluster: Any, ops: Operators, pool: str) -> None:
    """The Lease holder killed and started again (same identity: it takes its Lease back at
    once): the Reset partition keeps its finalizer until it is deleted and reset."""
    _, part = reset_partition_applied(cluster, pool, f"{pool}-keep")
    leader = ops.leader()
    leader.kill()
    ops.ensure_running()
    time.sleep(8)
    assert "tessera.dev/reset" in (kubectl_json(cluster, "get", "gpupartition", part)[
        "metadata"].get("finalizers") or [])


# -- migMode OnDemand --------------------------------------------------------------------------

def on_demand_json(name: str, pool: str, selector: dict[str, Any],
                   layout: dict[str, Any] | None = None, **extra: Any) -> str:
    """An OnDemand partition (``layout`` adds to ``{"migMode": "OnDemand"}``), labelled for
    the pool's cleanup."""
    return json.dumps({"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
                       "metadata": {"name": name, "labels": {"test-pool": pool}},
                       "spec": {"nodeSelector": selector,
                                "layout": {"migMode": "OnDemand", **(layout or {})},
                                **extra}})


def test_on_demand_partitions_are_admitted_and_shown_as_mig_on_demand(
        cluster: Any, ops: Operators, pool: str) -> None:
    h100, a30 = f"{pool}-h", f"{pool}-a"
    for name, model, role in ((h100, "H100-80GB", "h"), (a30, "A30-24GB", "a")):
        out = cluster.kubectl("create", "-f", "-", input=node_json(name, model, pool=pool,
                                                                   role=role))
        assert out.returncode == 0, out.stderr
    # bounded to two H100 profiles: admitted; the A30's GPUs have neither, which the user
    # is warned about (and the status says), GPU by GPU
    bounded = f"{pool}-bounded"
    out = cluster.kubectl("apply", "-f", "-", input=on_demand_json(
        bounded, pool, {"matchLabels": {"pool": pool}},
        {"onDemand": {"profiles": ["3g.40gb", "1g.10gb"], "maxInstances": 4}}))
    assert out.returncode == 0, out.stderr
    assert (f"Warning: node {a30}: GPU 0 (A30-24GB): none of onDemand.profiles (3g.40gb, "
            f"1g.10gb) is a MIG profile of A30-24GB; its profiles: 1g.6gb, 1g.6gb+me, "
            f"2g.12gb, 2g.12gb+me, 4g.24gb") in out.stderr, out.stderr
    # unbounded on the A30 node: admitted without a warning (the GPUs are free: the bounded
    # partition could not take them)
    plain = f"{pool}-plain"
    out = cluster.kubectl("apply", "-f", "-", input=on_demand_json(
        plain, pool, {"matchLabels": {"pool": pool, "role": "a"}}))
    assert out.returncode == 0, out.stderr
    assert "Warning" not in out.stderr, out.stderr
    wait_until("layouts summarised", lambda: [
        (kubectl_json(cluster, "get", "gpupartition", p).get("status") or {}).get("layout")
        for p in (bounded, plain)] == ["MIG on demand (3g.40gb,1g.10gb)", "MIG on demand"])
    _, reason, message = cond(cluster, bounded, "Degraded")
    assert reason == "LayoutDoesNotFit" and f"{a30}: GPU 0 (A30-24GB): none of" in message
    st = kubectl_json(cluster, "get", "gpupartition", plain)["status"]
    assert st["selectedNodes"] == [a30] and cond(cluster, plain, "Degraded")[0] == "False"
    # what `kubectl get gpupartitions` prints
    out = cluster.kubectl("get", "gpupartitions", bounded, plain)
    assert out.returncode == 0, out.stderr
    header, *rows = out.stdout.splitlines()
    assert header.split()[:4] == ["NAME", "SELECTED", "READY", "LAYOUT"], header
    assert rows[0].split()[:3] == [bounded, "2", "0"] and \
        "MIG on demand (3g.40gb,1g.10gb)" in rows[0], rows
    assert rows[1].split()[:3] == [plain, "1", "0"] and "MIG on demand" in rows[1], rows


_KNOWN_MODELS = ("A100-40GB, A100-80GB, A30-24GB, H100-80GB, H100-94GB, H100-96GB, "
                 "H200-141GB, B200-180GB")
_H100 = {"matchLabels": {"tessera.dev/gpu.product": "H100-80GB"}}
_WEBHOOK = 'admission webhook "gpupartitions.tessera.dev" denied the request: '


@pytest.mark.parametrize(("selector", "layout", "extra", "message"), [
    # the CRD's CEL rules (the API server itself)
    (_H100, {"profiles": [{"name": "3g.40gb", "count": 1}]}, {},
     "spec.layout.profiles: Invalid value: profiles must be empty when migMode "
     "is OnDemand: its instances are created for the claims that ask them (bound them with "
     "onDemand)"),
    (_H100, {"migMode": "Enabled", "profiles": [{"name": "3g.40gb", "count": 1}],
             "onDemand": {"maxInstances": 2}}, {},
     "spec.layout.onDemand: Invalid value: onDemand applies only with migMode "
     "OnDemand"),
    # tessera's admission webhook
    (_H100, {"onDemand": {"profiles": ["1g.10gb", "3g.20gb"]}}, {},
     _WEBHOOK + "spec.layout.onDemand.profiles[1]: unknown MIG profile '3g.20gb' for "
     "H100-80GB; valid profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, "
     "7g.80gb"),
    ({"matchLabels": {"tessera.dev/gpu.product": "A30-24GB"}}, {"onDemand": {"maxInstances": 5}},
     {}, _WEBHOOK + "spec.layout.onDemand.maxInstances: 5 instances never fit on one GPU: "
     "A30-24GB holds at most 4; set maxInstances to 4 or less"),
    (_H100, {}, {"sharing": "Shares"},
     _WEBHOOK + "spec.sharing: sharing Shares does not apply to migMode OnDemand: each "
     "instance created on demand belongs to the one claim that asked for it; use sharing "
     "Whole, or migMode Enabled with declared profiles to share instances by budgets"),
    # tessera.models has no model without MIG: a GPU product it does not know is refused
    ({"matchLabels": {"tessera.dev/gpu.product": "L4"}}, {}, {},
     _WEBHOOK + f"spec.nodeSelector.matchLabels: unknown GPU model 'L4'; known models: "
     f"{_KNOWN_MODELS}"),
], ids=["profiles", "onDemand-with-Enabled", "unknown-profile", "maxInstances-A30", "Shares",
        "unknown-product"])
def test_on_demand_partition_refused_with_the_reason(
        cluster: Any, ops: Operators, pool: str, selector: dict[str, Any],
        layout: dict[str, Any], extra: dict[str, Any], message: str) -> None:
    name = f"{pool}-refused"
    out = cluster.kubectl("apply", "-f", "-",
                          input=on_demand_json(name, pool, selector, layout, **extra))
    assert out.returncode != 0
    assert message in out.stderr, out.stderr
    assert cluster.kubectl("get", "gpupartition", name).returncode != 0  # nothing was stored
