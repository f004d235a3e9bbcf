"""Reservations and releases against one quota, decided in arrival order.

Admission group-commits: requests that arrive while a write to a quota is in flight are
decided one after another against the newest copy, and the outcome is written as one
update.  First come, first served: a request that does not fit is refused and the ones after
it are still tried; a release always applies (never below zero).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

from tessera.quota.arith import QuotaView, Usage, Violation, check_fit


@dataclass(frozen=True)
class Change:
    """One pod's usage to add (a reservation) or take away (a release)."""

    usage: Usage
    add: bool


def apply_in_order(view: QuotaView, changes: Iterable[Change]
                   ) -> tuple[list[list[Violation]], Usage]:
    """Each change's refusals ([] = applied) and the quota's ``used`` after all of them."""
    used = view.used
    results: list[list[Violation]] = []
    for change in changes:
        if not change.add:
            used = used - change.usage
            results.append([])
            continue
        refused = check_fit(change.usage, [replace(view, used=used)])
        if not refused:
            used = used + change.usage
        results.append(refused)
    return results, used
