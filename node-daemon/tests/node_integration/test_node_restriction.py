"""The chart's tessera-node-restriction policy: a daemon writes tessera's keys on its own
Node only, and only with a pod-bound token (which carries the node name)."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.gpubed.daemons import DAEMON_SA, bound_token, create_node
from tessera_e2e.operator.replicas import OPERATOR_NS, token_kubeconfig

pytestmark = pytest.mark.integration


def as_token(chart: Any, tmp_path: Path, token: str, *args: str
             ) -> subprocess.CompletedProcess[str]:
    kc = token_kubeconfig(chart.kubeconfig, tmp_path, token, f"t-{uuid.uuid4().hex[:6]}")
    return subprocess.run([str(chart.kubectl_path), "--kubeconfig", str(kc), *args],
                          capture_output=True, text=True, timeout=60)


def patch(chart: Any, tmp_path: Path, token: str, node: str, body: dict[str, Any],
          status: bool = False) -> subprocess.CompletedProcess[str]:
    sub = ["--subresource=status"] if status else []
    return as_token(chart, tmp_path, token, "patch", "node", node, *sub, "--type=merge",
                    "-p", json.dumps(body))


def label(key: str, value: str = "x") -> dict[str, Any]:
    return {"metadata": {"labels": {key: value}}}


def refused(out: subprocess.CompletedProcess[str], why: str) -> bool:
    return "tessera-node-restriction" in out.stderr and why in out.stderr


def test_a_daemon_writes_tessera_keys_on_its_own_node_only(chart: Any, tmp_path: Path) -> None:
    a, b = (f"nr-{uuid.uuid4().hex[:8]}" for _ in range(2))
    for n in (a, b):
        create_node(chart.kubectl, n)
    try:
        on_a, on_b = bound_token(chart.kubectl, a), bound_token(chart.kubectl, b)
        # its own Node: tessera.dev/ labels, annotations and extended resources
        ok = patch(chart, tmp_path, on_a, a, {"metadata": {
            "labels": {"tessera.dev/gpu.count": "8"},
            "annotations": {"tessera.dev/gpus": "[]"}}})
        assert ok.returncode == 0, ok.stderr
        ok = patch(chart, tmp_path, on_a, a, {"status": {"capacity": {
            "tessera.dev/vgpu-memory": "1000"}}}, status=True)
        assert ok.returncode == 0, ok.stderr
        # another node's
        out = patch(chart, tmp_path, on_b, a, label("tessera.dev/gpu.count"))
        assert refused(out, f"tessera-node on node {b} may not modify node {a}"), out.stderr
        # an unbound token: no node name
        unbound = chart.kubectl("create", "token", DAEMON_SA, "-n", OPERATOR_NS)
        assert unbound.returncode == 0, unbound.stderr
        out = patch(chart, tmp_path, unbound.stdout.strip(), a, label("tessera.dev/gpu.count"))
        assert refused(out, "token bound to its pod"), out.stderr
        # its own Node, but not tessera's keys
        out = as_token(chart, tmp_path, on_a, "taint", "node", a, "gpu=busy:NoSchedule")
        assert refused(out, "may not change a Node's spec"), out.stderr
        out = as_token(chart, tmp_path, on_a, "cordon", a)
        assert refused(out, "may not change a Node's spec"), out.stderr
        out = patch(chart, tmp_path, on_a, a, label("team"))
        assert refused(out, "only tessera.dev/ labels"), out.stderr
        out = patch(chart, tmp_path, on_a, a, {"metadata": {"annotations": {"note": "x"}}})
        assert refused(out, "only tessera.dev/ annotations"), out.stderr
        out = patch(chart, tmp_path, on_a, a, {"status": {"capacity": {
            "nvidia.com/gpu": "8"}}}, status=True)
        assert refused(out, "only tessera.dev/ extended resources"), out.stderr
        node = json.loads(chart.kubectl("get", "node", a, "-o", "json").stdout)
        assert not (node["spec"].get("taints") or [])
        assert not node["spec"].get("unschedulable")
        assert "team" not in node["metadata"]["labels"]
        assert "nvidia.com/gpu" not in (node.get("status") or {}).get("capacity", {})
        # and RBAC: no creating or deleting Nodes at all
        out = as_token(chart, tmp_path, on_a, "delete", "node", b)
        assert out.returncode != 0 and "forbidden" in out.stderr.lower(), out.stderr
    finally:
        for n in (a, b):
            chart.kubectl("delete", "pod", f"{DAEMON_SA}-{n}", "-n", OPERATOR_NS,
                          "--wait=false")
            chart.kubectl("delete", "node", n, "--wait=false")


def test_a_daemon_answers_resizes_only_for_the_pods_on_its_node(
    chart: Any, tmp_path: Path
) -> None:
    """The budget-protection policy: tessera.dev/budget-resize may be written by a node
    daemon only on a pod bound to its own node (its pod-bound token's node name)."""
    a, b = (f"nr-{uuid.uuid4().hex[:8]}" for _ in range(2))
    ns = f"nr-{uuid.uuid4().hex[:6]}"
    chart.kubectl("create", "namespace", ns)
    for n in (a, b):
        create_node(chart.kubectl, n)
    try:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
               "spec": {"nodeName": a, "containers": [{"name": "main", "image": "busybox"}]}}
        out = chart.kubectl("create", "-f", "-", input=json.dumps(pod))
        assert out.returncode == 0, out.stderr
        on_a, on_b = bound_token(chart.kubectl, a), bound_token(chart.kubectl, b)
        outcome = json.dumps({"request": "r1", "state": "Applied"})
        args = ("annotate", "pod", "p", "-n", ns, "--overwrite",
                f"tessera.dev/budget-resize={outcome}")
        out = as_token(chart, tmp_path, on_b, *args)
        assert "only on a pod bound to its own node" in out.stderr, out.stderr
        unbound = chart.kubectl("create", "token", DAEMON_SA, "-n", OPERATOR_NS)
        out = as_token(chart, tmp_path, unbound.stdout.strip(), *args)
        assert "only on a pod bound to its own node" in out.stderr, out.stderr
        out = as_token(chart, tmp_path, on_a, *args)
        assert out.returncode == 0, out.stderr
        got = json.loads(chart.kubectl("get", "pod", "p", "-n", ns, "-o", "json").stdout)
        assert got["metadata"]["annotations"]["tessera.dev/budget-resize"] == outcome
        # and not the budget itself, even on its own node
        out = as_token(chart, tmp_path, on_a, "annotate", "pod", "p", "-n", ns,
                       "tessera.dev/budget={}")
        assert out.returncode != 0 and "tessera.dev/budget] is written only by tessera" in \
            out.stderr
    finally:
        chart.kubectl("delete", "namespace", ns, "--wait=false")
        for n in (a, b):
            chart.kubectl("delete", "pod", f"{DAEMON_SA}-{n}", "-n", OPERATOR_NS,
                          "--wait=false")
            chart.kubectl("delete", "node", n, "--wait=false")
