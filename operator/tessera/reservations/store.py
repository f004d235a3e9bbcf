"""Every replica's copy of the GPUQuotas, and the conditional writes that change their usage.

Reservation follows Kubernetes' ResourceQuota admission: read the quota, check the request
against ``hard``, write the new ``used`` with the read ``resourceVersion`` as precondition,
and on a conflict (another replica or request won) read again and re-check.  So concurrent
creates through any number of replicas can never push ``used`` past ``hard``.  A pod must
fit every GPUQuota of its namespace; if a later quota refuses, the earlier reservations are
given back.  Each reservation is recorded under the pod's UID in the same write
(:mod:`tessera.quota.ledger`), so releases and counts know which reservations are still in
flight, on any replica.

Within one replica, changes to the same quota are group-committed: requests that arrive
while a write is in flight are decided one after another (:func:`tessera.quota.batch.
apply_in_order`) against the newest copy this replica knows and written as one update.  Only
writes by other replicas (or releases/recount) cost a conflict and a re-read.  The
resourceVersion precondition, not the batching, is what makes reservations correct.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera import metrics
from tessera.api.names import GPUQUOTAS, GROUP, VERSION
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera.kube.health import Health
from tessera.quota.arith import QuotaView, Violation
from tessera.quota.batch import Change, Count, Release, Reserve, State, apply_in_order
from tessera.quota.objects import status_patch, view_of

log = logging.getLogger("tessera.reservations")

MAX_ATTEMPTS = 50
"""Conflict retries per quota; each loser re-reads, so this bounds contention, not work."""

Listener = Callable[[str, Obj], None]


def quota_url(ns: str | None = None, name: str | None = None) -> str:
    return path(GROUP, VERSION, GPUQUOTAS, ns, name)


@dataclass
class _Pending:
    change: Change
    fut: asyncio.Future[list[Violation] | None]


@dataclass
class QuotaStore:
    """The GPUQuotas from one watch, and group-committed conditional usage writes."""

    kube: Kube
    health: Health | None = None
    conflict_wait_s: float = 0.02
    """After a lost write, how long to wait for the quota watch to bring the winner's
    version before paying a GET for it."""
    _latest: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _cache: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _synced: bool = False
    _changed: asyncio.Event | None = None
    _listener: Listener | None = None
    _views: dict[tuple[str, str], tuple[str, QuotaView]] = field(default_factory=dict)
    _queues: dict[tuple[str, str], list[_Pending]] = field(default_factory=dict)
    _workers: dict[tuple[str, str], asyncio.Task[None]] = field(default_factory=dict)

    # -- reading ----------------------------------------------------------------------------

    async def quotas(self, ns: str) -> list[Obj]:
        """The namespace's GPUQuotas: from this replica's watch (or, until it has synced,
        the API server's watch cache).  A stale copy costs one conflict and a re-read in
        :meth:`reserve` (every write is conditional), never a wrong count."""
        if not self._synced:
            return (await self.kube.list(quota_url(ns), cached=True)).get("items") or []
        return [self._newest(key, q) for key, q in self._cache.items() if key[0] == ns]

    def _newest(self, key: tuple[str, str], q: Obj) -> Obj:
        known = self._latest.get(key)
        return known if known is not None and _rv(known) > _rv(q) else q

    def snapshot(self) -> list[Obj]:
        """Every GPUQuota this replica's watch knows, each in its newest known version."""
        return [self._newest(key, q) for key, q in list(self._cache.items())]

    def view(self, q: Obj) -> QuotaView:
        """:func:`view_of` a quota this replica read from the API server, parsed once per
        resourceVersion: with a ledger of pending reservations, parsing it again for every
        review and every write cost admission more CPU than anything else it does."""
        meta = q.get("metadata") or {}
        key, rv = (str(meta.get("namespace")), str(meta.get("name"))), meta.get("resourceVersion")
        known = self._views.get(key)
        if rv and known is not None and known[0] == rv:
            return known[1]
        view = view_of(q)
        if rv:
            self._views[key] = (str(rv), view)
        return view

    def subscribe(self, listener: Listener | None) -> None:
        """Pass this replica's quota watch events on (the leader's controller listens).

        One watch serves admission and reconciliation: a second one through kopf cost the
        leader's event loop enough per reservation to show in admission's p99.  A new
        listener first gets a SYNC with every quota known now.
        """
        self._listener = listener
        if listener is not None and self._synced:
            listener("SYNC", {"items": list(self._cache.values())})

    async def watch(self) -> None:
        """Keep the GPUQuotas in memory: admission reads them without a LIST per pod, and a
        reservation that lost a race learns the winner's version from the watch instead of
        a GET.  Only a cache: every write still carries the resourceVersion it was computed
        from."""
        try:
            async for typ, obj in self.kube.watch(quota_url(), name="quota-cache",
                                                  health=self.health):
                if typ == "SYNC":
                    self._cache = {_key(q): q for q in obj.get("items") or []}
                    self._views = {k: v for k, v in self._views.items() if k in self._cache}
                    self._synced = True
                    for key, q in self._cache.items():
                        self._remember(key, q)
                elif typ == "DELETED":
                    self._cache.pop(_key(obj), None)
                    self._views.pop(_key(obj), None)
                else:
                    key = _key(obj)
                    self._cache[key] = obj
                    self._remember(key, obj)
                if self._changed is not None:
                    self._changed.set()
                    self._changed = None
                if self._listener is not None:
                    try:
                        self._listener(typ, obj)
                    except Exception:  # the admission cache must outlive a listener bug
                        log.exception("quota listener failed", extra={"event": typ})
        finally:
            self._synced = False

    @property
    def synced(self) -> bool:
        """Whether this replica holds every GPUQuota (its watch has listed them)."""
        return self._synced

    def _remember(self, key: tuple[str, str], q: Obj) -> None:
        known = self._latest.get(key)
        if known is not None and _rv(q) > _rv(known):
            self._latest[key] = q

    async def _newer(self, key: tuple[str, str], than: int) -> Obj | None:
        """The quota at a resourceVersion above ``than``, from the watch if it comes soon."""
        if not self._synced:
            return None
        deadline = asyncio.get_running_loop().time() + self.conflict_wait_s
        while True:
            got = self._cache.get(key)
            if got is not None and _rv(got) > than:
                return got
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return None
            if self._changed is None:
                self._changed = asyncio.Event()
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return None

    # -- writing ----------------------------------------------------------------------------

    async def reserve(self, ns: str, quotas: list[Obj], r: Reserve) -> list[Violation]:
        """Add the pod's usage to every quota (CAS); on refusal give back what was taken."""
        done: list[str] = []
        for q in sorted(quotas, key=lambda q: str(q["metadata"]["name"])):
            refused = await self._cas(ns, q, r)
            if refused is None:  # quota vanished meanwhile: nothing to count against
                continue
            if refused:
                for name in done:
                    await self.release(ns, name, Release(r.uid, None))
                return refused
            done.append(str(q["metadata"]["name"]))
        return []

    async def reserve_in(self, ns: str, r: Reserve) -> list[Violation]:
        """:meth:`reserve` against this replica's copies of the namespace's quotas."""
        return await self.reserve(ns, await self.quotas(ns), r)

    async def release(self, ns: str, name: str, r: Release) -> None:
        await self.change(ns, name, r)

    async def count(self, ns: str, name: str, c: Count) -> None:
        await self.change(ns, name, c)

    async def change(self, ns: str, name: str, change: Change) -> None:
        """Apply one change to quota ``ns/name`` as it is now (read, then CAS)."""
        try:
            q = await self.kube.get(quota_url(ns, name))
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        await self._cas(ns, q, change)

    async def _cas(self, ns: str, q: Obj, change: Change) -> list[Violation] | None:
        """Queue one change on quota ``q``; [] = done, None = no such quota."""
        key = (ns, str(q["metadata"]["name"]))
        known = self._latest.get(key)
        if known is None or _rv(q) > _rv(known):
            self._latest[key] = q
        fut: asyncio.Future[list[Violation] | None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(key, []).append(_Pending(change, fut))
        worker = self._workers.get(key)
        if worker is None or worker.done():
            self._workers[key] = asyncio.create_task(self._drain(key))
        return await fut

    async def _drain(self, key: tuple[str, str]) -> None:
        """Group commit: everything queued while a write was in flight goes in one write."""
        while self._queues.get(key):
            batch = self._queues.pop(key)
            metrics.RESERVATION_BATCH.observe(len(batch))
            try:
                results = await self._write_batch(key, batch)
            except Exception as exc:
                for p in batch:
                    if not p.fut.done():
                        p.fut.set_exception(exc)
                continue
            for p, r in zip(batch, results, strict=True):
                if not p.fut.done():
                    p.fut.set_result(r)

    async def _write_batch(self, key: tuple[str, str], batch: list[_Pending]
                           ) -> list[list[Violation]] | list[None]:
        ns, name = key
        url = quota_url(ns, name)
        q = self._latest[key]
        for _ in range(MAX_ATTEMPTS):
            view = self.view(q)
            results, state = apply_in_order(view, [p.change for p in batch])
            if state.used is None or state == State.of(view):
                return results  # nothing to write (or a quota never counted: all refused)
            sent = time.perf_counter()
            try:
                self._latest[key] = await self.kube.merge_patch(url + "/status",
                                                                status_patch(q, state))
                _count_heals(ns, view, batch, state)
                return results
            except ApiError as exc:
                if exc.status == 404:
                    self._latest.pop(key, None)
                    return [None] * len(batch)
                if exc.status != 409:
                    raise
                metrics.RESERVATION_CONFLICTS.inc()
            finally:
                metrics.QUOTA_WRITE_SECONDS.observe(time.perf_counter() - sent)
            # another replica won: let what queued meanwhile ride along on the retry
            # (fewer writes, so fewer conflicts), after a little jitter so two replicas
            # do not keep colliding in lockstep
            batch.extend(self._queues.pop(key, []))
            await asyncio.sleep(random.uniform(0, 0.004))
            newer = await self._newer(key, _rv(q))
            if newer is not None:
                q = self._latest[key] = newer
                continue
            try:
                q = self._latest[key] = await self.kube.get(url)
            except ApiError as exc:
                if exc.status == 404:
                    self._latest.pop(key, None)
                    return [None] * len(batch)
                raise
        busy = Violation(name, "", "", "", "", reason=(
            f"too many concurrent updates ({MAX_ATTEMPTS} conflicts); try again"))
        return [[busy] for _ in batch]


def _count_heals(ns: str, view: QuotaView, batch: list[_Pending], state: State) -> None:
    """A count that set ``used`` to something the other changes alone would not have: drift
    healed (or dead reservations given back).  A quota's first count is no heal."""
    if not view.counted or not any(isinstance(p.change, Count) for p in batch):
        return
    _, without = apply_in_order(view, [p.change for p in batch
                                       if not isinstance(p.change, Count)])
    if without.used != state.used:
        metrics.RECOUNT_HEALS.inc()
        log.info("count healed usage", extra={"namespace": ns, "quota": view.name,
                                              "was": str(without.used), "now": str(state.used)})


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


def _rv(obj: Mapping[str, Any]) -> int:
    """resourceVersion as a number, only to pick the newer of two copies of one object
    (a wrong pick costs a conflict and a re-read, never a wrong count)."""
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0
