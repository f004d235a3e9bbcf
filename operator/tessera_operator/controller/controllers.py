"""The leader's controllers, wired: GPUPartitions (:mod:`.partitions`), GPUQuotas and their
managed ResourceQuotas (:mod:`.quotas`), the budgeted pods with their live resizes and
growth holders (:mod:`.pods`), and the holders of DRA claims (:mod:`.claims`).  The process
(:mod:`.app`) starts :meth:`Controllers.tasks` on the replica holding the Lease and feeds
them the replica's watches.

Level-triggered: every event marks work dirty and the loops recompute the whole answer from
the caches with the pure modules (:mod:`tessera.partition`, :mod:`tessera_operator.quota`),
then write only what differs.  So a settled cluster sees no writes at all, and a missed event
is healed by the next one or by the periodic pass.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from tessera.kube.client import Kube
from tessera.kube.health import Health
from tessera_operator.cache.quotas import QuotaCache
from tessera_operator.controller.claims import ClaimHolders
from tessera_operator.controller.partitions import PartitionController
from tessera_operator.controller.pods import PodController
from tessera_operator.controller.quotas import QuotaController

Task = Callable[[], Awaitable[None]]


@dataclass
class Controllers:
    partitions: PartitionController
    pods: PodController
    quotas: QuotaController
    claims: ClaimHolders

    @classmethod
    def build(cls, kube: Kube, cache: QuotaCache, recount_interval_s: float = 5.0,
              component: str = "tessera-operator", health: Health | None = None,
              holder_image: str = "registry.k8s.io/pause:3.10") -> Controllers:
        count_soon: list[QuotaController] = []

        def counted_soon(ns: str) -> None:
            for quotas in count_soon:
                quotas.on_namespace(ns)
        pods = PodController(kube, cache, counted_soon, recount_interval_s, component, health,
                             holder_image)
        claims = ClaimHolders(kube, recount_interval_s, health, counted_soon,
                              on_claim_users=pods.see_claim_users)
        quotas = QuotaController(kube, cache, pods, recount_interval_s, component, claims)
        count_soon.append(quotas)
        return cls(PartitionController(kube, component, health), pods, quotas, claims)

    def lead_with(self, key: bytes) -> None:
        """This replica leads: resizes are answered and sealed with ``key``."""
        self.pods.lead_with(key)

    def forget(self) -> None:
        """Leadership lost: the next leadership starts from its own watches."""
        self.partitions.forget()
        self.quotas.forget()
        self.pods.forget()
        self.claims.forget()

    def tasks(self) -> dict[str, Task]:
        """What the leader runs, each supervised, by name."""
        return {"nodes": self.partitions.watch_nodes, "partitions": self.partitions.loop,
                "pods": self.pods.watch_pods, "growth-holders": self.pods.watch_holders,
                "holders": self.pods.settle_loop, "quotas": self.quotas.loop,
                "claim-holders": self.claims.loop}
