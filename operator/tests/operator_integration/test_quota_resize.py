"""Live resize against the real API server and the operator (two replicas): grow and shrink
with the quota following, refusals for the per-pod max and for hard (Event + status), and
the node daemon's refusal rolled back. The node's decision is the daemon's own pure code
(tessera_node.deviceplugin.resize), its status written the way the daemon writes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.gpubed.daemons import bound_token, create_node
from tessera_e2e.operator.quotas import managed_rq
from tessera_e2e.operator.replicas import token_kubeconfig
from tessera_node.deviceplugin.resize import decide

from .conftest import Operators
from .harness import kubectl_json, wait_until
from .test_quota_admission import pod, quota, setup_ns, used

pytestmark = pytest.mark.integration

GPU = "GPU-11111111-2222-3333-4444-555555555555"
NODE = "resize-node"


def annotations(cluster: Any, ns: str, name: str) -> dict[str, str]:
    a: dict[str, str] = kubectl_json(cluster, "get", "pod", name, "-n", ns)["metadata"].get(
        "annotations") or {}
    return a


def status(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    raw = annotations(cluster, ns, name).get("tessera.dev/budget-resize")
    return json.loads(raw) if raw else {}


def request(cluster: Any, ns: str, name: str, req: dict[str, Any]) -> None:
    out = cluster.kubectl("annotate", "--overwrite", "pod", name, "-n", ns,
                          f"tessera.dev/budget-request={json.dumps(req)}")
    assert out.returncode == 0, out.stderr


def answered(cluster: Any, ns: str, name: str, state: str) -> dict[str, Any]:
    wait_until(f"resize {state}", lambda: status(cluster, ns, name).get("state") == state,
               20, 0.1)
    return status(cluster, ns, name)


def budget_of(cluster: Any, ns: str, name: str) -> dict[str, Any]:
    b: dict[str, Any] = json.loads(annotations(cluster, ns, name)["tessera.dev/budget"])
    return b["containers"]["main"]


@pytest.fixture(scope="module")
def node_kubeconfig(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The node daemon's credentials on NODE: a token of its ServiceAccount bound to its pod
    there (the chart's RBAC and policies apply; a daemon answers resizes only on its node)."""
    create_node(cluster.kubectl, NODE)
    return token_kubeconfig(cluster.kubeconfig, tmp_path_factory.mktemp("node-kc"),
                            bound_token(cluster.kubectl, NODE), "node")


def pod_on_node(ns: str, name: str, limits: dict[str, str]) -> str:
    """A budgeted pod bound to NODE, as the scheduler would have bound it."""
    body = json.loads(pod(ns, name, limits))
    body["spec"]["nodeName"] = NODE
    return json.dumps(body)


def node_answers(cluster: Any, kc: Path, ns: str, name: str, committed_elsewhere: int
                 ) -> dict[str, Any]:
    """The node daemon's step, as its ServiceAccount: decide against what else is committed
    on the GPU (80 GiB), write the outcome on the pod."""
    out = decide(annotations(cluster, ns, name), "main", [GPU], [], {GPU: 80 << 30},
                 {GPU: [committed_elsewhere]})
    assert out is not None
    patch = {"metadata": {"annotations": out.annotation_patch()}}
    r = cluster.kubectl("--kubeconfig", str(kc), "patch", "pod", name, "-n", ns,
                        "--type=merge", "-p", json.dumps(patch))
    assert r.returncode == 0, r.stderr
    return out.annotation_patch()


def events(cluster: Any, ns: str, reason: str) -> list[str]:
    ev = kubectl_json(cluster, "get", "events", "-n", ns)
    return [e["message"] for e in ev["items"] if e.get("reason") == reason]


def test_grow_shrink_and_refusals(cluster: Any, namespace: str, ops: Operators,
                                  node_kubeconfig: Path) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "8Gi", "cores": 200, "pods": 10},
                                max_={"memory": "6Gi", "cores": 100}))
    for name, mem in (("a", "2048"), ("b", "2048")):
        out = cluster.kubectl("create", "-f", "-", input=pod_on_node(ns, name, {
            "tessera.dev/vgpu": "1", "tessera.dev/vgpu-memory": mem,
            "tessera.dev/vgpu-cores": "30"}))
        assert out.returncode == 0, out.stderr
    wait_until("counted", lambda: used(cluster, ns).get("memory") == "4Gi", 10, 0.1)

    # grow a to 4Gi / 40 cores: approved, the quota holds the growth, the node applies it
    request(cluster, ns, "a", {"main": {"memory": "4Gi", "cores": 40}})
    st = answered(cluster, ns, "a", "Approved")
    assert st["grow"] == {"memoryMiB": 2048, "cores": 10}
    assert budget_of(cluster, ns, "a")["memoryBytes"] == 4 << 30
    assert budget_of(cluster, ns, "a")["cores"] == 40
    wait_until("used follows", lambda: used(cluster, ns)["memory"] == "6Gi"
               and used(cluster, ns)["cores"] == 70, 20, 0.1)
    # the ResourceQuota counts a's limits (2Gi, 30 cores) and, before the resize was
    # approved, a growth holder of 2Gi and 10 cores the API server admitted like any pod;
    # its hard stays the GPUQuota's
    assert holders(cluster, ns) == {"a": [{"memory": "2048", "cores": "10"}]}
    assert rq_used(cluster, ns) == {"memory": "6144", "cores": "70"}
    assert rq_hard(cluster, ns) == {"memory": "8192", "cores": "200"}
    # the pod's owner cannot write the outcome (nor the budget) themselves
    forged = json.dumps({"request": st["request"], "state": "Refused", "reason": "x",
                         "previous": annotations(cluster, ns, "a")["tessera.dev/budget"]})
    out = cluster.kubectl("annotate", "--overwrite", "pod", "a", "-n", ns,
                          f"tessera.dev/budget-resize={forged}")
    assert out.returncode != 0, out.stderr
    assert "tessera.dev/budget-resize] is written only by tessera" in out.stderr, out.stderr
    node_answers(cluster, node_kubeconfig, ns, "a", committed_elsewhere=10 << 30)
    assert answered(cluster, ns, "a", "Applied") == {
        "request": st["request"], "state": "Applied"}

    # over the per-pod max: refused, with the reason and a Warning Event; nothing changes
    request(cluster, ns, "a", {"main": {"memory": "7Gi"}})
    st = answered(cluster, ns, "a", "Refused")
    assert 'over the per-pod GPUQuota "team" max 6Gi' in st["reason"], st
    wait_until("refusal event", lambda: any(
        "budget request refused" in m for m in events(cluster, ns, "BudgetResizeRefused")),
        20, 0.2)
    assert budget_of(cluster, ns, "a")["memoryBytes"] == 4 << 30

    # over hard: 6Gi used + 3Gi more > 8Gi
    request(cluster, ns, "b", {"main": {"memory": "5Gi"}})
    st = answered(cluster, ns, "b", "Refused")
    assert 'exceeded GPUQuota "team": tessera.dev/vgpu-memory requested 3Gi, used 6Gi, ' \
           "hard 8Gi" in st["reason"], st
    assert used(cluster, ns)["memory"] == "6Gi"

    # shrink a to 1Gi: the GPUQuota counts it at once; its growth stays held until the node
    # decides (a refusal would bring the 4Gi back), then only its cores' growth is
    request(cluster, ns, "a", {"main": {"memory": "1Gi"}})
    answered(cluster, ns, "a", "Approved")
    wait_until("shrink counted", lambda: used(cluster, ns)["memory"] == "3Gi", 20, 0.1)
    assert rq_used(cluster, ns) == {"memory": "6144", "cores": "70"}
    node_answers(cluster, node_kubeconfig, ns, "a", committed_elsewhere=0)
    answered(cluster, ns, "a", "Applied")
    wait_until("growth released", lambda: rq_used(cluster, ns) == {
        "memory": "4096", "cores": "70"}, 20, 0.1)  # a is below its limits' memory now

    # now b may grow to 5Gi (3Gi + 3Gi <= 8Gi); the node refuses it for GPU memory (76Gi
    # committed elsewhere on the 80 GiB GPU): the operator restores b's budget and gives
    # the growth back
    request(cluster, ns, "b", {"main": {"memory": "5Gi"}, "@id": "again"})
    answered(cluster, ns, "b", "Approved")
    wait_until("growth held", lambda: used(cluster, ns)["memory"] == "6Gi", 20, 0.1)
    node_answers(cluster, node_kubeconfig, ns, "b", committed_elsewhere=76 << 30)
    wait_until("rolled back", lambda: "previous" not in status(cluster, ns, "b")
               and budget_of(cluster, ns, "b")["memoryBytes"] == 2 << 30, 20, 0.1)
    st = status(cluster, ns, "b")
    assert st["state"] == "Refused" and st["reason"].startswith("on this node: memory budgets")
    wait_until("growth given back", lambda: used(cluster, ns)["memory"] == "3Gi", 20, 0.1)
    wait_until("its holder too", lambda: rq_used(cluster, ns) == {
        "memory": "4096", "cores": "70"}, 20, 0.1)
    # the recount agrees with what was written on the pods
    wait_until("recount stable", lambda: used(cluster, ns)["memory"] == "3Gi"
               and used(cluster, ns)["cores"] == 70, 20, 0.2)
    assert rq_hard(cluster, ns) == {"memory": "8192", "cores": "200"}
    # a's growth ends with a (its holder goes with it)
    # bound to a node without a kubelet: nothing would confirm a graceful delete
    assert cluster.kubectl("delete", "pod", "a", "-n", ns, "--grace-period=0", "--force"
                           ).returncode == 0
    wait_until("growth gone", lambda: rq_used(cluster, ns) == {"memory": "2048", "cores": "30"}
               and holders(cluster, ns) == {}, 30, 0.2)


def _short(hard: dict[str, str]) -> dict[str, str]:
    return {k.rsplit("-", 1)[1]: v for k, v in hard.items()
            if k.endswith(("vgpu-memory", "vgpu-cores"))}


def rq_hard(cluster: Any, ns: str) -> dict[str, str]:
    """The managed ResourceQuota's memory and cores hard (status: what it enforces)."""
    return _short(((managed_rq(cluster, ns) or {}).get("status") or {}).get("hard") or {})


def rq_used(cluster: Any, ns: str) -> dict[str, str]:
    """What the API server counts in the managed ResourceQuota: memory and cores used."""
    return _short(((managed_rq(cluster, ns) or {}).get("status") or {}).get("used") or {})


def holders(cluster: Any, ns: str) -> dict[str, list[dict[str, str]]]:
    """The growth holders of the namespace, by the name of the pod they hold for."""
    out: dict[str, list[dict[str, str]]] = {}
    for h in kubectl_json(cluster, "get", "pods", "-n", ns, "-l", "tessera.dev/growth-of")[
            "items"]:
        limits = h["spec"]["containers"][0]["resources"]["limits"]
        owner = h["metadata"]["ownerReferences"][0]["name"]
        out.setdefault(owner, []).append(_short(limits))
    return out


def test_cli_verb_refusal_and_bad_input(cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "4Gi", "cores": 100, "pods": 10}))
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "a", {
        "tessera.dev/vgpu": "1", "tessera.dev/vgpu-memory": "2048"}))
    assert out.returncode == 0, out.stderr
    cli = [sys.executable, "-m", "tessera_operator.cli.main", "resize", "a", "-n", ns,
           "--kubeconfig", str(cluster.kubeconfig)]
    r = subprocess.run([*cli, "--memory", "8Gi", "--wait", "20"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 1, (r.stdout, r.stderr)
    assert "resize refused: exceeded GPUQuota" in r.stderr
    r = subprocess.run([*cli, "--cores", "-5"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "cores must be a whole number" in r.stderr, r.stderr
    # approved by the operator; no node daemon here answers, so the verb says it is pending
    r = subprocess.run([*cli, "--memory", "3Gi", "--wait", "10"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 3 and "resize Approved yet" in r.stderr, (r.stdout, r.stderr)
