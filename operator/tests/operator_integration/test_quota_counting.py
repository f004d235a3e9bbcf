"""Quota usage: only pods that exist count, nothing overshoots, drift heals under churn.

Against the real API server and two replicas: forged reviews and pods the API server
refuses hold no GPUQuota usage; a slow later webhook causes no overshoot (the API server's
quota admission, against the ResourceQuota the GPUQuota manages, counts last); a refusal
after tessera's webhook holds nothing; a later mutating webhook's change is budgeted; a
quota created over running pods admits nothing past ``hard``; drift heals within 10 s under
churn; ``vgpu-memory: 0`` is refused; quantities mean what Kubernetes says.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.operator.webhooks import ReviewServer
from tessera_operator.webhooks.certs import make_serving_cert

from .conftest import Operators
from .harness import kubectl_json, wait_until
from .test_quota_admission import pod, quota, setup_ns, used

pytestmark = pytest.mark.integration

GPU = {"tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}


def _create(cluster: Any, body: dict[str, Any] | str) -> Any:
    return cluster.kubectl("create", "-f", "-",
                           input=body if isinstance(body, str) else json.dumps(body))


def _pods(cluster: Any, ns: str) -> int:
    return len(kubectl_json(cluster, "get", "pods", "-n", ns, "-l",
                            "tessera.dev/budgeted=true")["items"])


def _status(cluster: Any, ns: str, name: str = "team") -> dict[str, Any]:
    out: dict[str, Any] = kubectl_json(cluster, "get", "gpuquota", name, "-n", ns).get(
        "status") or {}
    return out


# -- only pods that can exist count ------------------------------------------------------------

def _review(ns: str, name: str, uid: str) -> bytes:
    obj = json.loads(pod(ns, name, GPU))
    obj["metadata"]["uid"] = uid
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": str(uuid.uuid4()), "operation": "CREATE",
                                   "namespace": ns, "object": obj}}).encode()


def _post(port: int, path: str, body: bytes, cert: tuple[Path, Path] | None) -> int:
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(*cert)
    req = urllib.request.Request(f"https://127.0.0.1:{port}{path}", data=body,
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (ssl.SSLError, ConnectionError, urllib.error.URLError):
        return 0  # refused in the handshake


def test_forged_reviews_are_refused_and_hold_no_quota(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """Forged reviews are refused unread (and would change nothing if they were read)."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 1000, "pods": 10}))
    other_client = (cluster.pki.admin_cert, cluster.pki.admin_key)  # the cluster's, not the
    answers = []                                                   # webhook client CA's
    for i in range(12):
        for rep in ops.replicas.values():
            for path in ("/mutate/pods", "/validate/gpuquotas"):
                for cert in (None, other_client):
                    answers.append(_post(rep.webhook_port, path,
                                         _review(ns, f"forged-{i}", str(uuid.uuid4())), cert))
    assert set(answers) <= {0, 403}, answers  # no review read without the API server's cert
    assert used(cluster, ns).get("pods") == 0
    out = _create(cluster, pod(ns, "real", GPU))
    assert out.returncode == 0, out.stderr  # the first real pod is admitted at once


def test_creates_the_api_server_refuses_hold_no_quota(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """requests != limits, a duplicate container name, vgpu over 64: each is refused, says
    why, and neither the GPUQuota nor the API server's count holds anything for it."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 1000, "pods": 3}))
    assert _create(cluster, pod(ns, "a", GPU)).returncode == 0
    unequal = json.loads(pod(ns, "unequal", GPU))
    unequal["spec"]["containers"][0]["resources"]["requests"] = {
        "tessera.dev/vgpu-memory": "512", "tessera.dev/vgpu-cores": "10"}
    twins = json.loads(pod(ns, "twins", GPU))
    twins["spec"]["containers"].append(dict(twins["spec"]["containers"][0]))
    wide = json.loads(pod(ns, "wide", {"tessera.dev/vgpu": "65", **GPU}))
    for body, says in ((unequal, "must be equal to"), (twins, "Duplicate value"),
                       (wide, "tessera.dev/vgpu 65 is more than 64 GPU shares; ask for at "
                              "most 64")):
        for _ in range(3):
            out = _create(cluster, body)
            assert out.returncode != 0 and says in out.stderr, out.stderr
            assert "pydantic" not in out.stderr and "validation error" not in out.stderr
    # nothing is held for any of them: the quota has room for exactly two more, right now
    wait_until("counted", lambda: used(cluster, ns).get("pods") == 1, 10, 0.1)
    assert _create(cluster, pod(ns, "b", GPU)).returncode == 0
    assert _create(cluster, pod(ns, "c", GPU)).returncode == 0
    out = _create(cluster, pod(ns, "d", GPU))
    assert out.returncode == 1 and "exceeded" in out.stderr, out.stderr


def test_a_taken_name_is_refused_and_the_gpuquota_counts_nothing_for_it(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """Creating a pod under a name already taken passes every admission step and is then
    refused by storage: GPUQuota counts nothing for it; Kubernetes' own quota admission has
    charged it and keeps the charge until its controller recounts (docs/operator.md)."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 1000, "pods": 100}))
    assert _create(cluster, pod(ns, "a", GPU)).returncode == 0
    for _ in range(18):
        out = _create(cluster, pod(ns, "a", GPU))
        assert out.returncode != 0
        assert 'Error from server (AlreadyExists)' in out.stderr, out.stderr
        assert 'pods "a" already exists' in out.stderr, out.stderr
    wait_until("counted", lambda: used(cluster, ns).get("pods") == 1, 10, 0.1)
    time.sleep(1)
    assert used(cluster, ns).get("pods") == 1


def _later(request: dict[str, Any], _: Any) -> tuple[bool, str]:
    """A validating webhook after tessera's: slow (20 s) for pods labelled ``slow``,
    refusing those labelled ``refuse``."""
    labels = request["object"]["metadata"].get("labels") or {}
    if "slow" in labels:
        time.sleep(20)
    return "refuse" not in labels, "refused by a later webhook"


@pytest.fixture
def later_webhook(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[None]:
    """A second validating webhook for pods of ``namespace`` labelled ``later``."""
    cert = make_serving_cert(["127.0.0.1"])
    _, crt, key = cert.write(tmp_path / "later-webhook")
    hook = ReviewServer(_later, crt, key)
    name = f"later-{namespace}"
    config = hook.configuration(name, cert.ca_pem, ["pods"], namespace, {
        "matchExpressions": [{"key": "later", "operator": "Exists"}]}, timeout_s=30)
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(config))
    assert out.returncode == 0, out.stderr
    time.sleep(1)  # the API server's webhook configuration cache
    yield
    cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")
    hook.stop()


def _labelled(ns: str, name: str, *labels: str) -> dict[str, Any]:
    body = json.loads(pod(ns, name, GPU))
    body["metadata"]["labels"] = {"later": "true", **{k: "true" for k in labels}}
    return body


def test_a_slow_later_webhook_causes_no_overshoot(
        cluster: Any, namespace: str, ops: Operators, later_webhook: None) -> None:
    """A pod behind a 20 s webhook while others are created: the API server's quota
    admission runs after every webhook, so whichever pod comes last past ``hard`` is
    refused, by tessera's check or by the ResourceQuota's, and the quota never overshoots."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 20, "pods": 10}))
    with cf.ThreadPoolExecutor(max_workers=1) as bg:
        slow = bg.submit(_create, cluster, _labelled(ns, "slow", "slow"))
        time.sleep(1)
        made = [_create(cluster, pod(ns, "first", GPU)).returncode]
        for i in range(3):
            time.sleep(4)
            out = _create(cluster, pod(ns, f"more-{i}", GPU))
            made.append(out.returncode)
            if out.returncode != 0:
                assert "exceeded GPUQuota" in out.stderr, out.stderr
        late = slow.result()
    if late.returncode != 0:
        assert "exceeded quota: gpuquota-team" in late.stderr, late.stderr
        print(f"the slow pod, refused by the ResourceQuota: {late.stderr.strip()}")
    assert made.count(0) + (late.returncode == 0) == 2
    assert _pods(cluster, ns) == 2
    wait_until("counted", lambda: used(cluster, ns).get("cores") == 20, 10, 0.2)


def test_a_refusal_after_tessera_holds_nothing(
        cluster: Any, namespace: str, ops: Operators, later_webhook: None) -> None:
    """What refuses a pod after tessera's webhook (another webhook) refuses it before the
    API server's quota admission counts it: the next pod is admitted at once."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 10, "pods": 1}))
    out = _create(cluster, _labelled(ns, "refused", "refuse"))
    assert out.returncode != 0 and "refused by a later webhook" in out.stderr, out.stderr
    out = _create(cluster, pod(ns, "now", GPU))
    assert out.returncode == 0, out.stderr
    out = _create(cluster, pod(ns, "then", GPU))
    assert out.returncode != 0 and "exceeded" in out.stderr, out.stderr


def test_a_budget_changed_by_a_later_webhook_is_the_budget_counted(
        cluster: Any, namespace: str, ops: Operators, tmp_path: Path) -> None:
    """A mutating webhook after tessera's raises a pod's GPU memory: tessera's webhook runs
    again, so the budget the node enforces, the GPUQuota's count and the ResourceQuota's
    all say what the stored pod asks for."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns))

    def double(request: dict[str, Any], _: Any) -> tuple[bool, str, list[dict[str, Any]]]:
        limits = request["object"]["spec"]["containers"][0]["resources"]["limits"]
        if limits.get("tessera.dev/vgpu-memory") == "2048":
            return True, "", []
        return True, "", [{"op": "replace", "value": "2048", "path":
                           f"/spec/containers/0/resources/{part}/tessera.dev~1vgpu-memory"}
                          for part in ("limits", "requests")]  # requests default to limits

    cert = make_serving_cert(["127.0.0.1"])
    _, crt, key = cert.write(tmp_path / "doubler")
    hook = ReviewServer(double, crt, key)
    name = f"zz-doubler-{ns}"  # mutating webhooks run in configuration-name order
    config = hook.configuration(name, cert.ca_pem, ["pods"], ns, mutating=True)
    try:
        assert cluster.kubectl("apply", "-f", "-", input=json.dumps(config)).returncode == 0
        time.sleep(1)  # the API server's webhook configuration cache
        out = _create(cluster, pod(ns, "doubled", GPU))
        assert out.returncode == 0, out.stderr
        p = kubectl_json(cluster, "get", "pod", "doubled", "-n", ns)
        budget = json.loads(p["metadata"]["annotations"]["tessera.dev/budget"])
        assert budget["containers"]["main"]["memoryBytes"] == 2048 * 2**20
        wait_until("counted", lambda: used(cluster, ns).get("memory") == "2Gi", 10, 0.2)
    finally:
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
        hook.stop()


# -- a quota counts its namespace before it admits -----------------------------------

def test_a_quota_created_over_running_pods_admits_nothing_past_hard(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, "wide", hard={"memory": "100Gi", "cores": 1000,
                                                  "pods": 100}))
    with cf.ThreadPoolExecutor(max_workers=10) as pool:
        made = list(pool.map(lambda i: _create(cluster, pod(ns, f"run-{i}", GPU)).returncode,
                             range(10)))
    assert made == [0] * 10
    for attempt, hard in enumerate((5, 3)):
        created = time.monotonic()
        out = cluster.kubectl("apply", "-f", "-", input=quota(ns, "narrow", hard={
            "memory": "100Gi", "cores": 1000, "pods": hard}))
        assert out.returncode == 0, out.stderr
        with cf.ThreadPoolExecutor(max_workers=5) as pool:
            tries = list(pool.map(lambda i, a=attempt: _create(
                cluster, pod(ns, f"more-{a}-{i}", GPU)), range(5)))
        assert [t.returncode for t in tries] == [1] * 5, [t.stderr for t in tries]
        assert all('GPUQuota "narrow"' in t.stderr for t in tries), [t.stderr for t in tries]
        wait_until("narrow counted", lambda: used(cluster, ns, "narrow").get("pods") == 10,
                   10, 0.05)
        counted = time.monotonic() - created
        wait_until("Degraded", lambda: any(
            c["type"] == "Degraded" and c["status"] == "True" and c["reason"] == "OverHard"
            for c in _status(cluster, ns, "narrow").get("conditions") or []), 10, 0.1)
        print(f"quota created over 10 pods (hard {hard}): counted within {counted:.2f} s, "
              f"Degraded within {time.monotonic() - created:.2f} s")
        assert _pods(cluster, ns) == 10
        cluster.kubectl("delete", "gpuquota", "narrow", "-n", ns)


# -- drift heals within 10 s, under churn too -------------------------------------------

def _churn(cluster: Any, ns: str, period_s: float, stop: threading.Event) -> int:
    """One pod created and deleted every ``period_s``."""
    n = 0
    while not stop.is_set():
        t0 = time.monotonic()
        name = f"churn-{n}"
        if _create(cluster, pod(ns, name, GPU)).returncode == 0:
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
        n += 1
        stop.wait(max(0.0, period_s - (time.monotonic() - t0)))
    return n


def _healed_within(cluster: Any, ns: str, period_s: float, start: float) -> float:
    """Seconds from ``start`` until ``used`` is the three steady pods (plus at most the one
    churning pod), with churn going on all along."""
    stop = threading.Event()
    with cf.ThreadPoolExecutor(max_workers=1) as bg:
        churn = bg.submit(_churn, cluster, ns, period_s, stop)
        try:
            wait_until("drift healed", lambda: used(cluster, ns)["pods"] <= 4
                       and used(cluster, ns)["cores"] == used(cluster, ns)["pods"] * 10, 30,
                       0.1)
            healed = time.monotonic() - start
            time.sleep(2 * period_s)  # and it stays healed under churn
            assert used(cluster, ns)["pods"] <= 4
        finally:
            stop.set()
            assert churn.result() >= 1
    exact = {"memory": "3Gi", "cores": 30, "pods": 3, "migInstances": {}}
    seen: list[dict[str, Any]] = []
    try:
        wait_until("exact", lambda: seen.append(used(cluster, ns)) or seen[-1] == exact, 15, 0.2)
    except TimeoutError as exc:
        raise AssertionError(f"used stays {seen[-1]}, not the steady pods' {exact}") from exc
    return healed


@pytest.mark.parametrize("period_s", [3.5, 0.5])
def test_drift_heals_within_ten_seconds_under_churn(
        cluster: Any, namespace: str, ops: Operators, period_s: float) -> None:
    """Four pods too many in ``used`` (a status edited by hand), healed while a pod is
    created and deleted every ``period_s``; then four deletes while no replica ran, healed
    after the restart, also under churn."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "100Gi", "cores": 1000, "pods": 50}))
    for i in range(3):
        assert _create(cluster, pod(ns, f"steady-{i}", GPU)).returncode == 0
    start = time.monotonic()
    out = cluster.kubectl("patch", "gpuquota", "team", "-n", ns, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {"used": {
                              "memory": "7Gi", "cores": 70, "pods": 7}}}))
    assert out.returncode == 0, out.stderr
    healed = _healed_within(cluster, ns, period_s, start)
    print(f"churn every {period_s} s: 4 pods too many healed in {healed:.1f} s")
    assert healed <= 10, healed
    # releases missed while the operator was down
    for i in range(4):
        assert _create(cluster, pod(ns, f"gone-{i}", GPU)).returncode == 0
    ops.stop_all()
    try:
        for i in range(4):
            assert cluster.kubectl("delete", "pod", f"gone-{i}", "-n", ns).returncode == 0
    finally:
        ops.ensure_running()
    start = time.monotonic()
    healed = _healed_within(cluster, ns, period_s, start)
    print(f"churn every {period_s} s: 4 deletes missed while down healed {healed:.1f} s "
          f"after the restart")
    assert healed <= 10, healed


# -- a budget without memory ------------------------------------------------------------------

def test_zero_memory_is_refused(cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns))
    for limits in ({"tessera.dev/vgpu-memory": "0"},
                   {"tessera.dev/vgpu": "1", "tessera.dev/vgpu-memory": "0"}):
        out = _create(cluster, pod(ns, "zero", limits))
        assert out.returncode != 0, limits
        assert ("tessera.dev/vgpu-memory is 0, and a GPU budget without memory is no "
                "budget: ask for the MiB it needs (at least 1)") in out.stderr, out.stderr


# -- one exact quantity parser --------------------------------------------------------

def test_milli_memory_is_a_limit_not_no_limit(cluster: Any, namespace: str,
                                              ops: Operators) -> None:
    """``hard.memory: 10000000000000m`` is 10 GB (9537 MiB): 100,000 MiB pods were admitted."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "10000000000000m", "pods": 10}))
    out = _create(cluster, pod(ns, "huge", {"tessera.dev/vgpu-memory": "100000"}))
    assert out.returncode != 0
    assert ("exceeded GPUQuota \"team\": tessera.dev/vgpu-memory requested 100000Mi, used 0Mi, "
            "hard 9537Mi") in out.stderr, out.stderr
    assert _create(cluster, pod(ns, "fits", {"tessera.dev/vgpu-memory": "9537"})).returncode == 0
    # the count is debounced: wait for it, then it must be the whole limit (never "no limit")
    wait_until("counted", lambda: _status(cluster, ns).get("summary", {}).get("memory")
               == "9537Mi/9537Mi", 10, 0.2)


def test_a_limit_the_operator_cannot_read_refuses_pods_and_says_which(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """With a schema that lets anything through (an old CRD: Helm never upgrades them) and
    the quota applied while the operator was down (its GPUQuota webhook fails open), an
    unreadable limit is an error naming the field, never "no limit"."""
    ns = namespace
    path = ("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/hard/"
            "properties/memory")
    crd = kubectl_json(cluster, "get", "crd", "gpuquotas.tessera.dev")
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]["hard"]["properties"]["memory"]
    relax = [{"op": "remove", "path": f"{path}/pattern"}]
    restore = [{"op": "add", "path": f"{path}/pattern", "value": schema["pattern"]}]
    assert cluster.kubectl("patch", "crd", "gpuquotas.tessera.dev", "--type=json", "-p",
                           json.dumps(relax)).returncode == 0
    try:
        cluster.wait_for_service_account(ns)
        ops.stop_all()
        try:
            wait_until("the relaxed schema", lambda: cluster.kubectl(
                "apply", "-f", "-", input=quota(ns, hard={"memory": "40GB", "pods": 10}))
                .returncode == 0, 20, 0.5)
        finally:
            ops.ensure_running()
        says = ("spec.hard.memory '40GB' cannot be read ('40GB' is not a non-negative "
                "Kubernetes quantity (e.g. 40Gi, 512Mi, 8G)): fix the GPUQuota; until then it "
                "admits no GPU pods")
        wait_until("the condition", lambda: any(
            c["type"] == "Ready" and c["status"] == "False" and c["reason"] ==
            "SpecUnreadable" and c["message"] == says
            for c in _status(cluster, ns).get("conditions") or []), 10, 0.2)
        out = _create(cluster, pod(ns, "p", GPU))
        assert out.returncode != 0 and f'GPUQuota "team": {says}' in out.stderr, out.stderr
    finally:
        cluster.kubectl("delete", "gpuquota", "team", "-n", ns)
        assert cluster.kubectl("patch", "crd", "gpuquotas.tessera.dev", "--type=json", "-p",
                               json.dumps(restore)).returncode == 0
