"""Claim holders, the leader's part (I/O; the rule: :func:`tessera_operator.quota.holders.
orphaned_claim_holders`).

A claim for tessera's devices in a namespace with a GPUQuota is held in the API server's
count by a *claim holder*, a growth holder that asks for the claim's capacity, made by the
validating claims webhook while the claim is admitted
(:meth:`tessera_operator.webhooks.admission.Admission._hold_claim`).  It cannot be owned by
the claim (the claim does not exist yet when it is made), so the leader deletes it once the
claim is gone: every ``interval_s`` it lists the claim holders and the cluster's claims, and
deletes the holders whose claim is not there (after a grace for a claim being
admitted now).  A claim being deleted keeps its holder until it is gone: until then its
devices may still be allocated.  The same list names the pods tessera's claims are
reserved for: the leader labels them ``tessera.dev/budgeted=claims`` so that its pod watch,
and a live resize, sees them
(:meth:`tessera_operator.controller.pods.PodController.see_claim_users`).  What the holders
hold counts in their namespace's GPUQuotas' ``status.used`` (:meth:`ClaimHolders.total`, as
of the last pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.api.names import LABEL_CLAIM_OF
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.health import Health
from tessera_operator import metrics
from tessera_operator.quota.arith import Usage, total
from tessera_operator.quota.claims import PodRef, claim_users
from tessera_operator.quota.holders import holds, orphaned_claim_holders

log = logging.getLogger("tessera.claims")


@dataclass
class ClaimHolders:
    kube: Kube
    interval_s: float = 5.0
    health: Health | None = None
    on_namespace: Callable[[str], None] | None = None
    """Told when what a namespace's claim holders hold changed (its GPUQuotas are counted
    soon)."""
    on_claim_users: Callable[[list[PodRef]], Awaitable[None]] | None = None
    """Told, every pass, the pods tessera's allocated claims are reserved for (the leader
    labels those its pod watch does not see yet: their resizes are answered there)."""
    synced: bool = False
    """A pass has listed the claim holders (until then GPUQuotas keep their count)."""
    _totals: dict[str, Usage] = field(default_factory=dict)

    def total(self, ns: str) -> Usage:
        """What the namespace's claim holders hold, as the last pass listed them."""
        return self._totals.get(ns, Usage())

    def forget(self) -> None:
        self.synced = False
        self._totals.clear()

    async def loop(self) -> None:
        while True:
            try:
                await self.collect()
            except (ApiError, OSError, TimeoutError) as exc:  # the next pass tries again
                log.warning("claim holders not collected", extra={"error": str(exc)})
            await asyncio.sleep(self.interval_s)

    async def collect(self, now: datetime | None = None) -> list[str]:
        """Delete the claim holders whose claim is gone; their names.  Then label the pods
        that tessera's allocated claims are reserved for, so the pod watch sees them."""
        now = now or datetime.now(UTC)
        holders = (await self.kube.list(path("", "v1", "pods"), LABEL_CLAIM_OF)).get(
            "items") or []
        claims = (await self.kube.list(path("resource.k8s.io", "v1", "resourceclaims"))).get(
            "items") or []
        by_ns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for h in holders:
            by_ns[str(h["metadata"]["namespace"])].append(h)
        uids_by_ns: dict[str, set[str]] = defaultdict(set)
        for c in claims:
            uids_by_ns[str(c["metadata"].get("namespace"))].add(str(c["metadata"].get("uid")))
        deleted: list[str] = []
        totals: dict[str, Usage] = {}
        for ns, mine in sorted(by_ns.items()):
            orphans = orphaned_claim_holders(mine, uids_by_ns.get(ns, set()), now)
            for name in orphans:
                try:
                    await self.kube.delete(path("", "v1", "pods", ns, name))
                except ApiError as exc:
                    if exc.status != 404:
                        raise
                metrics.CLAIM_HOLDER_WRITES.labels("deleted").inc()
                log.info("claim holder deleted: its claim is gone",
                         extra={"namespace": ns, "holder": name})
                deleted.append(f"{ns}/{name}")
            totals[ns] = total(holds(h) for h in mine if h["metadata"]["name"] not in orphans
                               and not h["metadata"].get("deletionTimestamp"))
        if self.on_claim_users is not None:
            await self.on_claim_users(claim_users(claims))
        changed = {ns for ns in {*totals, *self._totals}
                   if totals.get(ns, Usage()) != self._totals.get(ns, Usage())}
        self._totals, self.synced = totals, True
        for ns in sorted(changed):
            if self.on_namespace is not None:
                self.on_namespace(ns)
        return deleted
