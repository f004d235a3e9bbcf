"""Claim holders, the leader's part (I/O; the rule: :func:`tessera_operator.quota.holders.
orphaned_claim_holders`).

A claim for tessera's devices in a namespace with a GPUQuota is held in the API server's
count by a *claim holder*, a growth holder that asks for the claim's capacity, made by the
validating claims webhook while the claim is admitted
(:meth:`tessera_operator.webhooks.admission.Admission._hold_claim`).  It cannot be owned by
the claim (the claim does not exist yet when it is made), so the leader deletes it once the
claim is gone: every ``interval_s`` it lists the claim holders and, in their namespaces, the
claims, and deletes the holders whose claim is not there (after a grace for a claim being
admitted now).  A claim being deleted keeps its holder until it is gone: until then its
devices may still be allocated.  What the holders hold counts in their namespace's
GPUQuotas' ``status.used`` (:meth:`ClaimHolders.total`, as of the last pass).
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from tessera.api.names import LABEL_CLAIM_OF
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.health import Health
from tessera_operator import metrics
from tessera_operator.quota.arith import Usage, total
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
        """Delete the claim holders whose claim is gone; their names."""
        now = now or datetime.now(UTC)
        holders = (await self.kube.list(path("", "v1", "pods"), LABEL_CLAIM_OF)).get(
            "items") or []
        by_ns: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for h in holders:
            by_ns[str(h["metadata"]["namespace"])].append(h)
        deleted: list[str] = []
        totals: dict[str, Usage] = {}
        for ns, mine in sorted(by_ns.items()):
            claims = (await self.kube.list(path("resource.k8s.io", "v1", "resourceclaims",
                                                ns))).get("items") or []
            uids = {str(c["metadata"].get("uid")) for c in claims}
            orphans = orphaned_claim_holders(mine, uids, now)
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
        changed = {ns for ns in {*totals, *self._totals}
                   if totals.get(ns, Usage()) != self._totals.get(ns, Usage())}
        self._totals, self.synced = totals, True
        for ns in sorted(changed):
            if self.on_namespace is not None:
                self.on_namespace(ns)
        return deleted
