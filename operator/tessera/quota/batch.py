"""Reservations, releases and counts against one quota, decided in arrival order.

Admission group-commits: changes that arrive while a write to a quota is in flight are
decided one after another against the newest copy, and the outcome is written as one
update.  First come, first served: a request that does not fit is refused and the ones after
it are still tried; a release always applies (never below zero).

Every change names the pod by UID, so applying one twice changes nothing the second time: a
reservation for a UID already pending is not added again (a replica whose hand-over to the
leader failed after the leader wrote it reserves again), and a release takes a pending
reservation out at most once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace

from tessera.quota.arith import Pending, QuotaView, Usage, Violation, check_fit
from tessera.quota.ledger import PodCount, is_full, recounted


@dataclass(frozen=True)
class Reserve:
    """Admission: add the pod's usage and record it pending under its UID."""

    uid: str
    pod: str
    usage: Usage
    expires: float


@dataclass(frozen=True)
class Release:
    """Give a pod's usage back: its pending reservation if there is one, else ``usage``
    (``None``: only a pending reservation, as when admission takes back a reservation
    another quota refused)."""

    uid: str
    usage: Usage | None


@dataclass(frozen=True)
class Count:
    """Set ``used`` from the pods the operator sees plus the reservations still pending."""

    pods: PodCount
    dead: AbstractSet[str] = field(default_factory=frozenset)
    """Pending UIDs whose create request ended without a pod: given back."""


Change = Reserve | Release | Count


@dataclass(frozen=True)
class State:
    """A quota's usage as written: ``used`` (``None`` until first counted) and its ledger."""

    used: Usage | None
    pending: Mapping[str, Pending]

    @classmethod
    def of(cls, view: QuotaView) -> State:
        return cls(view.used if view.counted else None, dict(view.pending))


def full(name: str) -> Violation:
    return Violation(name, "", "", "", "", reason=(
        "too many GPU pods of this namespace are being created at once; retry in a few "
        "seconds"))


def apply_in_order(view: QuotaView, changes: Iterable[Change]
                   ) -> tuple[list[list[Violation]], State]:
    """Each change's refusals ([] = applied or nothing to do) and the state after all."""
    used = view.used if view.counted else None
    pending = dict(view.pending)
    results: list[list[Violation]] = []
    for change in changes:
        refused: list[Violation] = []
        if isinstance(change, Reserve):
            if change.uid not in pending:
                current = replace(view, used=used or Usage(), counted=used is not None,
                                  pending=pending)
                refused = check_fit(change.usage, [current])
                if not refused and is_full(pending):
                    refused = [full(view.name)]
                if not refused and used is not None:
                    used = used + change.usage
                    pending[change.uid] = Pending(change.pod, change.usage, change.expires)
        elif isinstance(change, Release):
            entry = pending.pop(change.uid, None)
            given = entry.usage if entry is not None else change.usage
            if used is not None and given is not None:
                used = used - given
        else:
            used, pending = recounted(change.pods, change.dead, pending)
        results.append(refused)
    return results, State(used, pending)
