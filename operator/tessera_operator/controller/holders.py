"""Growth holders, the leader's I/O (the rules: :mod:`tessera_operator.quota.holders`).

A pod whose live budget needs more than its limits gets holders created (the API server's
quota admission decides, race-free, whether the growth fits); one that needs less has its
extra holders deleted, after whatever replaces them was admitted.  When a pod's growth
cannot be held -- a holder was deleted by someone and the room it held is gone -- its
budget goes back to what its limits say and the pod's resize status says why: a budget
the count does not hold is never left running.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import LABEL_GROWTH_OF
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera_operator import metrics
from tessera_operator.quota.arith import Usage
from tessera_operator.quota.holders import (
    Holder,
    holder_name,
    holder_pod,
    holds,
    is_zero,
    owner_of,
    settle,
    total,
)

log = logging.getLogger("tessera.holders")


@dataclass(frozen=True)
class Owner:
    namespace: str
    name: str
    uid: str


def _pods(ns: str, name: str | None = None) -> str:
    return path("", "v1", "pods", ns, name)


REFUSED = (403, 422)
"""What the API server answers when it will not admit a holder: its quota admission (no
room), or another admission policy of the namespace (Pod Security, a LimitRange, an image
policy). Anything else (a timeout, a 500) is not an answer about the growth: raised."""


@dataclass
class Holders:
    """The holders of every pod, from the leader's watch, kept current by its own writes."""

    kube: Kube
    image: str
    by_owner: dict[str, dict[str, Holder]] = field(default_factory=dict)
    """Pod UID -> holder name -> what it holds."""
    namespaces: dict[str, str] = field(default_factory=dict)
    """Pod UID -> its namespace (of the holders seen)."""
    synced: bool = False
    """The watch has listed every holder (until then a resize asks the API server)."""

    def of(self, uid: str) -> list[Holder]:
        return list(self.by_owner.get(uid, {}).values())

    def held(self, uid: str) -> Usage:
        return total(self.of(uid))

    def on_event(self, typ: str, pod: Obj) -> str | None:
        """A holder watch event; the owner's UID (whose need may be unmet now)."""
        meta = pod.get("metadata") or {}
        owner, name = owner_of(pod), str(meta.get("name"))
        if not owner:
            return None
        if typ == "DELETED":
            self.by_owner.get(owner, {}).pop(name, None)
            if not self.by_owner.get(owner):
                self.by_owner.pop(owner, None)
        else:
            self.by_owner.setdefault(owner, {})[name] = Holder(name, holds(pod))
            self.namespaces[owner] = str(meta.get("namespace"))
        return owner

    def on_sync(self, items: list[Obj]) -> None:
        self.by_owner.clear()
        for pod in items:
            self.on_event("ADDED", pod)
        self.synced = True

    def owners(self) -> list[str]:
        return list(self.by_owner)

    async def create(self, owner: Owner, amount: Usage, tag: str) -> str | None:
        """A holder of ``amount`` for ``owner``; None when made (or made before, under the
        same tag), else the API server's refusal (e.g. ``exceeded quota: …``); an error that
        is no answer (:data:`REFUSED`) is raised."""
        existing = ",".join(sorted(self.by_owner.get(owner.uid, {})))
        name = holder_name(owner.uid, f"{tag}/{amount.memory_mib}/{amount.cores}/{existing}")
        body = holder_pod(owner.namespace, owner.name, owner.uid, amount, name, self.image)
        try:
            made = await self.kube.create(_pods(owner.namespace), body)
        except ApiError as exc:
            if exc.status in REFUSED:
                metrics.HOLDER_WRITES.labels("refused").inc()
                log.info("growth holder refused", extra={
                    "namespace": owner.namespace, "pod": owner.name, "error": exc.message})
                return exc.message
            if exc.status != 409:
                raise
            made = await self.kube.get(_pods(owner.namespace, name))
            if owner_of(made) != owner.uid or holds(made) != amount:
                return f"pod {name} exists and is not this growth's holder"
        metrics.HOLDER_WRITES.labels("created").inc()
        self.by_owner.setdefault(owner.uid, {})[name] = Holder(name, holds(made))
        self.namespaces[owner.uid] = owner.namespace
        log.info("growth holder created", extra={
            "namespace": owner.namespace, "pod": owner.name, "holder": name,
            "memoryMiB": amount.memory_mib, "cores": amount.cores})
        return None

    async def delete(self, owner: Owner, name: str) -> None:
        try:
            await self.kube.delete(_pods(owner.namespace, name))
        except ApiError as exc:
            if exc.status != 404:
                raise
        metrics.HOLDER_WRITES.labels("deleted").inc()
        self.by_owner.get(owner.uid, {}).pop(name, None)
        if not self.by_owner.get(owner.uid):
            self.by_owner.pop(owner.uid, None)

    async def listed(self, owner: Owner) -> list[Holder]:
        """The owner's holders as the API server has them now (a resize decides on these)."""
        items = (await self.kube.list(_pods(owner.namespace),
                                      f"{LABEL_GROWTH_OF}={owner.uid}")).get("items") or []
        current = {str(p["metadata"]["name"]): Holder(str(p["metadata"]["name"]), holds(p))
                   for p in items if not (p.get("metadata") or {}).get("deletionTimestamp")}
        if current:
            self.by_owner[owner.uid] = current
            self.namespaces[owner.uid] = owner.namespace
        else:
            self.by_owner.pop(owner.uid, None)
        return list(current.values())

    async def hold(self, owner: Owner, want: Usage, tag: str) -> str | None:
        """Make the owner's holders hold at least ``want``; None when they do, else why the
        API server refused the rest.  From the watch (every holder is this leader's own
        write, kept as written), or, before it has listed, from the API server."""
        have = total(self.of(owner.uid) if self.synced else await self.listed(owner))
        short = settle([Holder("have", have)], want).create
        if is_zero(short):
            return None
        return await self.create(owner, short, tag)

    async def settle(self, owner: Owner, want: Usage, tag: str) -> str | None:
        """Bring the owner's holders to exactly ``want``: create first, delete after.
        Returns why the API server refused what it needs more of (None: held)."""
        plan = settle(self.of(owner.uid), want)
        if plan.nothing:
            return None
        if not is_zero(plan.create):
            refused = await self.create(owner, plan.create, tag)
            if refused is not None:
                if plan.delete:  # over: release what can go while the need stays held
                    for name in plan.fallback:
                        await self.delete(owner, name)
                    return None
                return refused
        for name in plan.delete:
            await self.delete(owner, name)
        return None


def owner_from(pod: Mapping[str, Any]) -> Owner:
    meta = pod.get("metadata") or {}
    return Owner(str(meta.get("namespace")), str(meta.get("name")), str(meta.get("uid")))
