"""A resize decided on a pod that changed before its answer was written (409) is decided again
on the pod as it is now, with the growth's holder kept: before, the answer waited for the
pod's next event, the holders settled in between (the holder made for the growth was
deleted, then made again), and each such deletion while pods were being created let
kube-controller-manager recount the namespace from a cache lacking the newest pods (one
pod over ``hard`` in 1 of 8 trials on Kubernetes 1.34, CI of stop 37).

The API server here is a small store that enforces what the controller relies on: a
``metadata.resourceVersion`` in a patch is a precondition (409 when the pod changed), every
write gives a new resourceVersion.  The end-to-end form of this test, against a real API
server and kube-controller-manager, is
``operator_integration/test_quota_integrity.py::test_resize_growth_never_races_creates_past_hard``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

from tessera.api.names import ANNOTATION_BUDGET, ANNOTATION_BUDGET_REQUEST, ANNOTATION_BUDGET_RESIZE
from tessera.api.resize import ResizeStatus
from tessera.kube.client import ApiError, handle_one
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.pods import PodController
from tessera_operator.quota.arith import budget_from_pod
from tessera_operator.quota.holders import holds

NS = "team-a"
GIB = 1 << 30


def budget_of(pod: dict[str, Any]) -> int:
    b = json.loads(pod["metadata"]["annotations"][ANNOTATION_BUDGET])
    return int(sum(c["memoryBytes"] * c["shares"] for c in b["containers"].values()))


class Store:
    """Pods and one GPUQuota, with resourceVersions; records holder writes."""

    def __init__(self) -> None:
        self.rv = 10
        self.pods: dict[str, dict[str, Any]] = {}
        self.holder_creates: list[str] = []
        self.holder_deletes: list[str] = []
        self.quota = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
                      "metadata": {"name": "team", "namespace": NS, "resourceVersion": "1"},
                      "spec": {"hard": {"memory": "16Gi", "cores": 1000, "pods": 100}},
                      "status": {"used": {"memory": "1Gi", "cores": 10, "pods": 1}}}

    def _next(self, pod: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        pod["metadata"]["resourceVersion"] = str(self.rv)
        return copy.deepcopy(pod)

    def add_pod(self, name: str) -> dict[str, Any]:
        spec = {"containers": [{"name": "main", "image": "busybox", "resources": {"limits": {
            "tessera.dev/vgpu-memory": "1024", "tessera.dev/vgpu-cores": "10"}}}]}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                            "labels": {"tessera.dev/budgeted": "true"},
                            "annotations": {ANNOTATION_BUDGET: budget_from_pod(spec).to_api()
                                            .to_annotation()}},
               "spec": spec, "status": {"phase": "Pending"}}
        self.pods[name] = pod
        return self._next(pod)

    def write(self, name: str, annotations: dict[str, str] | None = None,
              status: dict[str, Any] | None = None) -> dict[str, Any]:
        """Someone else's write (the user's request, the scheduler's status)."""
        pod = self.pods[name]
        pod["metadata"]["annotations"].update(annotations or {})
        pod["status"].update(status or {})
        return self._next(pod)

    # -- the Kube calls the controller makes ---------------------------------------------------

    async def get(self, url: str) -> dict[str, Any]:
        name = url.rsplit("/", 1)[1]
        if name not in self.pods:
            raise ApiError(404, "not found", f"GET {url}")
        return copy.deepcopy(self.pods[name])

    async def list(self, url: str, label_selector: str | None = None,
                   cached: bool = False) -> dict[str, Any]:
        if "gpuquotas" in url:
            return {"items": [copy.deepcopy(self.quota)]}
        key = (label_selector or "").split("=")
        return {"items": [copy.deepcopy(p) for p in self.pods.values()
                          if (p["metadata"].get("labels") or {}).get(key[0]) == key[-1]]}

    async def merge_patch(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        pod = self.pods[url.rsplit("/", 1)[1]]
        meta = body.get("metadata") or {}
        want = meta.get("resourceVersion")
        if want is not None and want != pod["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified", f"PATCH {url}")
        pod["metadata"]["annotations"].update(meta.get("annotations") or {})
        return self._next(pod)

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        if url.endswith("/events"):
            return body
        name = body["metadata"]["name"]
        if name in self.pods:
            raise ApiError(409, "already exists", f"POST {url}")
        self.pods[name] = copy.deepcopy(body)
        self.holder_creates.append(name)
        return self._next(self.pods[name])

    async def delete(self, url: str) -> dict[str, Any]:
        name = url.rsplit("/", 1)[1]
        self.holder_deletes.append(name)
        return self.pods.pop(name)


async def leader_with_one_pod() -> tuple[Store, PodController]:
    """A leading controller whose watches have listed one budgeted pod ``p`` and no holder."""
    store = Store()
    ctl = PodController(kube=store, cache=QuotaCache(store),  # type: ignore[arg-type]
                        on_namespace=lambda ns: None)
    ctl.lead_with(b"k" * 32)
    ctl.on_holder("SYNC", {"items": []})
    await ctl.on_watch_event("SYNC", {"items": [store.add_pod("p")]})
    return store, ctl


def test_a_resize_on_a_pod_changed_meanwhile_is_answered_at_once_keeping_its_holder() -> None:
    async def run() -> None:
        store, ctl = await leader_with_one_pod()

        asked = store.write("p", annotations={
            ANNOTATION_BUDGET_REQUEST: json.dumps({"main": {"memory": "2Gi"}})})
        scheduled = store.write("p", status={"conditions": [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]})

        # the request's event reaches the leader after the scheduler wrote the pod again
        await handle_one(ctl.on_watch_event, "MODIFIED", asked, "pods")
        for name in store.holder_creates:  # the holder watch reports the holder made
            ctl.on_holder("ADDED", store.pods[name])
        for uid in list(ctl._settle_dirty):  # the settle loop runs between two pod events
            await ctl.settle(uid)
        await handle_one(ctl.on_watch_event, "MODIFIED", scheduled, "pods")
        latest = copy.deepcopy(store.pods["p"])
        await handle_one(ctl.on_watch_event, "MODIFIED", latest, "pods")
        for uid in list(ctl._settle_dirty):
            await ctl.settle(uid)

        pod = store.pods["p"]
        status = ResizeStatus.parse(pod["metadata"]["annotations"][ANNOTATION_BUDGET_RESIZE])
        assert status is not None and status.state == "Approved", status
        assert budget_of(pod) == 2 * GIB
        assert store.holder_deletes == [], "the growth's holder was deleted and made again"
        assert len(store.holder_creates) == 1, store.holder_creates
        holder = store.pods[store.holder_creates[0]]
        assert holds(holder).memory_mib == 1024
    asyncio.run(run())


def test_an_event_older_than_the_leaders_own_write_is_not_answered_again() -> None:
    """The approved write is newer than the events queued before it: those copies still
    carry the unanswered request and must not be decided on (each cost a 409 and a logged
    error: 1-5 per trial in 6 of the 8 trials of the failed CI run)."""
    async def run() -> None:
        store, ctl = await leader_with_one_pod()
        asked = store.write("p", annotations={
            ANNOTATION_BUDGET_REQUEST: json.dumps({"main": {"memory": "2Gi"}})})
        await ctl.on_watch_event("MODIFIED", asked)
        answered_rv = store.pods["p"]["metadata"]["resourceVersion"]
        patches: list[str] = []
        real = store.merge_patch

        async def counting(url: str, body: dict[str, Any]) -> dict[str, Any]:
            patches.append(url)
            return await real(url, body)
        store.merge_patch = counting  # type: ignore[method-assign]
        await ctl.on_watch_event("MODIFIED", asked)  # the request's event, delivered late
        assert patches == []
        assert store.pods["p"]["metadata"]["resourceVersion"] == answered_rv
    asyncio.run(run())
