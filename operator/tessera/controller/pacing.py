"""How often the leader writes one object's status: at most once per interval (pure).

A burst of pod creates changes a GPUQuota's count dozens of times a second.  Each status
write is an update the API server decodes, validates against the CRD schema, tracks the
managed fields of, stores and sends to every replica's watch: about 300 KB of allocation in
the API server per write, measured (docs/operator.md, "What admission costs").  Written at
most once a second, a burst is still counted as it goes, and a quiet quota's first change is
written at once.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Pacer(Generic[K]):
    """Which keys may be written now, given when each was last written."""

    interval_s: float
    _last: dict[K, float] = field(default_factory=dict)

    def split(self, keys: Iterable[K], now: float) -> tuple[set[K], set[K]]:
        """(due now, not yet): a key is due when it was never written or last written at
        least ``interval_s`` ago."""
        due: set[K] = set()
        later: set[K] = set()
        for k in keys:
            last = self._last.get(k)
            (due if last is None or now >= last + self.interval_s else later).add(k)
        return due, later

    def next_due(self, keys: Iterable[K]) -> float | None:
        """When the first of ``keys`` not due now becomes due (None: all are due now)."""
        times = [self._last[k] + self.interval_s for k in keys if k in self._last]
        return min(times) if times else None

    def wrote(self, key: K, now: float) -> None:
        self._last[key] = now

    def forget(self, keep: Iterable[K]) -> None:
        """Drop what is known of keys no longer there."""
        kept = set(keep)
        for k in [k for k in self._last if k not in kept]:
            del self._last[k]
