"""Whose processes NVML's per-process figures are (the controller's attribution).

NVML reports host PIDs; a container's ledger holds each of its processes as the container
sees it: its PID inside its own namespace, its start time and its PID namespace's inode,
which together name one process from every namespace (:func:`tessera_node.device.procfs.
identity`). A host PID's identity is read from ``/proc`` once and kept while it names a live
ledger slot.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tessera_node.budget.ledger import LedgerView
from tessera_node.device.procfs import identity as proc_identity

IDENTITY_TTL_S = 1.0
"""An identity that names no live slot is read again once it is this old."""

Identity = tuple[int, int, int]
"""(PID inside the process's own namespace, start ticks, that namespace's inode): one
process, in any namespace (``tessera_node.device.procfs``)."""


def live_identities(led: LedgerView) -> set[Identity]:
    """The identities of a ledger's live processes (a slot written by a library that did not
    record its namespace carries 0 there)."""
    return {s.identity for s in led.slots if s.alive and s.start_ticks}


def named(ident: Identity | None, ids: set[Identity] | frozenset[Identity]) -> bool:
    """Whether a process's identity is one of ``ids`` (namespace unknown: 0 in ``ids``)."""
    return ident is not None and (ident in ids or (ident[0], ident[1], 0) in ids)


class Identities:
    """``proc_identity`` per host PID, read from /proc once and kept while it names a live
    ledger slot (an identity names one process, and a slot is live only while its process
    is, so that PID is still that process); an identity that names no live slot is read
    again once it is ``IDENTITY_TTL_S`` old (the PID may be another process's now)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, Identity | None]] = {}

    def __call__(self, pid: int, live: frozenset[Identity] | set[Identity] = frozenset()
                 ) -> Identity | None:
        now = time.monotonic()
        hit = self._seen.get(pid)
        if hit is not None and (named(hit[1], live) or hit[0] > now):
            return hit[1]
        ident = proc_identity(pid)
        self._seen[pid] = (now + IDENTITY_TTL_S, ident)
        if len(self._seen) > 4096:
            self._seen = {p: v for p, v in self._seen.items() if v[0] > now}
        return ident


def attribute(
    led: LedgerView,
    busy_by_pid: dict[int, float],
    identity: Callable[[int], Identity | None] = proc_identity,
) -> float:
    """Busy share of a container's processes. NVML reports host PIDs; the ledger holds PIDs
    as the container sees them, their start time and their PID namespace, which together
    name the same process from every namespace."""
    ids = live_identities(led)
    plain = {s.pid for s in led.slots if s.alive and not s.start_ticks}
    total = 0.0
    for pid, busy in busy_by_pid.items():
        if named(identity(pid), ids) or pid in plain:
            total += busy
    return total
