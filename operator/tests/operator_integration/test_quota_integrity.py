"""Quota integrity under attack, against the real API server and two operator replicas: what
a namespace user (a ServiceAccount bound to ``edit``) can write, and faults an administrator
or a crash can cause.  Each attack broke the quota before (issue: "Quota integrity"); each
test asserts what a platform engineer needs: no budget is granted past ``hard``, and a quota
that cannot be enforced says so and admits nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.kube.client import ApiError, Kube, load_credentials, path
from tessera_e2e.gpubed.daemons import bound_token, create_node
from tessera_e2e.operator.quotas import managed_rq, wait_admitting
from tessera_e2e.operator.replicas import render_chart, token_kubeconfig
from tessera_e2e.operator.tenants import tenant_kubeconfig

from .conftest import Operators
from .harness import kubectl_json, wait_until
from .test_quota_admission import pod, quota, used

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

GIB = 1 << 30
ONE_GIB = {"tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}
NODE = "integrity-node"


def budget_bytes(p: dict[str, Any]) -> int:
    b = json.loads(p["metadata"]["annotations"]["tessera.dev/budget"])
    return int(sum(c["memoryBytes"] * c["shares"] for c in b["containers"].values()))


def live_total(cluster: Any, ns: str) -> int:
    """The GPU memory budgets of the namespace's pods that hold one, in bytes."""
    pods = kubectl_json(cluster, "get", "pods", "-n", ns, "-l", "tessera.dev/budgeted=true")
    return sum(budget_bytes(p) for p in pods["items"]
               if p["status"].get("phase") not in ("Succeeded", "Failed"))


def requested_mib(cluster: Any, ns: str) -> int:
    """What the API server's quota admission should count now: the ``tessera.dev/vgpu-memory``
    requests of the namespace's pods that have not finished, growth holders included."""
    pods = kubectl_json(cluster, "get", "pods", "-n", ns)["items"]
    return sum(int((c.get("resources") or {}).get("requests", {}).get(
                   "tessera.dev/vgpu-memory", "0"))
               for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")
               for c in p["spec"]["containers"])


def forged_budget(gib: int) -> str:
    return json.dumps({"version": 1, "quota": "team", "weight": 100, "containers": {
        "main": {"shares": 1, "memoryBytes": gib * GIB, "cores": 100}}})


async def _burst(kubeconfig: Path, ns: str, bodies: list[dict[str, Any]],
                 delay_s: float = 0.0) -> list[str]:
    """Create the pods at once (after ``delay_s``); the names admitted."""
    kube = Kube(load_credentials(str(kubeconfig)))
    try:
        if delay_s:
            await asyncio.sleep(delay_s)

        async def one(body: dict[str, Any]) -> str | None:
            try:
                await kube.create(path("", "v1", "pods", ns), body)
            except ApiError:
                return None
            return str(body["metadata"]["name"])
        made = await asyncio.gather(*(one(b) for b in bodies))
        return [m for m in made if m]
    finally:
        await kube.close()


def burst(kubeconfig: Path, ns: str, prefix: str, n: int,
          limits: dict[str, str] | None = None) -> list[str]:
    bodies = [json.loads(pod(ns, f"{prefix}-{i}", limits or ONE_GIB)) for i in range(n)]
    return asyncio.run(_burst(kubeconfig, ns, bodies))


@pytest.fixture
def tenant(cluster: Any, namespace: str, tmp_path: Path) -> Path:
    return tenant_kubeconfig(cluster, namespace, tmp_path)


def setup_quota(cluster: Any, ns: str, name: str = "team", **hard: Any) -> None:
    cluster.wait_for_service_account(ns)
    body = json.loads(quota(ns, name, hard=hard or {"memory": "5Gi", "cores": 1000,
                                                     "pods": 100}))
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns, name)


# -- 1. only tessera writes what tessera trusts ------------------------------------------------

def test_a_resize_outcome_forged_at_create_grants_no_budget(
        cluster: Any, namespace: str, ops: Operators, tenant: Path) -> None:
    """A pod created with ``tessera.dev/budget-resize: {"state":"Refused","previous":<80
    GiB>}`` under hard 4Gi, max 2Gi: the operator used to restore the 80 GiB within 0.1 s
    (and the managed ResourceQuota's hard dropped to 0)."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "4Gi", "cores": 400, "pods": 10}, max_={"memory": "2Gi"}))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    forged = json.dumps({"request": "x", "state": "Refused", "reason": "r",
                         "previous": forged_budget(80)})
    body = json.loads(pod(ns, "greedy", ONE_GIB))
    body["metadata"]["annotations"] = {"tessera.dev/budget-resize": forged,
                                       "tessera.dev/budget": forged_budget(500)}
    body["metadata"]["labels"] = {"tessera.dev/budgeted": "true"}
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    assert "metadata.annotations[tessera.dev/budget-resize] removed: it is written only by " \
           "tessera" in out.stderr, out.stderr
    time.sleep(1.5)  # the operator acted within 0.1 s before
    p = kubectl_json(cluster, "get", "pod", "greedy", "-n", ns)
    assert "tessera.dev/budget-resize" not in p["metadata"]["annotations"]
    assert budget_bytes(p) == GIB
    wait_until("counted", lambda: used(cluster, ns).get("memory") == "1Gi", 10, 0.1)
    rq = managed_rq(cluster, ns) or {}
    assert rq["spec"]["hard"]["requests.tessera.dev/vgpu-memory"] == "4096"
    # the namespace's honest pods are admitted
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=pod(ns, "honest", ONE_GIB))
    assert out.returncode == 0, out.stderr

    # through a workload's pod template: refused at apply, naming the key
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "greedy", "namespace": ns},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "g"}},
                           "template": {"metadata": {"labels": {"app": "g"},
                                                     "annotations": {
                                                         "tessera.dev/budget-resize": forged}},
                                        "spec": body["spec"]}}}
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "greedy",
                                                                 "namespace": ns},
           "spec": {"template": {"metadata": {"annotations": {
               "tessera.dev/budget": forged_budget(80)}},
               "spec": {**body["spec"], "restartPolicy": "Never"}}}}
    for obj, key in ((deployment, "tessera.dev/budget-resize"), (job, "tessera.dev/budget")):
        out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                              input=json.dumps(obj))
        assert out.returncode != 0, obj["kind"]
        assert "ValidatingAdmissionPolicy 'tessera-pod-templates'" in out.stderr, out.stderr
        assert f"the pod template carries {key}: written only by tessera" in out.stderr


def test_a_claim_budget_a_tenant_writes_is_removed_at_create_and_refused_after(
        cluster: Any, namespace: str, ops: Operators, tenant: Path) -> None:
    """``tessera.dev/claim-budget`` is what the node holds a DRA claim's containers to after
    a live resize: a pod created with one (an 80 GiB budget for a claim of 4 GiB) and the
    ``budgeted=claims`` label has both removed at admission, with a warning; written on a
    running pod, it is refused, naming how to ask for a resize instead."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    forged = json.dumps({"00000000-0000-4000-8000-000000000001": {
        "claim": "mine", "memoryMiB": 81920, "cores": 100, "allocatedMemoryMiB": 4096,
        "allocatedCores": 30}})
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "claims", "namespace": ns,
                         "annotations": {"tessera.dev/claim-budget": forged},
                         "labels": {"tessera.dev/budgeted": "claims"}},
            "spec": {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]}}
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    assert "metadata.annotations[tessera.dev/claim-budget] removed: it is written only by " \
           "tessera" in out.stderr, out.stderr
    p = kubectl_json(cluster, "get", "pod", "claims", "-n", ns)
    assert "tessera.dev/claim-budget" not in (p["metadata"].get("annotations") or {})
    assert "tessera.dev/budgeted" not in (p["metadata"].get("labels") or {})
    out = cluster.kubectl("--kubeconfig", str(tenant), "annotate", "pod", "claims", "-n", ns,
                          f"tessera.dev/claim-budget={forged}")
    assert out.returncode != 0
    assert "ValidatingAdmissionPolicy 'tessera-pod-budget'" in out.stderr, out.stderr
    assert "ask for a resize with tessera.dev/budget-request" in out.stderr, out.stderr


@pytest.fixture(scope="module")
def node_kubeconfig(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node daemon's credentials on NODE (a token bound to its pod there)."""
    create_node(cluster.kubectl, NODE)
    return token_kubeconfig(cluster.kubeconfig, tmp_path_factory.mktemp("node-kc"),
                            bound_token(cluster.kubectl, NODE), "integrity-node")


def test_a_resize_outcome_tessera_did_not_seal_is_never_acted_on(
        cluster: Any, namespace: str, ops: Operators, node_kubeconfig: Path) -> None:
    """The one writer besides the operator (a node daemon's ServiceAccount, e.g. a stolen
    token) writes a node refusal that restores an 80 GiB "previous" budget: ignored."""
    ns = namespace
    setup_quota(cluster, ns, memory="4Gi", cores=400, pods=10)
    body = json.loads(pod(ns, "a", ONE_GIB))
    body["spec"]["nodeName"] = NODE
    out = cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    forged = json.dumps({"request": "x", "state": "Refused", "reason": "on this node",
                         "previous": forged_budget(80), "seal": "0" * 64})
    out = cluster.kubectl("--kubeconfig", str(node_kubeconfig), "annotate", "--overwrite",
                          "pod", "a", "-n", ns, f"tessera.dev/budget-resize={forged}")
    assert out.returncode == 0, out.stderr
    wait_until("the record ignored", lambda: "previous" not in json.loads(kubectl_json(
        cluster, "get", "pod", "a", "-n", ns)["metadata"]["annotations"][
        "tessera.dev/budget-resize"]), 20, 0.1)
    p = kubectl_json(cluster, "get", "pod", "a", "-n", ns)
    assert budget_bytes(p) == GIB
    assert "did not write" in json.loads(p["metadata"]["annotations"][
        "tessera.dev/budget-resize"])["reason"]
    wait_until("the BudgetResizeRecordIgnored Event (posted after the patch)", lambda: any(
        e.get("reason") == "BudgetResizeRecordIgnored"
        for e in kubectl_json(cluster, "get", "events", "-n", ns)["items"]), 20, 0.2)
    assert used(cluster, ns).get("memory") == "1Gi"


def test_a_gpu_pod_cannot_ask_for_what_would_go_around_its_budget(
        cluster: Any, namespace: str, ops: Operators, tenant: Path) -> None:
    """A tenant's privileged GPU pod (or SYS_ADMIN, an unmasked /proc, seccomp Unconfined)
    could mount a budget of its own over the runtime's: refused at admission; a GPU pod
    naming no seccomp profile gets the runtime's default one."""
    ns = namespace
    setup_quota(cluster, ns)
    bad = json.loads(pod(ns, "root", ONE_GIB))
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=json.dumps(bad))
    assert out.returncode != 0
    assert "container 'main' is privileged: not allowed in a pod with a GPU budget" in \
        out.stderr, out.stderr
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=pod(ns, "plain", ONE_GIB))
    assert out.returncode == 0, out.stderr
    assert kubectl_json(cluster, "get", "pod", "plain", "-n", ns)["spec"]["securityContext"][
        "seccompProfile"] == {"type": "RuntimeDefault"}
    # a pod that asks for no GPU is not tessera's to judge
    cpu = json.loads(pod(ns, "cpu", None))
    cpu["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    out = cluster.kubectl("create", "-f", "-", input=json.dumps(cpu))
    assert out.returncode == 0, out.stderr


# -- 2. resize growth never races creates ------------------------------------------------------

async def _resize_and_create(kubeconfig: Path, ns: str, trial: int) -> None:
    kube = Kube(load_credentials(str(kubeconfig)))
    try:
        request = json.dumps({"main": {"memory": "2Gi"}})

        async def grow(i: int) -> None:
            await kube.merge_patch(path("", "v1", "pods", ns, f"run-{trial}-{i}"), {
                "metadata": {"annotations": {"tessera.dev/budget-request": request}}})

        async def create(i: int) -> None:
            with contextlib.suppress(ApiError):
                await kube.create(path("", "v1", "pods", ns),
                                  json.loads(pod(ns, f"new-{trial}-{i}", ONE_GIB)))
        await asyncio.gather(*(grow(i) for i in range(8)), *(create(i) for i in range(8)))
    finally:
        await kube.close()


def test_resize_growth_never_races_creates_past_hard(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """Eight running 1 GiB pods ask for 2 GiB while eight new 1 GiB pods are created, hard
    16Gi with 8Gi used: 17Gi of live budgets in 3 of 7 trials before (each lowering of the
    managed ResourceQuota's hard made kube-controller-manager recount from a stale cache)."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    over = []
    for trial in range(8):
        name = f"t{trial}"
        out = cluster.kubectl("apply", "-f", "-", input=quota(
            ns, name, hard={"memory": "16Gi", "cores": 10000, "pods": 100}))
        assert out.returncode == 0, out.stderr
        wait_admitting(cluster, ns, name)
        bodies = [json.loads(pod(ns, f"run-{trial}-{i}", ONE_GIB)) for i in range(8)]
        assert len(asyncio.run(_burst(cluster.kubeconfig, ns, bodies))) == 8
        asyncio.run(_resize_and_create(cluster.kubeconfig, ns, trial))
        time.sleep(2)  # every resize answered, every holder settled
        total = live_total(cluster, ns)
        rq = (managed_rq(cluster, ns, name) or {}).get("status") or {}
        rq_used = int((rq.get("used") or {}).get("requests.tessera.dev/vgpu-memory", "0"))
        if total > 16 * GIB or rq_used > 16384:
            over.append((trial, total / GIB, rq_used, requested_mib(cluster, ns)))
        # the next trial starts from an empty namespace
        cluster.kubectl("delete", "gpuquota", name, "-n", ns, "--wait=true")
        cluster.kubectl("delete", "pods", "--all", "-n", ns, "--grace-period=0", "--force")
        wait_until("empty", lambda: not kubectl_json(cluster, "get", "pods", "-n", ns)[
            "items"] and managed_rq(cluster, ns, name) is None, 60, 0.5)  # noqa: B023
    assert over == [], (
        f"trials over hard (trial, live GiB, ResourceQuota used MiB, requests counted MiB): "
        f"{over}")


# -- 3. a quota that cannot be enforced says so and admits nothing -----------------------------

def test_a_gpuquota_name_of_any_length_is_enforced(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """A GPUQuota named with 64-253 characters (a valid name) got no ResourceQuota (its
    label refused) while it said Ready: a burst admitted 20 pods against room for 5."""
    ns = namespace
    name = "q" * 60 + "." + "long-" * 30 + "name"
    assert 64 <= len(name) <= 253
    setup_quota(cluster, ns, name, memory="5Gi", cores=1000, pods=100)
    rq = managed_rq(cluster, ns, name) or {}
    assert rq["metadata"]["annotations"]["tessera.dev/gpuquota-name"] == name
    admitted = burst(cluster.kubeconfig, ns, "p", 20)
    assert len(admitted) == 5, admitted
    q = kubectl_json(cluster, "get", "gpuquota", name, "-n", ns)
    ready = next(c for c in q["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("True", "Counted")


def _ready(cluster: Any, ns: str, name: str = "team") -> dict[str, Any]:
    q = kubectl_json(cluster, "get", "gpuquota", name, "-n", ns)
    return next((c for c in (q.get("status") or {}).get("conditions") or []
                 if c["type"] == "Ready"), {})


def test_a_foreign_resourcequota_by_the_managed_name_is_not_adopted_and_admits_nothing(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """An administrator's ResourceQuota already named gpuquota-team was silently ignored
    (20 pods admitted against room for 5)."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    foreign = {"apiVersion": "v1", "kind": "ResourceQuota",
               "metadata": {"name": "gpuquota-team", "namespace": ns},
               "spec": {"hard": {"requests.tessera.dev/vgpu-memory": "1000000"}}}
    assert cluster.kubectl("create", "-f", "-", input=json.dumps(foreign)).returncode == 0
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "5Gi", "cores": 1000, "pods": 100}))
    assert out.returncode == 0, out.stderr
    wait_until("Ready=False", lambda: _ready(cluster, ns).get("reason")
               == "ManagedQuotaForeign", 20, 0.2)
    assert "is not this GPUQuota's" in _ready(cluster, ns)["message"]
    assert burst(cluster.kubeconfig, ns, "p", 20) == []
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "one", ONE_GIB))
    assert out.returncode != 0
    assert 'GPUQuota "team" cannot be enforced now: ResourceQuota gpuquota-team is not this ' \
           "GPUQuota's" in out.stderr, out.stderr
    ev = kubectl_json(cluster, "get", "events", "-n", ns)["items"]
    assert any(e.get("reason") == "ManagedQuotaForeign" and e["type"] == "Warning" for e in ev)
    for rep in ops.replicas.values():
        assert f'tessera_quota_enforced{{namespace="{ns}",quota="team"}} 0.0' in rep.metrics()
    # the administrator removes theirs: tessera makes its own, and it counts
    assert cluster.kubectl("delete", "resourcequota", "gpuquota-team", "-n", ns).returncode == 0
    wait_admitting(cluster, ns)
    wait_until("Ready", lambda: _ready(cluster, ns).get("status") == "True", 20, 0.2)
    assert len(burst(cluster.kubeconfig, ns, "q", 20)) == 5


def test_a_lost_label_and_a_raised_hard_are_set_back(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """A removed label was never restored, and a hard raised then was never set back (20
    pods admitted against room for 5)."""
    ns = namespace
    setup_quota(cluster, ns)
    out = cluster.kubectl("label", "resourcequota", "gpuquota-team", "-n", ns,
                          "tessera.dev/gpuquota-")
    assert out.returncode == 0, out.stderr
    out = cluster.kubectl("patch", "resourcequota", "gpuquota-team", "-n", ns, "--type=merge",
                          "-p", '{"spec":{"hard":{"requests.tessera.dev/vgpu-memory":"99999"}}}')
    assert out.returncode == 0, out.stderr
    admitted = burst(cluster.kubeconfig, ns, "p", 20)
    assert len(admitted) <= 5, admitted
    wait_until("label and hard set back", lambda: (
        ((managed_rq(cluster, ns) or {}).get("metadata") or {}).get("labels") or {}).get(
        "tessera.dev/gpuquota") == "team" and (managed_rq(cluster, ns) or {})["spec"]["hard"][
        "requests.tessera.dev/vgpu-memory"] == "5120", 20, 0.1)
    time.sleep(2)
    assert len(admitted) + len(burst(cluster.kubeconfig, ns, "q", 20)) == 5


@pytest.mark.parametrize("delay_s", [0.0, 0.05])
def test_a_deleted_managed_resourcequota_admits_nothing_until_it_counts_again(
        cluster: Any, namespace: str, ops: Operators, delay_s: float) -> None:
    """For the ~110-180 ms after the managed ResourceQuota was deleted nothing counted: 20
    of a burst 0 s or 0.05 s after the delete were admitted against room for 5."""
    ns = namespace
    setup_quota(cluster, ns)
    kube_path = cluster.kubeconfig

    async def delete_then_burst() -> list[str]:
        kube = Kube(load_credentials(str(kube_path)))
        try:
            await kube.delete(path("", "v1", "resourcequotas", ns, "gpuquota-team"))
        finally:
            await kube.close()
        bodies = [json.loads(pod(ns, f"p-{i}", ONE_GIB)) for i in range(20)]
        return await _burst(kube_path, ns, bodies, delay_s)
    admitted = asyncio.run(delete_then_burst())
    assert len(admitted) <= 5, admitted
    wait_admitting(cluster, ns)
    time.sleep(1)
    later = burst(cluster.kubeconfig, ns, "q", 20)
    assert len(admitted) + len(later) == 5, (admitted, later)
    assert live_total(cluster, ns) == 5 * GIB


def test_a_deleted_managed_resourcequota_and_a_killed_leader_admit_nothing_meanwhile(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """The managed ResourceQuota deleted as the leader is SIGKILLed: 19 of 5 were admitted
    in the 5.9 s until the Lease moved and the new leader made it again."""
    ns = namespace
    setup_quota(cluster, ns)
    leader = ops.leader()
    assert cluster.kubectl("delete", "resourcequota", "gpuquota-team", "-n", ns,
                           "--wait=false").returncode == 0  # tessera's finalizer holds it
    leader.kill()
    try:
        admitted: list[str] = []
        deadline = time.monotonic() + 12
        i = 0
        while time.monotonic() < deadline:
            admitted += burst(cluster.kubeconfig, ns, f"p{i}", 5)
            i += 1
            time.sleep(0.3)
        assert len(admitted) <= 5, admitted
        wait_admitting(cluster, ns, timeout_s=30)
        time.sleep(1)
        assert len(admitted) + len(burst(cluster.kubeconfig, ns, "q", 20)) == 5
    finally:
        ops.ensure_running()


def test_hard_pods_is_held_as_exactly_as_memory(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """hard.pods 5 admitted 30 of a 30-pod burst: it was held only by tessera's check
    against a count written 0.1 s after a change."""
    ns = namespace
    setup_quota(cluster, ns, memory="100Gi", cores=10000, pods=5)
    admitted = burst(cluster.kubeconfig, ns, "p", 30)
    assert len(admitted) == 5, admitted
    wait_until("counted", lambda: used(cluster, ns).get("pods") == 5, 10, 0.1)
    # a pod that asks for no GPU is not a GPU pod: not counted, not limited
    for i in range(3):
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, f"cpu-{i}", None))
        assert out.returncode == 0, out.stderr


# -- 5. the small ones ---------------------------------------------------------------------------

def test_a_pod_of_over_a_mebibyte_is_reviewed_not_refused_with_an_opaque_413(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_quota(cluster, ns)
    big = json.loads(pod(ns, "big", ONE_GIB))
    big["spec"]["containers"][0]["args"] = ["x" * (1200 << 10)]
    out = cluster.kubectl("create", "-f", "-", input=json.dumps(big))
    assert out.returncode == 0, out.stderr
    assert budget_bytes(kubectl_json(cluster, "get", "pod", "big", "-n", ns)) == GIB


@pytest.fixture
def holder(cluster: Any, namespace: str, ops: Operators) -> Iterator[tuple[str, str]]:
    """A resized pod with a growth holder: (its name, the holder's)."""
    ns = namespace
    setup_quota(cluster, ns, memory="8Gi", cores=1000, pods=10)
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "a", ONE_GIB))
    assert out.returncode == 0, out.stderr
    out = cluster.kubectl("annotate", "pod", "a", "-n", ns,
                          'tessera.dev/budget-request={"main": {"memory": "3Gi"}}')
    assert out.returncode == 0, out.stderr

    def holder_name() -> str:
        items = kubectl_json(cluster, "get", "pods", "-n", ns, "-l", "tessera.dev/growth-of")[
            "items"]
        return str(items[0]["metadata"]["name"]) if items else ""
    yield "a", wait_until("a holder", holder_name, 20, 0.1)


def test_a_tenant_cannot_free_what_a_growth_holder_holds(
        cluster: Any, namespace: str, holder: tuple[str, str], tenant: Path) -> None:
    ns = namespace
    _, name = holder
    for args in (["delete", "pod", name], ["label", "pod", name, "x=y"],
                 ["patch", "pod", name, "--type=json", "-p",
                  '[{"op":"remove","path":"/spec/schedulingGates"}]']):
        out = cluster.kubectl("--kubeconfig", str(tenant), *args, "-n", ns)
        assert out.returncode != 0, args
        assert "is a growth holder" in out.stderr, out.stderr
    evict = {"apiVersion": "policy/v1", "kind": "Eviction",
             "metadata": {"name": name, "namespace": ns}}
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "--raw",
                          f"/api/v1/namespaces/{ns}/pods/{name}/eviction", "-f", "-",
                          input=json.dumps(evict))
    assert out.returncode != 0 and "is a growth holder" in out.stderr, out.stderr
    # nor make one of their own
    fake = json.loads(pod(ns, "tessera-growth-mine", {"tessera.dev/vgpu-memory": "1"}))
    out = cluster.kubectl("--kubeconfig", str(tenant), "create", "-f", "-",
                          input=json.dumps(fake))
    assert out.returncode != 0 and "growth holders" in out.stderr, out.stderr


def test_a_growth_that_loses_its_holder_and_its_room_goes_back_to_the_limits(
        cluster: Any, namespace: str, ops: Operators, holder: tuple[str, str]) -> None:
    """An administrator, with tessera stopped and its policies and webhook removed, deletes a
    holder and fills the room it held: once tessera runs again the pod's budget is set back
    to its limits (a budget the count does not hold never stays)."""
    ns = namespace
    name, held = holder
    wait_until("approved", lambda: budget_bytes(kubectl_json(
        cluster, "get", "pod", name, "-n", ns)) == 3 * GIB, 20, 0.1)
    ops.stop_all()
    try:
        for kind, obj in (("validatingadmissionpolicybinding", "tessera-growth-holders"),
                          ("mutatingwebhookconfiguration", "tessera-pods")):
            assert cluster.kubectl("delete", kind, obj).returncode == 0
        # the API server takes a moment to drop a policy binding
        wait_until("the holder deleted", lambda: cluster.kubectl(
            "delete", "pod", held, "-n", ns).returncode == 0, 20, 0.5)
        # a's limits (1Gi) are counted; 7Gi is free now: raw pods take it all
        assert len(burst(cluster.kubeconfig, ns, "fill", 7)) == 7
    finally:
        cluster.kubectl("apply", "-f", "-", input=render_chart())
        ops.ensure_running()
    wait_until("taken back", lambda: budget_bytes(kubectl_json(
        cluster, "get", "pod", name, "-n", ns)) == GIB, 30, 0.2)
    wait_until("the BudgetGrowthTakenBack Event (posted after the patch)", lambda: any(
        e.get("reason") == "BudgetGrowthTakenBack"
        for e in kubectl_json(cluster, "get", "events", "-n", ns)["items"]), 20, 0.2)
    status = json.loads(kubectl_json(cluster, "get", "pod", name, "-n", ns)["metadata"][
        "annotations"]["tessera.dev/budget-resize"])
    assert status["state"] == "Refused" and "no longer held" in status["reason"]


def test_a_namespace_with_growth_holders_can_be_emptied_and_deleted(
        cluster: Any, namespace: str, holder: tuple[str, str]) -> None:
    """A collection delete of the namespace's pods (what the namespace controller sends)
    passes the holders' policy (it has no name to match) and takes the holders with it."""
    ns = namespace
    kube_path = cluster.kubeconfig

    async def delete_all() -> None:
        kube = Kube(load_credentials(str(kube_path)))
        try:
            await kube.delete(path("", "v1", "pods", ns))
        finally:
            await kube.close()
    asyncio.run(delete_all())
    wait_until("every pod gone", lambda: not kubectl_json(
        cluster, "get", "pods", "-n", ns)["items"], 30, 0.2)
    out = cluster.kubectl("delete", "namespace", ns, "--timeout=60s")
    assert out.returncode == 0, out.stderr
