"""The leader's control loops: GPUPartition status, GPUQuota status, releases, recount.

Level-triggered: every event marks work dirty and the loops recompute the whole answer from
the caches with the pure modules (:mod:`tessera.partition`, :mod:`tessera.quota`), then write
only what differs.  So a settled cluster sees no writes at all, and a missed event is healed
by the next one or by the periodic pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tessera import metrics
from tessera.api.conditions import DEGRADED, PROGRESSING, READY, Condition
from tessera.api.inventory import NodeInventory, from_node
from tessera.api.names import (
    ANNOTATION_RELEASED,
    API_VERSION,
    FINALIZER_RESET,
    GPUPARTITIONS,
    GPUQUOTAS,
    GROUP,
    LABEL_BUDGETED,
    LABEL_GPU_PRODUCT,
    VERSION,
)
from tessera.api.partition import GPUPartitionSpec, GPUPartitionStatus, NodePartitionStatus
from tessera.kube.client import ApiError, Kube, Obj, follow, handle_one, path
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera.kube.merge import merge_diff
from tessera.partition import PartitionView, aggregate, resolve, transitions
from tessera.quota.arith import TERMINAL_PHASES, DriftTracker, pod_usage, recount
from tessera.quota.objects import limits_of, summary, used_of, used_patch
from tessera.quota.status import quota_conditions
from tessera.reservations.store import QuotaStore

log = logging.getLogger("tessera.controller")

STATUS_KEYS = ("observedGeneration", "conditions", "selectedNodes", "selectedNodeCount",
               "readyNodeCount", "layout", "nodes")
"""All of a GPUPartition's status: the operator is its only writer."""


def _conditions(raw: Any) -> list[Condition]:
    out = []
    for c in raw or []:
        try:
            out.append(Condition.model_validate(c))
        except ValidationError:
            continue
    return out


def _dump_conditions(conds: list[Condition]) -> list[dict[str, Any]]:
    return [c.to_dict() for c in conds]


@dataclass
class Controller:
    kube: Kube
    store: QuotaStore
    recount_interval_s: float = 30.0
    drift_grace_s: float = 10.0
    component: str = "tessera-operator"
    health: Health | None = None
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    partitions: dict[str, Obj] = field(default_factory=dict)
    quotas: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _quota_dirty: set[tuple[str, str]] = field(default_factory=set)
    _quota_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _drift: DriftTracker = field(default_factory=DriftTracker)

    def __post_init__(self) -> None:
        self._drift = DriftTracker(self.drift_grace_s)

    # -- events from kopf and the watches -------------------------------------------------

    def on_partition(self, typ: str | None, body: Mapping[str, Any]) -> None:
        name = str(body["metadata"]["name"])
        if typ == "DELETED":
            self.partitions.pop(name, None)
        else:
            self.partitions[name] = dict(body)
        metrics.WATCHED.labels("gpupartition").set(len(self.partitions))
        self._dirty.set()

    def on_node(self, typ: str, node: Obj) -> None:
        name = str(node["metadata"]["name"])
        if typ == "DELETED":
            if self.nodes.pop(name, None) is not None:
                self._dirty.set()
            return
        inv = from_node(node)
        if self.nodes.get(name) != inv:
            self.nodes[name] = inv
            self._dirty.set()
        metrics.WATCHED.labels("node").set(len(self.nodes))

    def on_node_sync(self, items: list[Obj]) -> None:
        self.nodes = {str(n["metadata"]["name"]): from_node(n) for n in items}
        metrics.WATCHED.labels("node").set(len(self.nodes))
        self._dirty.set()

    def on_quota(self, typ: str, body: Obj) -> None:
        """A quota watch event (SYNC carries the whole list): remember it, mark it dirty."""
        if typ == "SYNC":
            items = {(str(q["metadata"]["namespace"]), str(q["metadata"]["name"])): q
                     for q in body.get("items") or []}
            for key in set(self.quotas) - set(items):
                self._drift.forget("/".join(key))
            self.quotas = items
            self._quota_dirty.update(items)
        else:
            meta = body["metadata"]
            key = (str(meta["namespace"]), str(meta["name"]))
            if typ == "DELETED":
                self.quotas.pop(key, None)
                self._drift.forget("/".join(key))
                self._quota_dirty.discard(key)
            else:
                self.quotas[key] = body
                self._quota_dirty.add(key)
        metrics.WATCHED.labels("gpuquota").set(len(self.quotas))
        self._quota_wake.set()

    def forget_quota_work(self) -> None:
        """Leadership lost: whatever was dirty is the next leader's to reconcile."""
        self._quota_dirty.clear()
        self._quota_wake.clear()

    async def quota_loop(self) -> None:
        """Reconcile each dirty quota from its newest copy (level-triggered, one at a time)."""
        while True:
            await self._quota_wake.wait()
            self._quota_wake.clear()
            while self._quota_dirty:
                key = self._quota_dirty.pop()
                q = self.quotas.get(key)
                if q is None:
                    continue
                try:
                    await self.reconcile_quota(q)
                except (ApiError, OSError, TimeoutError) as exc:
                    log.warning("quota reconcile failed", extra={"quota": "/".join(key),
                                                                 "error": str(exc)})
                    self._quota_dirty.add(key)
                    await asyncio.sleep(1.0)

    async def on_pod(self, typ: str, pod: Obj) -> None:
        """Give a pod's budget back once: when it finishes, or when it is deleted unfinished."""
        meta = pod.get("metadata") or {}
        annotations = meta.get("annotations") or {}
        if ANNOTATION_RELEASED in annotations:
            return
        phase = (pod.get("status") or {}).get("phase")
        if typ == "DELETED":  # unreleased (finished or not): give it back now
            await self._release(pod)
            return
        if phase not in TERMINAL_PHASES:
            return
        # Mark first, then release: a crash in between loses a release (recount heals an
        # overcount) but can never release twice.
        url = path("", "v1", "pods", str(meta["namespace"]), str(meta["name"]))
        try:
            await self.kube.merge_patch(url, {"metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ANNOTATION_RELEASED: "true"}}})
        except ApiError as exc:
            if exc.status in (404, 409):
                return  # gone or changed: the next event decides
            raise
        await self._release(pod)

    async def _release(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns = str(meta["namespace"])
        usage = pod_usage(pod)
        if usage.pods == 0:
            return
        for qns, name in list(self.quotas):
            if qns == ns:
                await self.store.release(ns, name, usage)
        metrics.RELEASES.inc()
        log.info("budget released", extra={"namespace": ns, "pod": meta.get("name")})

    # -- GPUQuota ---------------------------------------------------------------------------

    async def reconcile_quota(self, q: Obj) -> None:
        meta, status = q["metadata"], q.get("status") or {}
        gen = int(meta.get("generation") or 1)
        limits = limits_of(q.get("spec") or {})
        used = used_of(status)
        old = _conditions(status.get("conditions"))
        conds = quota_conditions(old, limits, used, gen)
        new: dict[str, Any] = {"observedGeneration": gen, "conditions": _dump_conditions(conds)}
        if used is not None:
            new["summary"] = summary(limits, used)
        current = {k: status.get(k) for k in new}
        current["conditions"] = _dump_conditions(old)
        if current == new:
            return
        url = path(GROUP, VERSION, GPUQUOTAS, meta["namespace"], meta["name"])
        try:
            await self.kube.merge_patch(url + "/status", {
                "metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": new})
            metrics.STATUS_WRITES.labels("gpuquota", "conditions").inc()
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            return  # a newer version is on its way as an event
        await self._events(q, "GPUQuota", old, conds)

    async def recount_once(self) -> None:
        """Heal ``status.used`` towards the pods' budgets, never racing a reservation."""
        for ns, name in list(self.quotas):
            url = path(GROUP, VERSION, GPUQUOTAS, ns, name)
            try:
                q = await self.kube.get(url)
                pods = (await self.kube.list(path("", "v1", "pods", ns),
                                             f"{LABEL_BUDGETED}=true")).get("items") or []
            except ApiError as exc:
                if exc.status == 404:
                    continue
                raise
            counted = recount(pods)
            rv = str(q["metadata"].get("resourceVersion"))
            used = used_of(q.get("status"))
            if not self._drift.decide(f"{ns}/{name}", rv, used, counted):
                continue
            try:
                await self.kube.merge_patch(url + "/status", used_patch(q, counted))
                metrics.RECOUNT_HEALS.inc()
                metrics.STATUS_WRITES.labels("gpuquota", "recount").inc()
                log.info("recount healed usage", extra={
                    "namespace": ns, "quota": name, "was": str(used), "now": str(counted)})
            except ApiError as exc:
                if exc.status not in (404, 409):
                    raise

    async def recount_loop(self) -> None:
        while True:
            try:
                await self.recount_once()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("recount failed", extra={"error": str(exc)})
            await asyncio.sleep(self.recount_interval_s)

    # -- GPUPartition -----------------------------------------------------------------------

    def _views(self) -> tuple[list[PartitionView], dict[str, GPUPartitionStatus]]:
        views, olds = [], {}
        for name, body in sorted(self.partitions.items()):
            meta, status = body["metadata"], body.get("status") or {}
            try:
                spec = GPUPartitionSpec.model_validate(body.get("spec") or {})
            except ValidationError as exc:
                log.warning("invalid GPUPartition spec", extra={"partition": name,
                                                               "error": str(exc)})
                continue
            entries: dict[str, NodePartitionStatus] = {}
            for node, inv in self.nodes.items():
                entry = inv.report(name)
                if entry is not None:
                    entries[node] = entry
            views.append(PartitionView(name, spec, int(meta.get("generation") or 1),
                                       str(meta.get("creationTimestamp") or ""), entries))
            olds[name] = GPUPartitionStatus(conditions=_conditions(status.get("conditions")))
        return views, olds

    async def reconcile_partitions(self) -> None:
        views, olds = self._views()
        resolutions = resolve(views, self.nodes.values())
        for v in views:
            body = self.partitions.get(v.name)
            if body is None:
                continue
            new = aggregate(v, resolutions[v.name], olds[v.name])
            await self._deletion_policy(body, v, new)
            wire = new.to_dict()
            stored = body.get("status") or {}
            want = {k: wire.get(k) for k in STATUS_KEYS}
            have = {k: stored.get(k) for k in STATUS_KEYS if k in stored}
            have["conditions"] = _dump_conditions(olds[v.name].conditions)
            # a merge patch merges objects: deselected nodes, and fields a node's report
            # no longer has (a cleared message), must be nulled explicitly
            diff = merge_diff(have, want)
            if diff == {}:
                continue
            patch = {"status": diff}
            try:
                await self.kube.merge_patch(
                    path(GROUP, VERSION, GPUPARTITIONS, name=v.name) + "/status", patch)
                metrics.STATUS_WRITES.labels("gpupartition", "reconcile").inc()
            except ApiError as exc:
                if exc.status != 404:
                    raise
                continue
            await self._events(body, "GPUPartition", olds[v.name].conditions, new.conditions)

    async def _deletion_policy(self, body: Obj, v: PartitionView,
                               new: GPUPartitionStatus) -> None:
        """Reset: hold a finalizer until the daemons report the GPUs reset.

        Deleting sets deletionTimestamp and bumps the generation; node daemons then enact
        MIG disabled on the partition's GPUs and report phase Ready at that generation, and
        the partition goes once every node holding its GPUs has (or none is selected).
        Retain (the default) never gets a finalizer: nothing to wait for, nothing written.
        """
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        has = FINALIZER_RESET in finalizers
        deleting = meta.get("deletionTimestamp") is not None
        reset = v.spec.deletion_policy == "Reset"
        ready = next((c for c in new.conditions if c.type == READY), None)
        done = ready is not None and (ready.status == "True" or ready.reason ==
                                      "NoNodesSelected")
        if reset and not deleting and not has:
            finalizers.append(FINALIZER_RESET)
        elif has and (not reset or (deleting and done)):
            finalizers.remove(FINALIZER_RESET)
        else:
            return
        try:
            await self.kube.merge_patch(path(GROUP, VERSION, GPUPARTITIONS, name=v.name), {
                "metadata": {"resourceVersion": meta.get("resourceVersion"),
                             "finalizers": finalizers}})
            log.info("finalizer updated", extra={"partition": v.name, "finalizers": finalizers})
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            self._dirty.set()  # a newer version is on its way

    async def partition_loop(self) -> None:
        while True:
            await self._dirty.wait()
            # Trailing debounce: when a layout changes, every selected node's report arrives
            # within a short burst; write each partition's status once the burst pauses for
            # 50 ms (at most 1 s late) instead of once per report.
            started = asyncio.get_running_loop().time()
            while True:
                self._dirty.clear()
                await asyncio.sleep(0.05)
                if (not self._dirty.is_set()
                        or asyncio.get_running_loop().time() - started > 1.0):
                    break
            self._dirty.clear()
            try:
                await self.reconcile_partitions()
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("partition reconcile failed", extra={"error": str(exc)})
                await asyncio.sleep(1.0)
                self._dirty.set()

    # -- watches (server-side filtered) -----------------------------------------------------

    async def watch_nodes(self) -> None:
        def handle(typ: str, obj: Obj) -> None:
            if typ == "SYNC":
                self.on_node_sync(obj.get("items") or [])
            else:
                self.on_node(typ, obj)
        await follow(self.kube.watch(path("", "v1", "nodes"), LABEL_GPU_PRODUCT, name="nodes",
                                     health=self.health), handle, "nodes")

    async def watch_pods(self) -> None:
        async def handle(typ: str, obj: Obj) -> None:
            if typ != "SYNC":
                await self.on_pod(typ, obj)
                return
            for pod in obj.get("items") or []:  # one pod's failure must not skip the others
                await handle_one(self.on_pod, "ADDED", pod, "pods")
        await follow(self.kube.watch(path("", "v1", "pods"), f"{LABEL_BUDGETED}=true",
                                     name="pods", health=self.health), handle, "pods")

    # -- Events -----------------------------------------------------------------------------

    async def _events(self, obj: Mapping[str, Any], kind: str, old: list[Condition],
                      new: list[Condition]) -> None:
        for c in transitions(old, new):
            if c.type == PROGRESSING and c.status == "False" and not old:
                continue
            warning = (c.type == DEGRADED and c.status == "True") or (
                c.type == READY and c.status == "False" and c.reason not in (
                    "Applying", "Counting"))
            await post_event(self.kube, obj, API_VERSION, kind, c.reason,
                             f"{c.type}={c.status}: {c.message}",
                             "Warning" if warning else "Normal", self.component)
