"""The leader's control loops: GPUPartition status; GPUQuota status and the ResourceQuota
each GPUQuota manages; live resizes and the growth holders that hold them.

Level-triggered: every event marks work dirty and the loops recompute the whole answer from
the caches with the pure modules (:mod:`tessera.partition`, :mod:`tessera_operator.quota`),
then write only what differs.  So a settled cluster sees no writes at all, and a missed event
is healed by the next one or by the periodic pass.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tessera.api.conditions import DEGRADED, PROGRESSING, READY, Condition
from tessera.api.inventory import NodeInventory, from_node
from tessera.api.names import (
    API_VERSION,
    FINALIZER_RESET,
    GPUPARTITIONS,
    GPUQUOTAS,
    GROUP,
    LABEL_BUDGETED,
    LABEL_GPU_PRODUCT,
    LABEL_GROWTH_OF,
    VERSION,
)
from tessera.api.partition import GPUPartitionSpec, GPUPartitionStatus, NodePartitionStatus
from tessera.kube.client import ApiError, Kube, Obj, follow, handle_one, path
from tessera.kube.events import post_event
from tessera.kube.health import Health
from tessera.kube.loops import work_off
from tessera.kube.merge import merge_diff
from tessera.partition import PartitionView, aggregate, resolve, transitions
from tessera_operator import metrics
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.holders import Holders, Owner
from tessera_operator.controller.resize import Resizer, pending_request, pod_need
from tessera_operator.quota import managed
from tessera_operator.quota.arith import Limits, Usage, pod_counts, pod_usage
from tessera_operator.quota.holders import is_zero
from tessera_operator.quota.objects import (
    FieldError,
    limits_of,
    readable_limits,
    status_patch,
    used_of,
)
from tessera_operator.quota.status import quota_conditions

log = logging.getLogger("tessera_operator.controller")

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
"""A namespace whose pods changed is counted this soon after (changes within it are counted
together)."""


@dataclass(frozen=True)
class SeenPod:
    """A budgeted pod as the pod watch (or the leader's own last write) has it."""

    name: str
    live: Usage
    """What it holds now (its live budget; zero once finished)."""
    need: Usage
    """What its growth holders must hold (:func:`tessera_operator.controller.resize.pod_need`)."""
    rv: int = 0


@dataclass
class Controller:
    kube: Kube
    cache: QuotaCache
    recount_interval_s: float = 5.0
    component: str = "tessera-operator"
    health: Health | None = None
    holder_image: str = "registry.k8s.io/pause:3.10"
    nodes: dict[str, NodeInventory] = field(default_factory=dict)
    partitions: dict[str, Obj] = field(default_factory=dict)
    quotas: dict[tuple[str, str], Obj] = field(default_factory=dict)
    managed: dict[tuple[str, str], Obj] = field(default_factory=dict)
    """The managed ResourceQuotas by (namespace, ResourceQuota name), from their watch."""
    _managed_synced: bool = False
    _dirty: asyncio.Event = field(default_factory=asyncio.Event)
    _quota_dirty: set[tuple[str, str]] = field(default_factory=set)
    _quota_wake: asyncio.Event = field(default_factory=asyncio.Event)
    _pods: dict[str, dict[str, SeenPod]] = field(default_factory=dict)
    """The pod watch's view: namespace -> pod UID -> what it holds."""
    _pods_synced: bool = False
    _pods_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while one pod event is handled (a resize included), and while holders settle."""
    _by_namespace: dict[str, list[str]] | None = None
    resizer: Resizer | None = None
    """Set when this replica leads (it needs the seal key)."""
    holders: Holders | None = None
    _holders_synced: bool = False
    _settle_dirty: set[str] = field(default_factory=set)
    """Pod UIDs whose holders may not hold what they need."""
    _settle_wake: asyncio.Event = field(default_factory=asyncio.Event)

    def lead_with(self, key: bytes) -> None:
        """This replica leads: resizes are answered and sealed with ``key``."""
        self.holders = Holders(self.kube, self.holder_image)
        self.resizer = Resizer(self.kube, self.cache, self.holders, key, self.component)

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
            self.quotas = {(str(q["metadata"]["namespace"]), str(q["metadata"]["name"])): q
                           for q in body.get("items") or []}
            self._quota_dirty.update(self.quotas)
        else:
            meta = body["metadata"]
            key = (str(meta["namespace"]), str(meta["name"]))
            if typ == "DELETED":
                self.quotas.pop(key, None)
                self._quota_dirty.discard(key)
            else:
                self.quotas[key] = body
                self._quota_dirty.add(key)
        metrics.WATCHED.labels("gpuquota").set(len(self.quotas))
        self._by_namespace = None
        self._quota_wake.set()

    def on_managed(self, typ: str, rq: Obj) -> None:
        """A managed ResourceQuota changed (a user's edit or delete is set back)."""
        if typ == "SYNC":
            self.managed = {_key(item): item for item in rq.get("items") or []}
            self._managed_synced = True
            self._quota_dirty.update(self.quotas)
        else:
            key = _key(rq)
            if typ == "DELETED":
                self.managed.pop(key, None)
            elif _rv(rq) >= _rv(self.managed.get(key) or {}):
                self.managed[key] = rq  # never older than what this replica wrote itself
            self._quota_dirty.update((key[0], q) for q in self._quotas_in(key[0])
                                     if managed.managed_name(q) == key[1])
        self._quota_wake.set()

    def forget_quota_work(self) -> None:
        """Leadership lost: whatever was dirty is the next leader's to reconcile, and the pod
        and ResourceQuota views are rebuilt from the next leadership's own watches."""
        self._quota_dirty.clear()
        self._quota_wake.clear()
        self._by_namespace = None
        self._pods.clear()
        self._pods_synced = False
        self.managed.clear()
        self._managed_synced = False
        self.resizer = None
        self.holders = None
        self._holders_synced = False
        self._settle_dirty.clear()

    async def quota_loop(self) -> None:
        """Reconcile each dirty quota from its newest copy (level-triggered, one at a time),
        and every quota every ``recount_interval_s``."""
        async def one(key: tuple[str, str]) -> None:
            q = self.quotas.get(key)
            if q is not None:
                async with self._pods_lock:
                    await self.reconcile_quota(q)
        await work_off(self._quota_dirty, self._quota_wake, self.recount_interval_s,
                       COUNT_DEBOUNCE_S, lambda: list(self.quotas), one, "quota reconcile")

    async def on_pod(self, typ: str, pod: Obj) -> None:
        """Answer a pod's budget request (live resize); settle its holders; count its
        namespace soon."""
        if typ != "DELETED" and pending_request(pod) and self.resizer is not None:
            written = await self.resizer.reconcile(pod)
            if written is not None:
                self._see_pod("MODIFIED", written)
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        await self._settle(uid)

    def _see_pod(self, typ: str, pod: Obj) -> None:
        """Keep the pod view: what each budgeted pod holds now (zero once finished) and what
        its growth holders must hold; never older than what this replica wrote itself."""
        meta = pod.get("metadata") or {}
        ns, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
        pods = self._pods.setdefault(ns, {})
        if typ == "DELETED":
            pods.pop(uid, None)
        else:
            rv = _rv(pod)
            known = pods.get(uid)
            if known is not None and rv < known.rv:
                return
            live = pod_usage(pod) if pod_counts(pod) else Usage()
            needed = pod_need(pod, self.resizer.key) if self.resizer is not None else Usage()
            pods[uid] = SeenPod(str(meta.get("name")), live, needed, rv)
        if self._quotas_in(ns):
            self._quota_dirty.update((ns, name) for name in self._quotas_in(ns))
            self._quota_wake.set()

    def _quotas_in(self, ns: str) -> list[str]:
        """Names of the namespace's quotas (an index rebuilt after the quotas change)."""
        if self._by_namespace is None:
            self._by_namespace = {}
            for qns, name in sorted(self.quotas):
                self._by_namespace.setdefault(qns, []).append(name)
        return self._by_namespace.get(ns, [])

    def pod_total(self, ns: str) -> Usage:
        """What the namespace's running GPU pods hold, as the pod watch has them."""
        out = Usage()
        for p in self._pods.get(ns, {}).values():
            out = out + p.live
        return out

    # -- growth holders ---------------------------------------------------------------------

    def _seen(self, uid: str) -> tuple[str, SeenPod] | None:
        for ns, pods in self._pods.items():
            if uid in pods:
                return ns, pods[uid]
        return None

    async def _settle(self, uid: str) -> None:
        """Bring one pod's growth holders to what it needs (under ``_pods_lock``).  A pod
        the watch does not know (gone, or no longer budgeted) needs nothing.  A need the
        API server will not hold takes the pod's growth back."""
        holders, resizer = self.holders, self.resizer
        if holders is None or resizer is None or not self._pods_synced:
            return
        if not self._holders_synced:
            self._settle_dirty.add(uid)
            return
        seen = self._seen(uid)
        if seen is None:
            ns = holders.namespaces.get(uid)
            if ns is None or not holders.of(uid):
                return
            owner, needed = Owner(ns, "", uid), Usage()
        else:
            ns, pod = seen
            owner, needed = Owner(ns, pod.name, uid), pod.need
            if is_zero(needed) and not holders.of(uid):
                return
        refused = await holders.settle(owner, needed, "settle")
        if refused is None or seen is None:
            return
        try:
            current = await self.kube.get(path("", "v1", "pods", owner.namespace, owner.name))
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        if pod_need(current, resizer.key) != needed:
            self._settle_dirty.add(uid)  # it changed meanwhile: decide on what it is now
            self._settle_wake.set()
            return
        self._see_pod("MODIFIED", await resizer.take_back(current, refused))

    def on_holder(self, typ: str, pod: Obj) -> None:
        """A growth holder changed: its pod's holders may no longer hold what it needs."""
        if self.holders is None:
            return
        if typ == "SYNC":
            self.holders.on_sync(pod.get("items") or [])
            self._holders_synced = True
            self._settle_dirty.update(self._holding_or_needing())
        else:
            owner = self.holders.on_event(typ, pod)
            if owner:
                self._settle_dirty.add(owner)
        self._settle_wake.set()

    async def settle_loop(self) -> None:
        """Settle the holders of every pod marked dirty, and every ``recount_interval_s``
        those of every pod that has or needs any."""
        async def one(uid: str) -> None:
            async with self._pods_lock:
                await self._settle(uid)
        await work_off(self._settle_dirty, self._settle_wake, self.recount_interval_s,
                       COUNT_DEBOUNCE_S, self._holding_or_needing, one, "growth holders settle")

    def _holding_or_needing(self) -> list[str]:
        """Pods with growth holders, or whose budget needs some."""
        held = self.holders.owners() if self.holders is not None else []
        return [*held, *(uid for pods in self._pods.values() for uid, p in pods.items()
                         if not is_zero(p.need))]

    # -- GPUQuota ---------------------------------------------------------------------------

    async def reconcile_quota(self, q: Obj) -> None:
        """The quota's managed ResourceQuota, then its status (used, summary, conditions)."""
        meta, status = q["metadata"], q.get("status") or {}
        unenforced: tuple[str, str] | None = None
        try:
            unenforced = await self._reconcile_managed(q)
        except ApiError as exc:  # its status is still worth writing; retried next pass
            log.warning("managed ResourceQuota not reconciled", extra={
                "namespace": meta.get("namespace"), "quota": meta.get("name"),
                "error": str(exc)})
            unenforced = (managed.UNWRITABLE, f"its ResourceQuota "
                          f"{managed.managed_name(str(meta.get('name')))} cannot be written "
                          f"({exc.message[:300]})")
        gen = int(meta.get("generation") or 1)
        try:
            limits, problem = limits_of(q.get("spec") or {}), None
        except FieldError as exc:
            limits, problem = Limits(), str(exc)
        used = self.pod_total(str(meta["namespace"])) if self._pods_synced else used_of(status)
        old = _conditions(status.get("conditions"))
        conds = quota_conditions(old, limits, used, gen, problem, unenforced)
        new: dict[str, Any] = {"observedGeneration": gen, "conditions": _dump_conditions(conds)}
        if used is not None:
            new.update(status_patch(q, used)["status"])
        current = {k: status.get(k) for k in new}
        current["conditions"] = _dump_conditions(old)
        if used is not None and used_of(status) == used:
            current["used"] = new["used"]
        if current == new:
            return
        url = path(GROUP, VERSION, GPUQUOTAS, meta["namespace"], meta["name"])
        try:
            await self.kube.merge_patch(url + "/status", {
                "metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": new})
            metrics.STATUS_WRITES.labels("gpuquota", "status").inc()
        except ApiError as exc:
            if exc.status not in (404, 409):
                raise
            return  # a newer version is on its way as an event
        await self._events(q, "GPUQuota", old, conds)

    async def _reconcile_managed(self, q: Obj) -> tuple[str, str] | None:
        """Create the quota's ResourceQuota, or set it back to what it must say; why it does
        not count for the quota now, if it does not (:func:`managed.enforcement`)."""
        if not self._managed_synced:
            return None
        meta = q["metadata"]
        ns, name = str(meta["namespace"]), str(meta["name"])
        if meta.get("deletionTimestamp"):
            return None
        rq_name = managed.managed_name(name)
        limits = readable_limits(q)
        want = managed.desired(q, limits)
        have = self.managed.get((ns, rq_name))
        if have is None:
            try:
                have = await self.kube.create(path("", "v1", "resourcequotas", ns), want)
                metrics.MANAGED_QUOTA_WRITES.labels("created").inc()
                log.info("managed ResourceQuota created", extra={
                    "namespace": ns, "quota": name, "hard": want["spec"]["hard"]})
            except ApiError as exc:
                if exc.status != 409:
                    raise
                # one by that name exists without tessera's label: ours (set back) or not
                have = await self.kube.get(path("", "v1", "resourcequotas", ns, rq_name))
                if not managed.owned_by(have, str(meta.get("uid") or "")):
                    return managed.enforcement(q, limits, have)
            self.managed[(ns, rq_name)] = have
        patch = managed.drift(have, want)
        if patch is not None:
            have = await self.kube.merge_patch(
                path("", "v1", "resourcequotas", ns, rq_name), patch)
            self.managed[(ns, rq_name)] = have
            metrics.MANAGED_QUOTA_WRITES.labels("set-back").inc()
            log.info("managed ResourceQuota set back", extra={"namespace": ns, "quota": name,
                                                              "patch": patch})
        return managed.enforcement(q, limits, have)

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
        """Budgeted pods: the pod view the count reads, and resizes (one event at a time,
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
                for pod in items:
                    self._see_pod("ADDED", pod)
                self._pods_synced = True
                self._quota_dirty.update(self.quotas)
                self._quota_wake.set()
                if self.holders is not None:
                    self._settle_dirty.update(self.holders.owners())
                    self._settle_wake.set()
                for pod in items:  # one pod's failure must not skip the others
                    await handle_one(self.on_pod, "ADDED", pod, "pods")
        await follow(self.kube.watch(path("", "v1", "pods"), f"{LABEL_BUDGETED}=true",
                                     name="pods", health=self.health), handle, "pods")

    async def watch_holders(self) -> None:
        """The growth holders (selected by their label)."""
        await follow(self.kube.watch(path("", "v1", "pods"), LABEL_GROWTH_OF,
                                     name="growth-holders", health=self.health),
                     self.on_holder, "growth-holders")

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


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _rv(obj: Mapping[str, Any]) -> int:
    """resourceVersion as a number, only to keep the newer of two copies of one object."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
