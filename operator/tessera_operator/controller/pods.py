"""The leader's view of the budgeted pods: what each holds (the GPUQuota count reads it),
live resizes (:mod:`tessera_operator.controller.resize`), and the growth holders that hold
them in the API server's count (:mod:`tessera_operator.controller.holders`).

One pod event at a time, under :attr:`PodController.lock` (a resize included); holders
settle under the same lock, from the watches' view and this replica's own writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import BUDGETED_CLAIMS, LABEL_BUDGETED, LABEL_CLAIM_OF, LABEL_GROWTH_OF
from tessera.kube.client import ApiError, Kube, Obj, follow, handle_one, path
from tessera.kube.health import Health
from tessera.kube.loops import work_off
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.holders import Holders, Owner
from tessera_operator.controller.resize import Resizer, pending_request, pod_need
from tessera_operator.quota.arith import Usage, pod_counts, pod_usage, total
from tessera_operator.quota.claims import PodRef
from tessera_operator.quota.holders import is_zero

DEBOUNCE_S = 0.1
"""Work marked dirty is done this soon after (marks within it are done together)."""


@dataclass(frozen=True)
class SeenPod:
    """A budgeted pod as the pod watch (or the leader's own last write) has it."""

    name: str
    live: Usage
    """What it holds now (its live budget; zero once finished)."""
    need: Usage
    """What its growth holders must hold (:func:`tessera_operator.controller.resize.pod_need`)."""
    rv: int = 0


def rv_of(obj: Mapping[str, Any]) -> int:
    """resourceVersion as a number, only to keep the newer of two copies of one object."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class PodController:
    kube: Kube
    cache: QuotaCache
    on_namespace: Callable[[str], None]
    """Told when a namespace's pods change (its GPUQuotas are counted soon)."""
    recount_interval_s: float = 5.0
    component: str = "tessera-operator"
    health: Health | None = None
    holder_image: str = "registry.k8s.io/pause:3.10"
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while one pod event is handled (a resize included), while holders settle, and
    while a GPUQuota is counted from this view."""
    synced: bool = False
    """The pod watch has listed every budgeted pod."""
    resizer: Resizer | None = None
    """Set when this replica leads (it needs the seal key)."""
    holders: Holders | None = None
    _pods: dict[str, dict[str, SeenPod]] = field(default_factory=dict)
    """Namespace -> pod UID -> what it holds."""
    _holders_synced: bool = False
    _settle_dirty: set[str] = field(default_factory=set)
    """Pod UIDs whose holders may not hold what they need."""
    _settle_wake: asyncio.Event = field(default_factory=asyncio.Event)

    def lead_with(self, key: bytes) -> None:
        """This replica leads: resizes are answered and sealed with ``key``."""
        self.holders = Holders(self.kube, self.holder_image)
        self.resizer = Resizer(self.kube, self.cache, self.holders, key, self.component)

    def forget(self) -> None:
        """Leadership lost: the next leadership rebuilds the view from its own watches."""
        self._pods.clear()
        self.synced = False
        self.resizer = None
        self.holders = None
        self._holders_synced = False
        self._settle_dirty.clear()

    def total(self, ns: str) -> Usage:
        """What the namespace's running GPU pods hold, as the pod watch has them."""
        return total(p.live for p in self._pods.get(ns, {}).values())

    # -- pods -------------------------------------------------------------------------------

    async def on_pod(self, typ: str, pod: Obj) -> None:
        """Answer a pod's budget request (live resize) and settle its holders."""
        if typ != "DELETED" and pending_request(pod) and self.resizer is not None:
            written = await self.resizer.reconcile(pod)
            if written is not None:
                self.see("MODIFIED", written)
        await self._settle(str((pod.get("metadata") or {}).get("uid") or ""))

    def see(self, typ: str, pod: Obj) -> bool:
        """Keep the view: what each budgeted pod holds now (zero once finished) and what its
        growth holders must hold; never older than what this replica wrote itself.  False
        when ``pod`` is older than the view (its newer version was seen or written)."""
        meta = pod.get("metadata") or {}
        ns, uid = str(meta.get("namespace")), str(meta.get("uid") or "")
        pods = self._pods.setdefault(ns, {})
        if typ == "DELETED":
            pods.pop(uid, None)
        else:
            rv = rv_of(pod)
            known = pods.get(uid)
            if known is not None and rv < known.rv:
                return False
            live = pod_usage(pod) if pod_counts(pod) else Usage()
            needed = pod_need(pod, self.resizer.key) if self.resizer is not None else Usage()
            pods[uid] = SeenPod(str(meta.get("name")), live, needed, rv)
        self.on_namespace(ns)
        return True

    async def on_watch_event(self, typ: str, obj: Obj) -> None:
        """One event of the budgeted pods' watch, under :attr:`lock`."""
        async with self.lock:
            if typ != "SYNC":
                if self.see(typ, obj):  # an event older than the leader's own write
                    await self.on_pod(typ, obj)  # is not answered again
                return
            items = obj.get("items") or []
            self._pods.clear()
            for pod in items:
                self.see("ADDED", pod)
            self.synced = True
            if self.holders is not None:
                self._settle_dirty.update(self.holders.owners())
                self._settle_wake.set()
            for pod in items:  # one pod's failure must not skip the others
                await handle_one(self.on_pod, "ADDED", pod, "pods")

    async def watch_pods(self) -> None:
        """Budgeted pods (the device plugin's, ``true``, and those of DRA claims, ``claims``),
        one event at a time under :attr:`lock`; an error in one event is logged and counted,
        and the next event is handled."""
        await follow(self.kube.watch(path("", "v1", "pods"), LABEL_BUDGETED,
                                     name="pods", health=self.health),
                     self.on_watch_event, "pods")

    async def see_claim_users(self, pods: list[PodRef]) -> None:
        """Label ``tessera.dev/budgeted=claims`` the pods that tessera's claims are reserved
        for and the pod watch does not show yet (nothing else marks them: they ask no
        resource of tessera's, and the webhook does not see them).  The label write names
        the pod's UID: a pod made again under the name is not labelled by mistake."""
        if self.resizer is None or not self.synced:
            return
        for ref in pods:
            if ref.uid in self._pods.get(ref.namespace, {}):
                continue
            try:
                await self.kube.merge_patch(path("", "v1", "pods", ref.namespace, ref.name), {
                    "metadata": {"uid": ref.uid, "labels": {LABEL_BUDGETED: BUDGETED_CLAIMS}}})
            except ApiError as exc:
                if exc.status not in (404, 409, 422):  # gone, or another pod by that name
                    raise

    # -- growth holders ---------------------------------------------------------------------

    def _seen(self, uid: str) -> tuple[str, SeenPod] | None:
        for ns, pods in self._pods.items():
            if uid in pods:
                return ns, pods[uid]
        return None

    async def _settle(self, uid: str) -> None:
        """Bring one pod's growth holders to what it needs (under :attr:`lock`).  A pod the
        watch does not know (gone, or no longer budgeted) needs nothing.  A need the API
        server will not hold takes the pod's growth back."""
        holders, resizer = self.holders, self.resizer
        if holders is None or resizer is None or not self.synced:
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
        self.see("MODIFIED", await resizer.take_back(current, refused))

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
        await work_off(self._settle_dirty, self._settle_wake, self.recount_interval_s,
                       DEBOUNCE_S, self._holding_or_needing, self.settle,
                       "growth holders settle")

    async def settle(self, uid: str) -> None:
        """Bring one pod's growth holders to what it needs, under :attr:`lock`."""
        async with self.lock:
            await self._settle(uid)

    def _holding_or_needing(self) -> list[str]:
        """Pods with growth holders, or whose budget needs some."""
        held = self.holders.owners() if self.holders is not None else []
        return [*held, *(uid for pods in self._pods.values() for uid, p in pods.items()
                         if not is_zero(p.need))]

    async def watch_holders(self) -> None:
        """The growth holders of pods (selected by their label; claim holders are
        :mod:`tessera_operator.controller.claims`')."""
        await follow(self.kube.watch(path("", "v1", "pods"), f"{LABEL_GROWTH_OF},!{LABEL_CLAIM_OF}",
                                     name="growth-holders", health=self.health),
                     self.on_holder, "growth-holders")
