"""Every replica's copy of the GPUQuotas, from one watch.

Admission reads a namespace's GPUQuotas for each pod without an API call: the per-pod
policy (defaults, max) and tessera's own check of ``hard`` against ``status.used``, which
gives the clear refusal.  That check may see a count a moment old; the race-free count is
the API server's, against the ResourceQuota each GPUQuota manages
(:mod:`tessera_operator.quota.managed`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import GPUQUOTAS, GROUP, VERSION
from tessera.kube.client import Kube, Obj, path
from tessera.kube.health import Health
from tessera_operator.quota.arith import QuotaView
from tessera_operator.quota.objects import view_of

log = logging.getLogger("tessera.quotacache")

Listener = Callable[[str, Obj], None]


def quota_url(ns: str | None = None, name: str | None = None) -> str:
    return path(GROUP, VERSION, GPUQUOTAS, ns, name)


@dataclass
class QuotaCache:
    """The GPUQuotas from one watch, each parsed once per resourceVersion."""

    kube: Kube
    health: Health | None = None
    _cache: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _synced: bool = False
    _listener: Listener | None = None
    _views: dict[tuple[str, str], tuple[str, QuotaView]] = field(default_factory=dict)
    _by_ns: dict[str, tuple[Obj, ...]] = field(default_factory=dict)

    def known(self, ns: str) -> list[Obj] | None:
        """The namespace's GPUQuotas from this replica's watch; None until it has synced."""
        if not self._synced:
            return None
        return list(self._by_ns.get(ns, ()))

    async def quotas(self, ns: str) -> list[Obj]:
        """The namespace's GPUQuotas: from this replica's watch (or, until it has synced,
        the API server's watch cache)."""
        known = self.known(ns)
        if known is not None:
            return known
        return (await self.kube.list(quota_url(ns), cached=True)).get("items") or []

    def snapshot(self) -> list[Obj]:
        """Every GPUQuota this replica's watch knows."""
        return list(self._cache.values())

    def view(self, q: Obj) -> QuotaView:
        """:func:`view_of` a quota, parsed once per resourceVersion."""
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

        One watch serves admission and reconciliation.  A new listener first gets a SYNC
        with every quota known now.
        """
        self._listener = listener
        if listener is not None and self._synced:
            listener("SYNC", {"items": list(self._cache.values())})

    async def watch(self) -> None:
        """Keep the GPUQuotas in memory: admission reads them without a LIST per pod."""
        try:
            async for typ, obj in self.kube.watch(quota_url(), name="quota-cache",
                                                  health=self.health):
                if typ == "SYNC":
                    self._cache = {_key(q): q for q in obj.get("items") or []}
                    for k in [k for k in list(self._views) if k not in self._cache]:
                        self._views.pop(k, None)
                    by_ns: dict[str, list[Obj]] = {}
                    for (ns, _), q in self._cache.items():
                        by_ns.setdefault(ns, []).append(q)
                    self._by_ns = {ns: tuple(qs) for ns, qs in by_ns.items()}
                    self._synced = True
                else:
                    key = _key(obj)
                    if typ == "DELETED":
                        self._cache.pop(key, None)
                        self._views.pop(key, None)
                    else:
                        self._cache[key] = obj
                    self._publish(key[0])
                if self._listener is not None:
                    try:
                        self._listener(typ, obj)
                    except Exception:  # the admission cache must outlive a listener bug
                        log.exception("quota listener failed", extra={"event": typ})
        finally:
            self._synced = False

    def _publish(self, ns: str) -> None:
        """A namespace's quotas changed: hand readers a new tuple (one assignment)."""
        qs = tuple(q for (n, _), q in self._cache.items() if n == ns)
        if qs:
            self._by_ns[ns] = qs
        else:
            self._by_ns.pop(ns, None)

    @property
    def synced(self) -> bool:
        """Whether this replica holds every GPUQuota (its watch has listed them)."""
        return self._synced


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))
