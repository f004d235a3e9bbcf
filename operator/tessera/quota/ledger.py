"""The reservation ledger: quota usage admitted for pods that do not exist (yet).

A pod's reservation is made by the validating pod webhook, which sees the pod's UID (the API
server assigns it after mutating admission).  The pod exists only once the API server has
also passed every later admission step and stored it; until the operator has seen the pod,
its reservation is *pending*: recorded in the quota's ``status.reservations`` by UID, in the
same conditional write that adds it to ``used``.  So every replica's reservations in flight,
a follower's fallback writes included, are in the quota object itself, and the recount can
be exact at any moment instead of waiting for a quiet one:

    used = what the pods the operator sees hold + what the pending reservations hold

A pending reservation ends in one of three ways, all decided here:

- its pod is seen: the pod's budget annotation now carries the usage (:func:`recounted`
  drops the entry, ``used`` unchanged);
- its pod is deleted before being seen: the release takes the entry with it (``batch``);
- its create request can no longer succeed (the API server's request deadline passed, see
  :func:`expires_at`) and no pod with that UID exists: it is given back (``dead``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass

from tessera.api.quota import MAX_RESERVATIONS
from tessera.quota.arith import Pending, QuotaView, Usage

MAX_PENDING = MAX_RESERVATIONS
"""Most reservations one quota holds for pods not seen yet: they live in the quota object,
which every replica watches, so it must stay small (about 150 bytes each).  Pods are seen
within a second or so; a quota at this bound refuses new pods until some are."""


def pod_of(key: str) -> str:
    """The pod UID a ledger entry belongs to: the key itself, or what precedes ``/`` for the
    growth a live resize reserved (``<uid>/resize-<request digest>``): once the pod is seen,
    its annotation carries the new budget and the entry is no longer pending."""
    return key.split("/", 1)[0]


def expires_at(now: float, create_deadline_s: float) -> float:
    """When a reservation made ``now`` may be given back if its pod does not exist: a create
    request cannot succeed after the API server's request deadline (``--request-timeout``,
    60 s by default, which caps a client's ``?timeout=``); ``create_deadline_s`` is that plus a
    margin for clock skew between replicas and a storage write in flight."""
    return now + create_deadline_s


def total(entries: Iterable[Pending]) -> Usage:
    return total_usage(e.usage for e in entries)


def expired(ledger: Mapping[str, Pending], now: float) -> set[str]:
    """UIDs whose create request has certainly ended by ``now``."""
    return {uid for uid, e in ledger.items() if e.expires < now}


@dataclass(frozen=True)
class PodCount:
    """What the pods of one namespace hold, as the operator's pod watch has them."""

    usage: Usage
    """Sum over pods that still hold their budget (:func:`tessera.quota.arith.pod_counts`)."""
    uids: frozenset[str]
    """Every budgeted pod seen, holding or not: their reservations are no longer pending."""

    @classmethod
    def of(cls, held: Mapping[str, Usage]) -> PodCount:
        """From each seen pod's UID and what it holds (zero once released)."""
        return cls(total_usage(held.values()), frozenset(held))


def total_usage(usages: Iterable[Usage]) -> Usage:
    out = Usage()
    for u in usages:
        out = out + u
    return out


def recounted(pods: PodCount, dead: AbstractSet[str], ledger: Mapping[str, Pending]
              ) -> tuple[Usage, dict[str, Pending]]:
    """``used`` and the ledger after a count: seen pods leave the ledger (their annotations
    count them), dead reservations are dropped, the rest stay pending and counted."""
    kept = {uid: e for uid, e in ledger.items()
            if pod_of(uid) not in pods.uids and uid not in dead}
    return pods.usage + total(kept.values()), kept


def dead_candidates(ledger: Mapping[str, Pending], pods: PodCount, now: float) -> set[str]:
    """Pending UIDs that may be given back: their create request has ended and the pod
    watch has not seen them.  Each is dead only if no such pod exists *now* (the watch may
    be behind: the caller asks the API server), and must then be remembered, so a late
    DELETED event of that pod gives nothing back a second time."""
    return {uid for uid in expired(ledger, now) if pod_of(uid) not in pods.uids}


def is_full(ledger: Mapping[str, Pending]) -> bool:
    return len(ledger) >= MAX_PENDING


def needs_count(view: QuotaView, pods: PodCount, now: float) -> bool:
    """Whether counting ``view`` now would change it: never counted, pending reservations
    whose pods are seen or whose requests ended, or ``used`` not what the pods and the
    pending reservations hold (drift: a release missed while no replica led, a hand edit)."""
    if not view.counted:
        return True
    if {pod_of(k) for k in view.pending} & pods.uids or expired(view.pending, now):
        return True
    return recounted(pods, frozenset(), view.pending)[0] != view.used
