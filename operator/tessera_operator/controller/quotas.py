"""GPUQuotas, the leader's part: each quota's managed ResourceQuota (the API server's
race-free count: :mod:`tessera_operator.quota.managed`) created and set back, and its status
(what the namespace's GPU pods hold, from :class:`~tessera_operator.controller.pods.PodController`,
and its conditions) written only when it differs.

Level-triggered: every event marks a quota dirty and :meth:`QuotaController.loop`
recomputes its whole answer from the caches, so a missed event is healed by the next one or
by the periodic pass.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import GPUQUOTAS, GROUP, VERSION
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.loops import work_off
from tessera_operator import metrics
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.claims import ClaimHolders
from tessera_operator.controller.events import conditions, dump, post_transitions
from tessera_operator.controller.pods import DEBOUNCE_S, PodController, rv_of
from tessera_operator.quota import managed
from tessera_operator.quota.arith import Usage
from tessera_operator.quota.objects import status_patch, used_of
from tessera_operator.quota.status import quota_conditions

log = logging.getLogger("tessera_operator.controller.quotas")


def _key(obj: Obj) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


MAX_GONE = 4096
"""Deleted managed ResourceQuotas remembered at most (their deletes raced a write)."""


@dataclass
class QuotaController:
    kube: Kube
    cache: QuotaCache
    pods: PodController
    recount_interval_s: float = 5.0
    component: str = "tessera-operator"
    claims: ClaimHolders | None = None
    """The claim holders' totals (DRA claims count in ``status.used`` too)."""
    quotas: dict[tuple[str, str], Obj] = field(default_factory=dict)
    """The GPUQuotas by (namespace, name), from this replica's quota watch."""
    managed: dict[tuple[str, str], Obj] = field(default_factory=dict)
    """The managed ResourceQuotas by (namespace, ResourceQuota name), from their watch."""
    _managed_synced: bool = False
    _managed_gone: dict[tuple[str, str], int] = field(default_factory=dict)
    """Managed ResourceQuotas the watch saw deleted, with their last resourceVersion: a
    write's answer that arrives after the delete event is not the object now."""
    _dirty: set[tuple[str, str]] = field(default_factory=set)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _by_namespace: dict[str, list[str]] | None = None

    def on_quota(self, typ: str, body: Obj) -> None:
        """A quota watch event (SYNC carries the whole list): remember it, mark it dirty."""
        if typ == "SYNC":
            self.quotas = {_key(q): q for q in body.get("items") or []}
            self._dirty.update(self.quotas)
        else:
            key = _key(body)
            if typ == "DELETED":
                self.quotas.pop(key, None)  # its ResourceQuota is let go (release_orphan)
            else:
                self.quotas[key] = body
            self._dirty.add(key)
        metrics.WATCHED.labels("gpuquota").set(len(self.quotas))
        self._by_namespace = None
        self._wake.set()

    def on_managed(self, typ: str, rq: Obj) -> None:
        """A managed ResourceQuota changed (a user's edit or delete is set back)."""
        if typ == "SYNC":
            self.managed = {_key(item): item for item in rq.get("items") or []}
            self._managed_gone.clear()
            self._managed_synced = True
            self._dirty.update(self.quotas)
            self._dirty.update((ns, q) for (ns, _), item in self.managed.items()
                               if (q := managed.quota_of(item)) is not None)
        else:
            key = _key(rq)
            if typ == "DELETED":
                self.managed.pop(key, None)
                if len(self._managed_gone) >= MAX_GONE:  # the race it guards lasts seconds
                    self._managed_gone.clear()
                self._managed_gone[key] = rv_of(rq)
            elif rv_of(rq) >= rv_of(self.managed.get(key) or {}):
                self.managed[key] = rq  # never older than what this replica wrote itself
                self._managed_gone.pop(key, None)
            self._dirty.update((key[0], q) for q in self._quotas_in(key[0])
                               if managed.managed_name(q) == key[1])
            owner = managed.quota_of(rq)
            if owner is not None and managed.managed_name(owner) == key[1]:
                self._dirty.add((key[0], owner))  # its GPUQuota may be gone: let it go
        self._wake.set()

    def on_namespace(self, ns: str) -> None:
        """A namespace's GPU pods changed: count its quotas soon."""
        names = self._quotas_in(ns)
        if names:
            self._dirty.update((ns, name) for name in names)
            self._wake.set()

    def forget(self) -> None:
        """Leadership lost: whatever was dirty is the next leader's to reconcile, and the
        views are rebuilt from the next leadership's own watches."""
        self._dirty.clear()
        self._wake.clear()
        self._by_namespace = None
        self.quotas.clear()
        self.managed.clear()
        self._managed_gone.clear()
        self._managed_synced = False

    def _quotas_in(self, ns: str) -> list[str]:
        """Names of the namespace's quotas (an index rebuilt after the quotas change)."""
        if self._by_namespace is None:
            self._by_namespace = {}
            for qns, name in sorted(self.quotas):
                self._by_namespace.setdefault(qns, []).append(name)
        return self._by_namespace.get(ns, [])

    async def loop(self) -> None:
        """Reconcile each dirty quota from its newest copy (level-triggered, one at a time),
        and every quota every ``recount_interval_s``."""
        async def one(key: tuple[str, str]) -> None:
            q = self.quotas.get(key)
            if q is None:
                await self.release_orphan(*key)
                return
            async with self.pods.lock:
                await self.reconcile_quota(q)
        await work_off(self._dirty, self._wake, self.recount_interval_s, DEBOUNCE_S,
                       lambda: list(self.quotas), one, "quota reconcile")

    async def release_orphan(self, ns: str, quota: str) -> None:
        """The GPUQuota is gone: let its deleted managed ResourceQuota go (tessera's finalizer
        held it while the GPUQuota existed; the garbage collector or the namespace's
        deletion deleted it)."""
        if not self._managed_synced:
            return
        rq_name = managed.managed_name(quota)
        rq = self.managed.get((ns, rq_name))
        patch = None if rq is None else managed.release(rq)
        if patch is None:
            return
        try:
            self._remember((ns, rq_name), await self.kube.merge_patch(
                path("", "v1", "resourcequotas", ns, rq_name), patch))
        except ApiError as exc:
            if exc.status not in (404, 409):  # gone, or a newer version: its event comes
                raise
            return
        metrics.MANAGED_QUOTA_WRITES.labels("released").inc()
        log.info("managed ResourceQuota released", extra={"namespace": ns, "quota": quota})

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
        view = self.cache.view(q)
        ns = str(meta["namespace"])
        claims = self.claims
        if self.pods.synced and (claims is None or claims.synced):
            used: Usage | None = self.pods.total(ns) + (claims.total(ns) if claims else Usage())
        else:
            used = used_of(status)
        old = conditions(status.get("conditions"))
        conds = quota_conditions(old, view.hard, used, gen, view.problem, unenforced)
        new: dict[str, Any] = {"observedGeneration": gen, "conditions": dump(conds)}
        if used is not None:
            new.update(status_patch(q, used, view.hard)["status"])
        current = {k: status.get(k) for k in new}
        current["conditions"] = dump(old)
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
        await post_transitions(self.kube, q, "GPUQuota", old, conds, self.component)

    def _remember(self, key: tuple[str, str], rq: Obj) -> None:
        """A write's answer, unless the watch has seen the object deleted since (the answer
        of a write that raced its delete would otherwise stay, and every later pass would
        patch an object that is gone instead of creating it)."""
        if rv_of(rq) <= self._managed_gone.get(key, -1):
            return
        if rv_of(rq) >= rv_of(self.managed.get(key) or {}):
            self.managed[key] = rq

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
        limits = self.cache.view(q).readable_limits
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
            self._remember((ns, rq_name), have)
        patch = managed.drift(have, want)
        if patch is not None:
            try:
                have = await self.kube.merge_patch(
                    path("", "v1", "resourcequotas", ns, rq_name), patch)
            except ApiError as exc:
                if exc.status == 404:  # deleted meanwhile: the next pass creates it again
                    self.managed.pop((ns, rq_name), None)
                raise
            self._remember((ns, rq_name), have)
            metrics.MANAGED_QUOTA_WRITES.labels("set-back").inc()
            log.info("managed ResourceQuota set back", extra={"namespace": ns, "quota": name,
                                                              "patch": patch})
        return managed.enforcement(q, limits, have)

