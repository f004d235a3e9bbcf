"""Who the daemon asks the kubelet's PodResources about, and how fast (pure).

The kubelet answers PodResources at most 100 calls a second with a burst of 10, for all
its clients together, and refuses the rest with RESOURCE_EXHAUSTED. PodResources has no
Watch and ``List`` is unsafe during an allocation (``listgate``), so the daemon asks with
``Get``, one pod at a time; it must not ask about every pod at every poll (66 budgeted pods
on one node made 428 refused calls in three minutes, and three pods never got their
budgets). So:

* **only pods whose answer can change anything**: a pod with a container asking for a
  tessera resource that no confirmed allocation belongs to yet, while an allocation is
  pending (the kubelet records devices once Allocate returned: the answer that confirms
  it), and pods with a refused container (judged again every poll); a confirmed pod's
  devices stay its own until it ends, so it is never asked again;
* **oldest first, and only until every pending allocation is found**: the kubelet admits
  pods (and calls Allocate) in the order it hears of them, so the pods an allocation in
  flight is for are the oldest unconfirmed ones;
* **at a pace of its own** (:class:`Pacer`, a token bucket well under the kubelet's), and
  after a refusal not at all for a while (:class:`Backoff`).

What the kubelet answered is kept per pod (the rows confirm allocations, and answer the MIG
enactor's "which pods hold this unit" without a call).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass


class Pacer:
    """A token bucket: ``rate`` calls a second, ``burst`` at once."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = float(burst)
        self.clock = clock
        self._tokens = self.burst
        self._at = clock()

    def delay(self) -> float:
        """Seconds to wait before the next call may go (0: now)."""
        self._refill()
        return 0.0 if self._tokens >= 1 else (1 - self._tokens) / self.rate

    def take(self) -> float:
        """Take one call's token; returns how long the caller must wait before it (it is
        spent already: waiting that long keeps every second within the rate)."""
        wait = self.delay()
        self._tokens -= 1
        return wait

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now


class Backoff:
    """No call for a while after the kubelet refused one; doubling while it goes on."""

    def __init__(self, first_s: float, max_s: float) -> None:
        self.first_s = first_s
        self.max_s = max_s
        self.until = 0.0
        self._next = first_s

    def refused(self, now: float) -> float:
        """The kubelet refused a call at ``now``: how long to keep quiet."""
        wait = self._next
        self.until = now + wait
        self._next = min(self.max_s, self._next * 2)
        return wait

    def answered(self) -> None:
        self._next = self.first_s

    def quiet(self, now: float) -> bool:
        return now < self.until


@dataclass(frozen=True)
class PodState:
    """What the choice needs of one pod bound to the node."""

    key: tuple[str, str]
    """(namespace, name)."""
    created: str
    """``metadata.creationTimestamp`` (RFC 3339: sorts as time)."""
    unconfirmed: bool
    """A container of it asks for a tessera resource that no confirmed allocation is of."""
    refused: bool
    """A container of it has its budget refused."""


def to_ask(pods: Iterable[PodState], pending: bool, asked: Mapping[tuple[str, str], float],
           now: float, confirm_interval_s: float, poll_interval_s: float
           ) -> list[tuple[str, str]]:
    """The pods to ask this round, in order (the caller stops once it found every pending
    allocation): while an allocation is pending, unconfirmed pods not asked in the last
    ``confirm_interval_s``, oldest first; pods with a refused container not asked in the
    last ``poll_interval_s``. A pod never asked comes before one asked."""
    out = []
    for p in pods:
        last = asked.get(p.key)
        if p.unconfirmed and pending and (last is None or now - last >= confirm_interval_s):
            out.append((0, p.created, p.key))
        elif p.refused and (last is None or now - last >= poll_interval_s):
            out.append((1, p.created, p.key))
    return [k for _, _, k in sorted(out)]
