"""Two replicas: concurrent admission, kill/restart, leader failover, no churn, operator down."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import json
import signal
import subprocess
import time
from typing import Any

import pytest

from tessera.kube.client import ApiError, Kube, load_credentials, path
from tessera_e2e.operator.quotas import managed_rq
from tessera_e2e.operator.replicas import json_stream

from .conftest import Operators
from .harness import kubectl_json, lease_holder, wait_until
from .test_partition import cond, node_json, partition_json, report
from .test_quota_admission import pod, quota, setup_ns, used

pytestmark = pytest.mark.integration


def _create_many(cluster: Any, ns: str, n: int, limits: dict[str, str],
                 replica_may_die: bool = False) -> list[bool]:
    def one(i: int) -> bool:
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, f"p{i:02d}", limits))
        if out.returncode != 0:
            # a replica killed mid-request drops that connection: the create fails, the user
            # retries; past hard, tessera's check refuses (on the GPUQuota's count) or, when
            # that count is a moment old, the API server's quota admission does
            died = replica_may_die and "failed calling webhook" in out.stderr
            assert died or "exceeded GPUQuota" in out.stderr or (
                "exceeded quota: gpuquota-team" in out.stderr), out.stderr
        return out.returncode == 0
    with cf.ThreadPoolExecutor(max_workers=n) as pool:
        return list(pool.map(one, range(n)))


MANAGED_WRITES = "tessera_managed_quota_writes_total"


def _counter(rep: Any, sample: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in rep.metrics().splitlines()
               if line.startswith(sample))


def _pods(cluster: Any, ns: str) -> int:
    return len(kubectl_json(cluster, "get", "pods", "-n", ns, "-l",
                            "tessera.dev/budgeted=true")["items"])


def test_fifty_concurrent_pods_through_two_replicas_exactly_ten_admitted(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 100, "memory": "100Gi"}))
    before = dict(ops.proxy.connections)
    results = _create_many(cluster, ns, 50, {"tessera.dev/vgpu-memory": "1024",
                                              "tessera.dev/vgpu-cores": "10"})
    assert sum(results) == 10
    assert _pods(cluster, ns) == 10
    wait_until("counted", lambda: used(cluster, ns) == {
        "memory": "10Gi", "cores": 100, "pods": 10, "migInstances": {}}, 10, 0.1)
    served = {p: ops.proxy.connections.get(p, 0) - before.get(p, 0)
              for p in ops.proxy.backends.values()}
    assert sum(1 for v in served.values() if v > 0) == 2, served


def test_replica_killed_mid_burst_nothing_lost_or_doubled(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 300, "memory": "100Gi"}))
    with cf.ThreadPoolExecutor(max_workers=1) as bg:
        fut = bg.submit(_create_many, cluster, ns, 40,
                        {"tessera.dev/vgpu-memory": "512", "tessera.dev/vgpu-cores": "10"}, True)
        time.sleep(0.5)
        victim = ops.leader()
        victim.kill()
        results = fut.result()
    ops.start(victim.name)
    admitted = _pods(cluster, ns)
    assert admitted <= 30
    wait_until("used exact", lambda: used(cluster, ns).get("cores") == admitted * 10, 30)
    # the API server's own count agrees: a create the kill cut off failed in its webhook
    # call, before the quota admission counted it
    rq = managed_rq(cluster, ns)
    assert rq is not None
    assert rq["status"]["used"]["requests.tessera.dev/vgpu-cores"] == str(admitted * 10)
    assert used(cluster, ns) == {"memory": f"{admitted * 512}Mi" if admitted % 2 else
                                 f"{admitted // 2}Gi", "cores": admitted * 10,
                                 "pods": admitted, "migInstances": {}}
    assert sum(results) == admitted  # every create that succeeded is a pod, no more


def test_restarted_replicas_are_routed_to_and_their_old_ports_are_not(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """The harness measures the operator, not its proxy: after restarts, requests only go
    to the replicas running now (a stale port can be taken by another process, which then
    answers the API server's requests with EOF)."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 1000, "memory": "100Gi"}))
    for name in [*ops.names, *ops.names]:
        ops.start(name)
    ops.ensure_running()
    live = {r.webhook_port for r in ops.replicas.values() if r.proc and r.proc.poll() is None}
    assert set(ops.proxy.backends.values()) == live and len(live) == len(ops.names)
    results = _create_many(cluster, ns, 30, {"tessera.dev/vgpu-memory": "256",
                                              "tessera.dev/vgpu-cores": "10"})
    assert all(results)


def test_leader_failover_within_lease_duration(cluster: Any, ops: Operators) -> None:
    leader = ops.leader()
    other = next(r for r in ops.replicas.values() if r.name != leader.name)
    leader.kill()
    t0 = time.monotonic()
    wait_until("failover", lambda: lease_holder(cluster) == other.name, 20, 0.1)
    took = time.monotonic() - t0
    assert took <= 6 + 2 + 1, took  # lease duration + one renew period (+ polling)
    assert 'tessera_leader 1.0' in other.metrics()
    ops.start(leader.name)


def test_a_leader_told_to_stop_serves_through_its_drain_then_gives_the_lease_up(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """SIGTERM to the leader: it goes on answering admission, not ready, for its drain
    (kopf, which runs only on the leader, installs signal handlers of its own that stopped
    the process at once: a create in flight then failed with EOF), then stops and empties
    the Lease for the other replica."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 1000, "memory": "100Gi"}))
    ops.stop_all()
    first, second = ops.names
    leader = ops.start(first, extra=["--shutdown-drain", "4"])
    wait_until("the drained replica leading", lambda: lease_holder(cluster) == first, 30)
    wait_until("kopf running on the leader", lambda: "tessera_leader 1.0" in leader.metrics(),
               30)
    ops.start(second)
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGTERM)  # as the kubelet does; still routed to
    t0 = time.monotonic()
    ready = leader._get("/readyz").decode()
    assert " 503 " in ready.splitlines()[0] and "stopping" in ready, ready
    for i in range(3):
        out = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=pod(
            ns, f"drain{i}", {"tessera.dev/vgpu-memory": "256", "tessera.dev/vgpu-cores": "10"}))
        assert out.returncode == 0, out.stderr
    time.sleep(max(0.0, 2 - (time.monotonic() - t0)))
    assert leader.proc.poll() is None, "the leader stopped before its drain was over"
    leader.proc.wait(20)
    assert time.monotonic() - t0 >= 3.9
    wait_until("the other replica leading", lambda: lease_holder(cluster) == second, 10, 0.1)
    ops.start(first)


def test_plain_pods_are_created_while_the_operator_is_down(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    cluster.wait_for_service_account(ns)
    ops.stop_all()
    try:
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, "plain", {"cpu": "100m"}))
        assert out.returncode == 0, out.stderr
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, "gpu", {
            "tessera.dev/vgpu-memory": "100"}))
        assert out.returncode != 0 and "pods.tessera.dev" in out.stderr
    finally:
        ops.ensure_running()


def test_no_writes_for_sixty_seconds_once_settled(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """After settling, nothing writes the managed objects: not kopf, not the operator."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, default={"memory": "1Gi"}))
    assert cluster.kubectl("create", "-f", "-", input=pod(ns, "a", {
        "tessera.dev/vgpu": "1"})).returncode == 0
    node, part = f"{ns}-node", f"{ns}-part"
    assert cluster.kubectl("create", "-f", "-", input=node_json(node, pool=ns)).returncode == 0
    assert cluster.kubectl("apply", "-f", "-", input=partition_json(
        part, {"matchLabels": {"pool": ns}}, {"3g.40gb": 2})).returncode == 0
    try:
        wait_until("selected", lambda: cond(cluster, part, "Progressing")[0] == "True")
        report(cluster, part, node, "Ready", 1)
        assert cluster.kubectl("wait", "--for=condition=Ready", f"gpupartition/{part}",
                               "--timeout=20s").returncode == 0
        time.sleep(4)  # a few recount rounds
        managed_writes = sum(_counter(r, MANAGED_WRITES) for r in ops.replicas.values())
        mine = {("gpuquota", ns, "team"), ("gpupartition", None, part)}
        base = {("gpuquota", ns, "team"): kubectl_json(cluster, "get", "gpuquota", "team",
                                                       "-n", ns),
                ("gpupartition", None, part): kubectl_json(cluster, "get", "gpupartition",
                                                           part)}
        # one watch per kind: kubectl watches only a single resource type
        watches = [subprocess.Popen(
            [str(cluster.kubectl_path), "--kubeconfig", str(cluster.kubeconfig), "get",
             kind, "-A", "--watch-only", "-o", "json"],
            stdout=subprocess.PIPE, text=True) for kind in ("gpuquotas", "gpupartitions")]
        time.sleep(60)
        assert [w.poll() for w in watches] == [None, None]  # both watched all along
        out = ""
        for w in watches:
            w.terminate()
            out += w.communicate(timeout=10)[0]
        writes = []
        for obj in json_stream(out):
            key = (obj["kind"].lower(), obj["metadata"].get("namespace"),
                   obj["metadata"]["name"])
            if key in mine:
                old = base[key]
                writes.append((key, obj["metadata"]["resourceVersion"],
                               obj.get("spec") != old.get("spec"),
                               obj["metadata"].get("annotations") != old["metadata"].get(
                                   "annotations"),
                               obj["metadata"].get("finalizers") != old["metadata"].get(
                                   "finalizers")))
        assert writes == []
        # nor the ResourceQuota the GPUQuota manages
        assert sum(_counter(r, MANAGED_WRITES) for r in ops.replicas.values()) == managed_writes
        for obj in base.values():
            meta = obj["metadata"]
            assert not meta.get("finalizers")
            assert not [a for a in meta.get("annotations") or {} if "kopf" in a]
    finally:
        cluster.kubectl("delete", "gpupartition", part, "--wait=false")
        cluster.kubectl("delete", "node", node, "--wait=false")


CLIENT_WAIT_S = 30.0


async def _paced_creates(kubeconfig: Any, ns: str, prefix: str, seconds: float,
                         per_s: float) -> list[tuple[float, str]]:
    """Creates at a steady rate; (seconds the call took, "" or the error) for each."""
    kube = Kube(load_credentials(str(kubeconfig)))
    out: list[tuple[float, str]] = []

    async def one(name: str) -> None:
        t0 = time.monotonic()
        try:
            # the client waits well past the webhook's 10 s timeout: a call the frozen replica
            # held is answered by the API server at ~10 s, and a client giving up at the same
            # 10 s would race it (it did once in CI)
            await kube.request("POST", path("", "v1", "pods", ns), json.loads(pod(ns, name, {
                "tessera.dev/vgpu-memory": "1", "tessera.dev/vgpu-cores": "1"})),
                timeout=CLIENT_WAIT_S)
            out.append((time.monotonic() - t0, ""))
        except ApiError as exc:
            out.append((time.monotonic() - t0, exc.message))
        except TimeoutError:
            out.append((time.monotonic() - t0, f"no answer from the API server in "
                                               f"{CLIENT_WAIT_S} s"))
    try:
        tasks, i, end = [], 0, time.monotonic() + seconds
        while time.monotonic() < end:
            tasks.append(asyncio.create_task(one(f"{prefix}-{i}")))
            i += 1
            await asyncio.sleep(1 / per_s)
        await asyncio.gather(*tasks)
    finally:
        await kube.close()
    return out


def test_a_replica_frozen_and_resumed_fails_only_the_calls_it_held(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """SIGSTOP, then SIGCONT, a replica (the leader, which also reconciles) under creates at
    10/s: while it is frozen only a call the API server had sent it fails (the webhook's
    10 s timeout); once it runs again, none does (an earlier trial reported creates failing
    after a resume: calls made before it, whose timeout ended after)."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "1000Gi", "cores": 100000,
                                          "pods": 10000}))
    leader = ops.leader()
    assert leader.proc is not None
    leader.proc.send_signal(signal.SIGSTOP)
    try:
        frozen = asyncio.run(_paced_creates(cluster.kubeconfig, ns, "frozen", 12, 10))
    finally:
        leader.proc.send_signal(signal.SIGCONT)
    resumed = asyncio.run(_paced_creates(cluster.kubeconfig, ns, "resumed", 12, 10))
    failed = [(round(t, 1), e[:100]) for t, e in frozen if e]
    assert len(failed) <= 2, failed
    assert all("failed calling webhook" in e and t >= 9.5 for t, e in failed), failed
    assert [e for _, e in resumed if e] == []
    # none waits for the webhook's timeout (10 s); the bound leaves a loaded 2-core machine
    # room for the resumed replica's backlog
    assert max(t for t, _ in resumed) < 5.0, sorted(t for t, _ in resumed)[-5:]
    ops.ensure_running()
