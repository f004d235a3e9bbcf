"""Every replica's copy of the ResourceQuotas GPUQuotas manage, from one watch.

Admission refuses a namespace's GPU pods while one of its GPUQuotas is not counted by the
API server as it must be (its ResourceQuota gone, not tessera's, or holding other limits:
:func:`tessera_operator.quota.managed.enforcement`); this replica learns of it from its own watch,
within the watch's delay of the change, without an API call per pod.  The leader's
controller listens to the same watch to set each one back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import LABEL_GPUQUOTA
from tessera.kube.client import Kube, Obj, path
from tessera.kube.health import Health

log = logging.getLogger("tessera.managedcache")

Listener = Callable[[str, Obj], None]


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace")), str(meta.get("name"))


@dataclass
class ManagedQuotaCache:
    """The ResourceQuotas labelled ``tessera.dev/gpuquota``, by (namespace, name)."""

    kube: Kube
    health: Health | None = None
    _cache: dict[tuple[str, str], Obj] = field(default_factory=dict)
    _synced: bool = False
    _listener: Listener | None = None

    @property
    def synced(self) -> bool:
        return self._synced

    def get(self, ns: str, name: str) -> Obj | None:
        return self._cache.get((ns, name))

    async def lookup(self, ns: str, name: str) -> Obj | None:
        """From the watch; until it has listed, from the API server's watch cache."""
        if self._synced:
            return self._cache.get((ns, name))
        listed = await self.kube.list(path("", "v1", "resourcequotas", ns), LABEL_GPUQUOTA,
                                      cached=True)
        return next((rq for rq in listed.get("items") or []
                     if (rq.get("metadata") or {}).get("name") == name), None)

    def subscribe(self, listener: Listener | None) -> None:
        """Pass this replica's events on (a new listener first gets a SYNC of all)."""
        self._listener = listener
        if listener is not None and self._synced:
            listener("SYNC", {"items": list(self._cache.values())})

    async def watch(self) -> None:
        try:
            async for typ, obj in self.kube.watch(path("", "v1", "resourcequotas"),
                                                  LABEL_GPUQUOTA, name="managed-quotas",
                                                  health=self.health):
                if typ == "SYNC":
                    self._cache = {_key(rq): rq for rq in obj.get("items") or []}
                    self._synced = True
                elif typ == "DELETED":
                    self._cache.pop(_key(obj), None)
                else:
                    self._cache[_key(obj)] = obj
                if self._listener is not None:
                    try:
                        self._listener(typ, obj)
                    except Exception:  # admission's copy must outlive a listener bug
                        log.exception("managed quota listener failed", extra={"event": typ})
        finally:
            self._synced = False
