"""Admission on a loop of its own: a pod review is answered while the operator's main loop
is held by other work (a long watch handler, kopf), the reviews that need the API client
still run on the main loop, and a pod review before the quota cache has synced is listed
through the main loop's client.  Against the server as the operator runs it: real TLS,
the real Admission and QuotaCache; the API client is a stand-in that lists and watches
from memory (the cluster tests run the operator against the real API server)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.cache.quotas import QuotaCache
from tessera.kube.loops import LoopThread, on_loop
from tessera.webhooks import server
from tessera.webhooks.admission import Admission
from tessera.webhooks.auth import serving_context
from tessera.webhooks.certs import make_serving_cert

HOLD_S = 1.0
QUOTA = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
         "metadata": {"name": "team", "namespace": "ns", "resourceVersion": "1"},
         "spec": {"hard": {"memory": "4Gi", "cores": 100, "pods": 10}},
         "status": {"used": {"memory": "0", "cores": 0, "pods": 0}}}


class _Kube:
    """The API client's calls admission makes: a cached LIST and the quota watch. Records
    the thread each ran on."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.synced = asyncio.Event()
        self.release_sync = asyncio.Event()

    async def list(self, url: str, *_: Any, **__: Any) -> dict[str, Any]:
        self.threads.append(threading.current_thread().name)
        return {"items": [QUOTA] if "gpuquotas" in url else []}

    async def watch(self, url: str, **_: Any) -> AsyncIterator[tuple[str, Any]]:
        await self.release_sync.wait()
        yield "SYNC", {"items": [QUOTA]}
        self.synced.set()
        await asyncio.Event().wait()


def _review(kind: str, obj: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": f"u-{kind}", "namespace": "ns",
                                   "operation": "CREATE", "object": obj}}).encode()


POD = {"metadata": {"name": "p", "namespace": "ns"},
       "spec": {"containers": [{"name": "main", "resources": {"limits": {
           "tessera.dev/vgpu-memory": "1024"}}}]}}


def _post(port: int, ca: Path, path: str, body: bytes, out: dict[str, Any]) -> None:
    """One review over TLS, from a thread of its own (the API server's side); its answer
    and when it came."""
    tls = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=tls, timeout=10)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    out["status"], out["body"] = resp.status, json.loads(resp.read())
    out["at"] = time.monotonic()
    conn.close()


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[tuple[Path, ssl.SSLContext]]:
    ca, crt, key = make_serving_cert(["127.0.0.1"]).write(tmp_path)
    yield ca, serving_context(crt, key, None)


def _run(tls: tuple[Path, ssl.SSLContext], own_loop: bool, synced: bool
         ) -> tuple[dict[str, Any], dict[str, Any], float, _Kube]:
    """A pod review and a GPUQuota review sent while the main loop is held for HOLD_S."""
    ca, context = tls

    async def go() -> tuple[dict[str, Any], dict[str, Any], float, _Kube]:
        kube = _Kube()
        cache = QuotaCache(kube)  # type: ignore[arg-type]
        watch = asyncio.create_task(cache.watch())
        if synced:
            kube.release_sync.set()
            await kube.synced.wait()
        adm = Admission(kube, cache)  # type: ignore[arg-type]
        thread = LoopThread("admission").start() if own_loop else None
        app = server.webhook_app(adm, None, on_loop(asyncio.get_running_loop())
                                 if thread else None)
        runner = await (thread.call if thread else _here)(
            server.start(app, "127.0.0.1", 0, context))
        port = runner.addresses[0][1]
        pod: dict[str, Any] = {}
        quota: dict[str, Any] = {}
        clients = [threading.Thread(target=_post, args=(port, ca, p, body, out))
                   for p, body, out in (("/mutate/pods", _review("pod", POD), pod),
                                        ("/validate/gpuquotas", _review("quota", QUOTA),
                                         quota))]
        await asyncio.sleep(0.05)
        held_at = time.monotonic()
        for c in clients:
            c.start()
        time.sleep(HOLD_S)  # the main loop is held: a long handler, kopf, a GC pause
        for c in clients:
            await asyncio.to_thread(c.join, 10)
        await (thread.call if thread else _here)(runner.cleanup())
        if thread is not None:
            await thread.stop()
        watch.cancel()
        return pod, quota, held_at, kube

    return asyncio.run(go())


async def _here(coro: Any) -> Any:
    return await coro


def _patch(answer: dict[str, Any]) -> list[dict[str, Any]]:
    resp = answer["body"]["response"]
    assert resp["allowed"], resp
    ops: list[dict[str, Any]] = json.loads(base64.b64decode(resp["patch"]))
    return ops


def test_a_pod_review_is_answered_while_the_main_loop_is_held(
        tls: tuple[Path, ssl.SSLContext]) -> None:
    pod, quota, held_at, kube = _run(tls, own_loop=True, synced=True)
    assert pod["status"] == 200 and pod["at"] - held_at < HOLD_S / 2, pod
    assert any(op["path"] == "/metadata/annotations" for op in _patch(pod))
    # the GPUQuota review lists through the API client: on the main loop, after the hold
    assert quota["status"] == 200 and quota["body"]["response"]["allowed"]
    assert quota["at"] - held_at >= HOLD_S
    assert kube.threads == ["MainThread"]


def test_on_the_main_loop_the_same_pod_review_waits_for_the_hold(
        tls: tuple[Path, ssl.SSLContext]) -> None:
    """What the thread is for: the same review, served on the main loop, waits."""
    pod, _, held_at, _ = _run(tls, own_loop=False, synced=True)
    assert pod["status"] == 200 and pod["at"] - held_at >= HOLD_S, pod


def test_before_the_cache_has_synced_a_pod_review_lists_on_the_main_loop(
        tls: tuple[Path, ssl.SSLContext]) -> None:
    pod, _, held_at, kube = _run(tls, own_loop=True, synced=False)
    assert pod["status"] == 200 and pod["at"] - held_at >= HOLD_S, pod
    assert any(op["path"] == "/metadata/annotations" for op in _patch(pod))
    assert kube.threads == ["MainThread", "MainThread"]  # the pod's LIST, the quota review's
