"""Pod admission against the real API server: fill, deny messages, dry run, counts."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera_e2e.operator.quotas import enforced, managed_rq, wait_admitting

from .conftest import Operators
from .harness import kubectl_json, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]


def quota(ns: str, name: str = "team", hard: dict[str, Any] | None = None,
          default: dict[str, Any] | None = None, max_: dict[str, Any] | None = None) -> str:
    spec: dict[str, Any] = {"hard": hard or {"memory": "10Gi", "cores": 100, "pods": 10}}
    if default:
        spec["default"] = default
    if max_:
        spec["max"] = max_
    return json.dumps({"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
                       "metadata": {"name": name, "namespace": ns}, "spec": spec})


def pod(ns: str, name: str, limits: dict[str, str] | None) -> str:
    c: dict[str, Any] = {"name": "main", "image": "busybox"}
    if limits is not None:
        c["resources"] = {"limits": limits}
    return json.dumps({"apiVersion": "v1", "kind": "Pod",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"containers": [c]}})


def used(cluster: Any, ns: str, name: str = "team") -> dict[str, Any]:
    q = kubectl_json(cluster, "get", "gpuquota", name, "-n", ns)
    u: dict[str, Any] = (q.get("status") or {}).get("used") or {}
    return u


def setup_ns(cluster: Any, ns: str, q: str) -> None:
    """The namespace's ServiceAccount, and the quota once the operator has counted it (a
    quota never counted admits nothing) and the API server enforces its ResourceQuota."""
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=q)
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns, json.loads(q)["metadata"]["name"])


def test_defaults_filled_budget_written_and_over_quota_denied(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "6Gi", "cores": 100, "pods": 10},
                                default={"memory": "2Gi", "cores": 30},
                                max_={"memory": "4Gi", "cores": 100}))
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "a", {"tessera.dev/vgpu": "1"}))
    assert out.returncode == 0, out.stderr
    p = kubectl_json(cluster, "get", "pod", "a", "-n", ns)
    limits = p["spec"]["containers"][0]["resources"]["limits"]
    assert limits["tessera.dev/vgpu-memory"] == "2048"
    assert limits["tessera.dev/vgpu-cores"] == "30"
    budget = json.loads(p["metadata"]["annotations"]["tessera.dev/budget"])
    assert budget["containers"]["main"]["memoryBytes"] == 2 * 2**30
    assert budget["quota"] == "team"
    assert p["metadata"]["labels"]["tessera.dev/budgeted"] == "true"
    # the count is the leader's, from the pods (debounced): wait for it
    wait_until("counted", lambda: used(cluster, ns) == {
        "memory": "2Gi", "cores": 30, "pods": 1, "migInstances": {}}, 10, 0.1)

    # over the per-pod max
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "big", {
        "tessera.dev/vgpu": "1", "tessera.dev/vgpu-memory": "5000"}))
    assert out.returncode != 0
    assert ('admission webhook "pods.tessera.dev" denied the request: pod asks for '
            'tessera.dev/vgpu-memory 5000Mi in total, over the per-pod GPUQuota "team" max 4Gi'
            in out.stderr), out.stderr
    # fits max, not hard: 2Gi used + 4Gi = 6Gi fits; then 3Gi more does not
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "b", {
        "tessera.dev/vgpu-memory": "4096", "tessera.dev/vgpu-cores": "50"}))
    assert out.returncode == 0, out.stderr
    # tessera's message needs b counted; a create before that is refused all the same, by
    # the API server's count against the managed ResourceQuota (its own message)
    wait_until("b counted", lambda: used(cluster, ns).get("memory") == "6Gi", 10, 0.1)
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "c", {
        "tessera.dev/vgpu-memory": "3072", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode != 0
    assert ('Error from server (Forbidden): error when creating "STDIN": admission webhook '
            '"pods.tessera.dev" denied the request: exceeded GPUQuota "team": '
            "tessera.dev/vgpu-memory requested 3Gi, used 6Gi, hard 6Gi") in out.stderr, out.stderr
    assert used(cluster, ns)["memory"] == "6Gi"


def test_dry_run_reserves_nothing_and_plain_pods_untouched(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, default={"memory": "1Gi"}))
    out = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                          input=pod(ns, "dry", {"tessera.dev/vgpu": "1"}))
    assert out.returncode == 0, out.stderr
    dry = json.loads(out.stdout)
    assert dry["spec"]["containers"][0]["resources"]["limits"]["tessera.dev/vgpu-cores"] == "100"
    assert "tessera.dev/budget" in dry["metadata"]["annotations"]
    assert used(cluster, ns).get("pods", 0) == 0
    # a dry run that would not fit is refused all the same
    out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=pod(ns, "dry2", {
        "tessera.dev/vgpu-memory": str(11 * 1024)}))
    assert "exceeded GPUQuota" in out.stderr
    # a pod without tessera resources never reaches the webhook; a forged budget is removed
    plain = json.loads(pod(ns, "plain", None))
    plain["metadata"]["annotations"] = {"tessera.dev/budget": "{}"}
    out = cluster.kubectl("create", "-f", "-", input=json.dumps(plain))
    assert out.returncode == 0, out.stderr
    p = kubectl_json(cluster, "get", "pod", "plain", "-n", ns)
    assert "tessera.dev/budget" not in (p["metadata"].get("annotations") or {})


def test_used_is_exact_after_deletes_and_finished_pods(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns))
    for i in range(4):
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, f"p{i}", {
            "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
        assert out.returncode == 0, out.stderr
    wait_until("counted", lambda: used(cluster, ns) == {
        "memory": "4Gi", "cores": 40, "pods": 4, "migInstances": {}}, 10, 0.1)
    assert cluster.kubectl("delete", "pod", "p0", "p1", "-n", ns).returncode == 0
    # p2 finishes (what the kubelet would write)
    out = cluster.kubectl("patch", "pod", "p2", "-n", ns, "--subresource=status", "--type=merge",
                          "-p", '{"status":{"phase":"Succeeded"}}')
    assert out.returncode == 0, out.stderr
    wait_until("releases", lambda: used(cluster, ns).get("pods") == 1, 20)
    assert used(cluster, ns) == {"memory": "1Gi", "cores": 10, "pods": 1, "migInstances": {}}
    # deleting the finished pod gives nothing back twice
    assert cluster.kubectl("delete", "pod", "p2", "-n", ns).returncode == 0
    q = kubectl_json(cluster, "get", "gpuquota", "team", "-n", ns)
    conds = {c["type"]: c["status"] for c in q["status"]["conditions"]}
    assert conds["Ready"] == "True" and conds["Degraded"] == "False"
    import time
    time.sleep(3)  # a recount or two
    assert used(cluster, ns) == {"memory": "1Gi", "cores": 10, "pods": 1, "migInstances": {}}
    # hard shrinks below what is used: a warning, Degraded, existing pods stay, new refused
    out = cluster.kubectl("patch", "gpuquota", "team", "-n", ns, "--type=merge", "-p",
                          '{"spec":{"hard":{"cores":5}}}')
    assert out.returncode == 0, out.stderr
    assert ("Warning: spec.hard.cores 5 is below what admitted pods use now (10): they keep "
            "running, new pods are refused") in out.stderr, out.stderr
    wait_until("Degraded", lambda: any(
        c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "OverHard"
        for c in kubectl_json(cluster, "get", "gpuquota", "team", "-n", ns)["status"][
            "conditions"]), 20)
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "late", {
        "tessera.dev/vgpu-memory": "10", "tessera.dev/vgpu-cores": "1"}))
    assert "tessera.dev/vgpu-cores requested 1, used 10, hard 5" in out.stderr, out.stderr
    assert kubectl_json(cluster, "get", "pod", "p3", "-n", ns)["metadata"]["name"] == "p3"


def test_admitted_budget_metadata_cannot_be_edited_or_removed(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """A pod owner cannot raise a running pod's budget or hide it from the quota count."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns))
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "a", {
        "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode == 0, out.stderr
    before = kubectl_json(cluster, "get", "pod", "a", "-n", ns)["metadata"]
    raised = json.dumps({"version": 1, "containers": {"main": {
        "shares": 1, "memoryBytes": 80 * 2**30, "cores": 100}}})
    for args, says in (
            (["annotate", "--overwrite", "pod", "a", f"tessera.dev/budget={raised}"],
             "metadata.annotations[tessera.dev/budget] is written only by tessera"),
            (["annotate", "pod", "a", "tessera.dev/budget-"],
             "metadata.annotations[tessera.dev/budget] is written only by tessera"),
            (["label", "pod", "a", "tessera.dev/budgeted-"],
             "metadata.labels[tessera.dev/budgeted] is written only by tessera")):
        out = cluster.kubectl(*args, "-n", ns)
        assert out.returncode != 0, args
        assert "ValidatingAdmissionPolicy 'tessera-pod-budget'" in out.stderr, out.stderr
        assert says in out.stderr, out.stderr
    after = kubectl_json(cluster, "get", "pod", "a", "-n", ns)["metadata"]
    assert after["annotations"] == before["annotations"]
    assert after["labels"] == before["labels"]
    # everything else on the pod stays the owner's to change
    out = cluster.kubectl("annotate", "pod", "a", "team.example/owner=alice", "-n", ns)
    assert out.returncode == 0, out.stderr
    # and a plain pod cannot be given a budget after admission either
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "plain", None))
    assert out.returncode == 0, out.stderr
    out = cluster.kubectl("label", "pod", "plain", "tessera.dev/budgeted=true", "-n", ns)
    assert out.returncode != 0 and "tessera-pod-budget" in out.stderr, out.stderr


def test_each_gpuquota_manages_a_resourcequota_that_edits_and_deletes_cannot_undo(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """The API server's own quota admission counts GPU pods race-free against the
    ResourceQuota a GPUQuota manages: its hard follows the GPUQuota's, it is owned by it,
    and what a user changes on it is set back."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "4Gi", "cores": 100, "pods": 10,
                                          "migInstances": {"1g.10gb": 2}}))
    rq = managed_rq(cluster, ns)
    assert rq is not None
    assert rq["spec"]["hard"] == {"requests.tessera.dev/vgpu-memory": "4096",
                                  "requests.tessera.dev/vgpu-cores": "100",
                                  "requests.tessera.dev/pod": "10",
                                  "requests.tessera.dev/mig-1g.10gb": "2"}
    owner = rq["metadata"]["ownerReferences"][0]
    q = kubectl_json(cluster, "get", "gpuquota", "team", "-n", ns)
    assert (owner["kind"], owner["name"], owner["uid"]) == ("GPUQuota", "team",
                                                           q["metadata"]["uid"])
    assert rq["metadata"]["labels"]["tessera.dev/gpuquota"] == "team"
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "a", {
        "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode == 0, out.stderr
    wait_until("the API server counted it", lambda: ((managed_rq(cluster, ns) or {}).get(
        "status") or {}).get("used", {}).get("requests.tessera.dev/vgpu-cores") == "10", 20)
    # a user raises the hard: set back
    out = cluster.kubectl("patch", "resourcequota", "gpuquota-team", "-n", ns, "--type=merge",
                          "-p", '{"spec":{"hard":{"requests.tessera.dev/vgpu-cores":"1000"}}}')
    assert out.returncode == 0, out.stderr
    wait_until("set back", lambda: (managed_rq(cluster, ns) or {}).get("spec", {}).get(
        "hard", {}).get("requests.tessera.dev/vgpu-cores") == "100", 20, 0.1)
    # it is deleted (an administrator; a namespace user may not): tessera's finalizer holds
    # it, terminating, and the API server keeps counting with it; GPU pods are still admitted
    out = cluster.kubectl("delete", "resourcequota", "gpuquota-team", "-n", ns, "--wait=false")
    assert out.returncode == 0, out.stderr
    wait_until("held", lambda: ((managed_rq(cluster, ns) or {}).get("metadata") or {}).get(
        "deletionTimestamp"), 20, 0.1)
    # the quota controller may have counted the user's 1000 before tessera set it back: it
    # counts the 100 again on its next sync of the (changed) spec
    wait_until("enforced while held", lambda: enforced(cluster, ns), 20, 0.1)
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "b", {
        "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode == 0, out.stderr
    wait_until("counted while held", lambda: ((managed_rq(cluster, ns) or {}).get(
        "status") or {}).get("used", {}).get("requests.tessera.dev/vgpu-cores") == "20", 20)
    # the GPUQuota's hard changes: so does its ResourceQuota's
    out = cluster.kubectl("patch", "gpuquota", "team", "-n", ns, "--type=merge", "-p",
                          '{"spec":{"hard":{"cores":50,"migInstances":null}}}')
    assert out.returncode == 0, out.stderr
    wait_until("follows", lambda: (managed_rq(cluster, ns) or {}).get("spec", {}).get(
        "hard") == {"requests.tessera.dev/vgpu-memory": "4096",
                    "requests.tessera.dev/vgpu-cores": "50",
                    "requests.tessera.dev/pod": "10"}, 20, 0.1)
    # the GPUQuota goes: so does its ResourceQuota (garbage collected, it owns it; tessera
    # lets go of it once the GPUQuota is gone)
    assert cluster.kubectl("delete", "gpuquota", "team", "-n", ns).returncode == 0
    wait_until("collected", lambda: managed_rq(cluster, ns) is None, 60, 0.5)


def test_spec_idle_admitted_warned_and_refused_by_the_api_server(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """GPUQuota ``spec.idle`` through the real API server and the operator's webhook: under
    a minute admitted with a warning kubectl prints, under 10s and in days refused naming the
    field, and a second quota of the namespace carrying the per-pod policy refused naming
    the one that carries it."""
    ns = namespace
    cluster.wait_for_service_account(ns)

    def apply(name: str, idle: dict[str, Any] | None, **spec: Any) -> Any:
        q = json.loads(quota(ns, name))
        q["spec"].update(spec)
        if idle is not None:
            q["spec"]["idle"] = idle
        return cluster.kubectl("apply", "-f", "-", input=json.dumps(q))

    out = apply("team", {"after": "10s", "action": "Evict"})
    assert out.returncode == 0, out.stderr
    assert "spec.idle.after 10s is under a minute" in out.stderr, out.stderr
    got = kubectl_json(cluster, "get", "gpuquota", "team", "-n", ns)["spec"]["idle"]
    assert got["after"] == "10s" and got["action"] == "Evict", got
    out = apply("team", {"after": "5s"})
    assert out.returncode != 0 and "spec.idle.after" in out.stderr, out.stderr
    out = apply("team", {"after": "2d"})
    assert out.returncode != 0 and "spec.idle.after" in out.stderr, out.stderr
    out = apply("other", {"after": "30m"})
    assert out.returncode != 0, out.stderr
    assert "weight, lending or idle, and gpuquota/team does" in out.stderr, out.stderr
    assert apply("other", None).returncode == 0  # a quota without the policy is fine
