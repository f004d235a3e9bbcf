"""The leader's control loops: GPUPartition status, GPUQuota status, releases, recount.

Level-triggered: every event marks work dirty and the loops recompute the whole answer from
the caches with the pure modules (:mod:`tessera.partition`, :mod:`tessera.quota`), then write
only what differs.  So a settled cluster sees no writes at all, and a missed event is healed
by the next one or by the periodic pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
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
from tessera.controller.resize import pending_request, reconcile_resize
from tessera.kube.client import ApiError, Kube, Obj, follow, handle_one, path
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera.kube.merge import merge_diff
from tessera.partition import PartitionView, aggregate, resolve, transitions
from tessera.quota.arith import (
    TERMINAL_PHASES,
    Limits,
    Pending,
    Usage,
    pod_counts,
    pod_usage,
)
from tessera.quota.batch import Count, Release
from tessera.quota.ledger import PodCount, dead_candidates, needs_count, pod_of
from tessera.quota.objects import FieldError, limits_of, state_of, summary, view_of
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


COUNT_DEBOUNCE_S = 0.1
"""A namespace whose pods or quotas changed is counted this soon after (changes within it
are counted together)."""
TOMBSTONE_S = 600.0
"""How long a reservation given back as dead is remembered, so that a late DELETED event of
a pod that existed after all never gives its usage back a second time."""


@dataclass
class Controller:
    kube: Kube
    store: QuotaStore
    recount_interval_s: float = 5.0
    component: str = "tessera-operator"
    health: Health | None = None
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    partitions: dict[str, Obj] = field(default_factory=dict)
    quotas: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _quota_dirty: set[tuple[str, str]] = field(default_factory=set)
    _quota_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _pods: dict[str, dict[str, tuple[str, Usage]]] = field(default_factory=dict)
    """The pod watch's view: namespace -> pod UID -> (name, what it holds now)."""
    _pod_counts: dict[str, PodCount] = field(default_factory=dict)
    """``_pods`` summed per namespace, until a pod of it changes."""
    _pods_synced: bool = False
    _pods_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while one pod event is handled (cache + release) and while counting: a count
    then sees every release of the pods it no longer sees already written."""
    _count_soon: set[str] = field(default_factory=set)
    _count_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _by_namespace: dict[str, list[str]] | None = None
    _dead: dict[str, float] = field(default_factory=dict)
    """Pod UIDs whose reservations were given back as dead -> when to forget them."""

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
        """A quota watch event (SYNC carries the whole list): remember it, mark it dirty,
        and count its namespace soon if the count would change it (a new quota is counted
        at once: until then it admits nothing)."""
        if typ == "SYNC":
            items = {(str(q["metadata"]["namespace"]), str(q["metadata"]["name"])): q
                     for q in body.get("items") or []}
            self.quotas = items
            self._quota_dirty.update(items)
            changed = list(items)
        else:
            meta = body["metadata"]
            key = (str(meta["namespace"]), str(meta["name"]))
            changed = []
            if typ == "DELETED":
                self.quotas.pop(key, None)
                self._quota_dirty.discard(key)
            else:
                self.quotas[key] = body
                self._quota_dirty.add(key)
                changed = [key]
        metrics.WATCHED.labels("gpuquota").set(len(self.quotas))
        self._by_namespace = None
        self._quota_wake.set()
        for key in changed:
            self._count_if_needed(key)

    def forget_quota_work(self) -> None:
        """Leadership lost: whatever was dirty is the next leader's to reconcile, and the pod
        view is rebuilt from the next leadership's own watch."""
        self._quota_dirty.clear()
        self._quota_wake.clear()
        self._by_namespace = None
        self._pods.clear()
        self._pod_counts.clear()
        self._pods_synced = False
        self._count_soon.clear()
        self._count_wake.clear()

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
        if typ != "DELETED" and pending_request(pod):
            await reconcile_resize(self.kube, self.store, pod, self.component)
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
            marked = await self.kube.merge_patch(url, {"metadata": {
                "resourceVersion": meta.get("resourceVersion"),
                "annotations": {ANNOTATION_RELEASED: "true"}}})
        except ApiError as exc:
            if exc.status in (404, 409):
                return  # gone or changed: the next event decides
            raise
        self._see_pod("MODIFIED", marked)
        await self._release(pod)

    async def _release(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, uid = str(meta["namespace"]), str(meta.get("uid") or "")
        if uid in self._dead:
            return  # given back already, when its reservation was found dead
        usage = pod_usage(pod)
        for name in self._quotas_in(ns):
            await self.store.release(ns, name, Release(uid, usage if usage.pods else None))
        if usage.pods:
            metrics.RELEASES.inc()
            log.info("budget released", extra={"namespace": ns, "pod": meta.get("name")})

    def _see_pod(self, typ: str, pod: Obj) -> None:
        """Keep the pod view: what each budgeted pod holds now (zero once released)."""
        meta = pod.get("metadata") or {}
        ns, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
        pods = self._pods.setdefault(ns, {})
        self._pod_counts.pop(ns, None)
        if typ == "DELETED":
            pods.pop(uid, None)
        else:
            pods[uid] = (str(meta.get("name")), pod_usage(pod) if pod_counts(pod) else Usage())
        for name in self._quotas_in(ns):
            reservations = (self.quotas[(ns, name)].get("status") or {}).get("reservations")
            if isinstance(reservations, Mapping) and any(
                    pod_of(str(k)) == uid for k in reservations):
                self._count(ns)  # its reservation is no longer pending: confirm it soon

    def _quotas_in(self, ns: str) -> list[str]:
        """Names of the namespace's quotas (an index rebuilt after the quotas change)."""
        if self._by_namespace is None:
            self._by_namespace = {}
            for qns, name in sorted(self.quotas):
                self._by_namespace.setdefault(qns, []).append(name)
        return self._by_namespace.get(ns, [])

    # -- counting ---------------------------------------------------------------------------

    def _pod_count(self, ns: str) -> PodCount:
        counted = self._pod_counts.get(ns)
        if counted is None:
            counted = self._pod_counts[ns] = PodCount.of(
                {uid: held for uid, (_, held) in self._pods.get(ns, {}).items()})
        return counted

    def _count(self, ns: str) -> None:
        self._count_soon.add(ns)
        self._count_wake.set()

    def _count_if_needed(self, key: tuple[str, str]) -> None:
        q = self.quotas.get(key)
        if q is None:
            return
        view = view_of(q)
        if not view.counted or (self._pods_synced and needs_count(
                view, self._pod_count(key[0]), time.time())):
            self._count(key[0])

    async def count(self, namespaces: set[str]) -> None:
        """Set each quota's ``used`` to what the pods hold plus its pending reservations.

        Exact at any moment, churn or not: the pod view and the releases move together
        (under ``_pods_lock``), and reservations in flight on any replica are in the quota's
        own ledger, which the store applies the count to as it is at write time.
        """
        async with self._pods_lock:
            if not self._pods_synced:
                self._count_soon |= namespaces  # after the pod watch's first list
                return
            now = time.time()
            self._dead = {u: t for u, t in self._dead.items() if t > time.monotonic()}
            for ns, name in [(n, q) for n in sorted(namespaces) for q in self._quotas_in(n)]:
                q = self.quotas.get((ns, name))
                if q is None:
                    continue
                view, pods = view_of(q), self._pod_count(ns)
                if not needs_count(view, pods, now):
                    continue
                dead = await self._dead_reservations(ns, view.pending, pods, now)
                await self.store.count(ns, name, Count(pods, frozenset(dead)))
                if not view.counted:
                    log.info("quota counted", extra={"namespace": ns, "quota": name})
                if dead:
                    log.info("reservations given back: no such pod by their deadline",
                             extra={"namespace": ns, "quota": name, "uids": sorted(dead)})

    async def _dead_reservations(self, ns: str, pending: Mapping[str, Pending], pods: PodCount,
                                 now: float) -> set[str]:
        """Pending reservations whose create request has ended without their pod: expired,
        not seen by the pod watch, and not there when asked (a GET, in case the watch is
        behind).  Remembered, so a late DELETED event of such a pod releases nothing."""
        dead = set()
        for uid in sorted(dead_candidates(pending, pods, now)):
            try:
                pod = await self.kube.get(path("", "v1", "pods", ns, pending[uid].pod))
                if (pod.get("metadata") or {}).get("uid") == pod_of(uid):
                    continue  # it exists: the watch will bring it
            except ApiError as exc:
                if exc.status != 404:
                    continue
            dead.add(uid)
            self._dead[uid] = time.monotonic() + TOMBSTONE_S
        return dead

    async def recount_loop(self) -> None:
        """Count soon what changed, and everything every ``recount_interval_s``."""
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        while True:
            try:
                await asyncio.wait_for(self._count_wake.wait(),
                                       max(0.0, last_full + self.recount_interval_s - loop.time()))
                await asyncio.sleep(COUNT_DEBOUNCE_S)
            except TimeoutError:
                pass
            self._count_wake.clear()
            namespaces, self._count_soon = self._count_soon, set()
            if loop.time() - last_full >= self.recount_interval_s:
                namespaces |= {ns for ns, _ in self.quotas}
                last_full = loop.time()
            try:
                await self.count(namespaces)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("count failed", extra={"error": str(exc)})
                self._count_soon |= namespaces
                await asyncio.sleep(1.0)
                self._count_wake.set()

    # -- GPUQuota ---------------------------------------------------------------------------

    async def reconcile_quota(self, q: Obj) -> None:
        meta, status = q["metadata"], q.get("status") or {}
        gen = int(meta.get("generation") or 1)
        try:
            limits, problem = limits_of(q.get("spec") or {}), None
        except FieldError as exc:
            limits, problem = Limits(), str(exc)
        used = state_of(status).used
        old = _conditions(status.get("conditions"))
        conds = quota_conditions(old, limits, used, gen, problem)
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
        """Budgeted pods: the pod view the count reads, and releases (one event at a time,
        under ``_pods_lock``); an error in one event is logged and counted, and the next
        event is handled."""
        async def handle(typ: str, obj: Obj) -> None:
            async with self._pods_lock:
                if typ != "SYNC":
                    self._see_pod(typ, obj)
                    await self.on_pod(typ, obj)
                    return
                items = obj.get("items") or []
                self._pods.clear()
                self._pod_counts.clear()
                for pod in items:
                    self._see_pod("ADDED", pod)
                self._pods_synced = True
                for pod in items:  # one pod's failure must not skip the others
                    await handle_one(self.on_pod, "ADDED", pod, "pods")
                for ns, _ in self.quotas:
                    self._count(ns)
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
