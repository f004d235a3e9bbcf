"""One user's object, or an outage, never takes the operator down; what cannot heal shows in
/healthz.  Both replicas, against the real API server."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from .conftest import Operators
from .harness import RoundRobinProxy, kubectl_json, wait_until
from .test_partition import cond, partition_json
from .test_quota_admission import pod, quota, setup_ns, used

pytestmark = pytest.mark.integration

BIG = 600 * 1024
"""Over aiohttp's 512 KiB line limit, well under etcd's object limit."""


def _alive(ops: Operators) -> None:
    for rep in ops.replicas.values():
        assert rep.proc is not None and rep.proc.poll() is None, (
            f"{rep.name} exited: {rep.log.read_text()[-2000:]}")


def _health(rep: Any) -> tuple[int, str]:
    raw = rep._get("/healthz").decode(errors="replace")
    head, _, body = raw.partition("\r\n\r\n")
    return int(head.split()[1]), body


def test_a_huge_gpu_pod_is_followed_and_released_and_no_replica_dies(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"memory": "10Gi", "cores": 200, "pods": 10}))
    body = json.loads(pod(ns, "huge", {"tessera.dev/vgpu-memory": "1024",
                                       "tessera.dev/vgpu-cores": "10"}))
    body["spec"]["containers"][0]["args"] = ["x" * BIG]
    out = cluster.kubectl("create", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "small", {
        "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode == 0, out.stderr
    wait_until("both counted", lambda: used(cluster, ns).get("pods") == 2, 10, 0.1)
    time.sleep(2)  # the pod watch has seen the huge pod (and, before the fix, died of it)
    _alive(ops)
    # its deletion event is as large; releasing it proves the watch read it
    assert cluster.kubectl("delete", "pod", "huge", "small", "-n", ns, "--wait=false"
                           ).returncode == 0
    wait_until("both pods released", lambda: used(cluster, ns).get("pods") == 0, 30)
    _alive(ops)
    for rep in ops.replicas.values():
        assert _health(rep)[0] == 200


def test_a_huge_gpuquota_does_not_blind_the_quota_watch(
        cluster: Any, namespace: str, ops: Operators, tmp_path: Path) -> None:
    """Annotations are capped at 256 KiB in total, labels are not: 4,500 long labels make a
    GPUQuota of ~600 KiB that any namespace user may write."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, name="big", hard={"cores": 100}))
    labels = {f"k{i:05d}.example.com/{'n' * 60}": "v" * 63 for i in range(4500)}
    patch = tmp_path / "labels.json"
    patch.write_text(json.dumps({"metadata": {"labels": labels}}))
    assert len(patch.read_bytes()) > BIG
    out = cluster.kubectl("patch", "gpuquota", "big", "-n", ns, "--type", "merge",
                          "--patch-file", str(patch))
    assert out.returncode == 0, out.stderr
    # a quota created after it is still reconciled (conditions) and used by admission
    out = cluster.kubectl("apply", "-f", "-", input=quota(ns, name="after", hard={
        "cores": 100, "memory": "4Gi"}))
    assert out.returncode == 0, out.stderr
    wait_until("the later quota's conditions", lambda: (kubectl_json(
        cluster, "get", "gpuquota", "after", "-n", ns).get("status") or {}).get(
        "observedGeneration") == 1, 20)
    out = cluster.kubectl("create", "-f", "-", input=pod(ns, "p", {
        "tessera.dev/vgpu-memory": "8192", "tessera.dev/vgpu-cores": "10"}))
    assert out.returncode != 0 and 'exceeded GPUQuota "after"' in out.stderr, out.stderr
    _alive(ops)
    for rep in ops.replicas.values():
        assert _health(rep)[0] == 200


def test_an_api_server_outage_ends_no_replica_and_a_blind_watch_shows_in_healthz(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """Both replicas reach the API server through a proxy that the test cuts for longer than
    the harness's --stuck-after (10 s), across several webhook re-applies (every 2 s)."""
    ns = namespace
    setup_ns(cluster, ns, quota(ns, hard={"cores": 100, "memory": "4Gi"}))
    api = RoundRobinProxy().start()
    api_port = int(urlparse(cluster.server).port or 0)
    api.route("kube-apiserver", api_port)
    via = ops.kubeconfig_via(api)
    try:
        for name in ops.names:
            ops.start(name, kubeconfig=via)
        ops.leader()
        api.cut()
        time.sleep(12)
        _alive(ops)
        for rep in ops.replicas.values():
            status, text = _health(rep)
            assert status == 503 and "quota-cache: failing" in text, (status, text)
        api.route("kube-apiserver", api_port)
        ops.leader()
        for rep in ops.replicas.values():
            wait_until(f"{rep.name} healthy again", lambda r=rep: _health(r)[0] == 200, 20)
        out = cluster.kubectl("create", "-f", "-", input=pod(ns, "after-outage", {
            "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}))
        assert out.returncode == 0, out.stderr
        _alive(ops)
    finally:
        for name in ops.names:
            ops.start(name)


def test_a_huge_gpupartition_does_not_stop_the_leader(
        cluster: Any, ops: Operators, tmp_path: Path) -> None:
    """GPUPartitions are watched through kopf: a ~600 KiB one must not end it either."""
    names = ("robust-huge", "robust-after")
    try:
        out = cluster.kubectl("apply", "-f", "-", input=partition_json(
            names[0], {"matchLabels": {"pool": "robust-none"}}, {"1g.10gb": 7}))
        assert out.returncode == 0, out.stderr
        labels = {f"k{i:05d}.example.com/{'n' * 60}": "v" * 63 for i in range(4500)}
        patch = tmp_path / "labels.json"
        patch.write_text(json.dumps({"metadata": {"labels": labels}}))
        out = cluster.kubectl("patch", "gpupartition", names[0], "--type", "merge",
                              "--patch-file", str(patch))
        assert out.returncode == 0, out.stderr
        out = cluster.kubectl("apply", "-f", "-", input=partition_json(
            names[1], {"matchLabels": {"pool": "robust-none"}}, {"3g.40gb": 2}))
        assert out.returncode == 0, out.stderr
        wait_until("the later partition's conditions",
                   lambda: cond(cluster, names[1], "Ready")[1] == "NoNodesSelected", 30)
        _alive(ops)
    finally:
        cluster.kubectl("delete", "gpupartition", *names, "--ignore-not-found")
