"""Token rates where NVML measures nothing per process: inside MIG instances.

Pure logic, no I/O. NVML answers NOT_SUPPORTED for per-process utilisation (and for the
device's own utilisation) on MIG devices, so what the controller knows there is what the
ledgers count: tokens each container took (one per kernel) and whether it waited for them.

* **Use** is a container's share of the tokens the instance ran, against an estimate of the
  instance's *capacity* (tokens per second it runs when saturated). Shares of tokens are
  shares of time exactly when the containers' kernels cost the same on average; otherwise
  a container's time share is off by the ratio of its mean kernel cost to the others'.
* **Capacity** is searched for, from ``cut`` × what the instance ran in the first period
  anything ran: while the containers that want more all wait for tokens
  (the rates bind) it grows, fast until the first saturation (``slow_start``), slowly after
  it (``probe_up``); as soon as a container stops waiting for tokens but keeps launching
  about as much (its launches back up on the instance: its stream queues are full), the
  estimate drops to ``cut`` × what the instance ran in that period, and again in every
  period the hold-back lasts while the estimate is above what the instance ran.
* **Why shares hold anyway.** The instance runs kernels first come, first served, so while
  every container's launches are bound by its token rate the instance completes their
  kernels in the proportions they were launched, whether or not it keeps up (a backlog
  delays them all alike). Only while stream queues are full are launches bound by
  completions instead: the saturation the capacity cut ends.
* **Rate** = share × capacity, with shares from the fair share (``fairshare``).

Accuracy (docs/node-daemon.md states it): with equal mean kernel costs, achieved time
shares within ±3 points of the targets over 10 s.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class TokenSample:
    tokens: float  # taken during the period
    seconds: float
    throttled: bool  # waited for tokens during the period


@dataclass
class TokenLaw:
    capacity: float = 500.0  # tokens/s the instance runs, estimated
    min_capacity: float = 10.0
    max_capacity: float = 1e7
    slow_start: float = 1.1  # growth per period until the first saturation
    probe_up: float = 1.03  # growth per period after it
    cut: float = 0.8  # on saturation: this share of what the instance ran
    held_at: float = 0.3  # keeping this share of its intake while not waiting: held back
    burst_seconds: float = 0.01
    saturated_once: bool = False
    seeded: bool = False  # the estimate started from what the instance ran
    saturated: bool = False  # someone was held back in the last period
    _last: dict[str, tuple[bool, float]] = field(default_factory=dict)  # throttled, intake
    _held: dict[str, float] = field(default_factory=dict)  # intake when held back

    def uses(self, samples: dict[str, TokenSample]) -> dict[str, float]:
        """Each container's use of the instance over the period, as a fraction."""
        return {
            n: min(1.0, s.tokens / s.seconds / self.capacity) if s.seconds > 0 else 0.0
            for n, s in samples.items()
        }

    def observe(self, samples: dict[str, TokenSample]) -> set[str]:
        """Fold in one period; return the containers that wanted more than they got: those
        that waited for tokens, and those held back by the instance itself.

        A container is *held back* from the period in which it stops waiting for tokens
        while still taking at least ``held_at`` of what it took before (its launches now
        wait on full stream queues instead), until it waits for tokens again or its intake
        falls below ``held_at`` of that (it went idle). A new hold-back means the instance
        is saturated: the capacity estimate drops to ``cut`` × what it ran."""
        wanting: set[str] = set()
        new_hold = False
        for n, s in samples.items():
            if s.seconds <= 0:
                continue
            intake = s.tokens / s.seconds
            prev = self._last.get(n)
            if s.throttled:
                self._held.pop(n, None)
                wanting.add(n)
            elif n in self._held:
                if intake >= self.held_at * self._held[n]:
                    wanting.add(n)
                else:
                    del self._held[n]
            elif prev is not None and prev[0] and prev[1] > 0 and intake >= self.held_at * prev[1]:
                self._held[n] = prev[1]
                wanting.add(n)
                new_hold = True
            self._last[n] = (s.throttled, intake)
        for gone in set(self._last) - set(samples):
            self._last.pop(gone, None)
            self._held.pop(gone, None)
        self.saturated = bool(self._held)
        ran = sum(s.tokens / s.seconds for s in samples.values() if s.seconds > 0)
        if not self.seeded and ran > 0:
            # the first period anything ran: start below what the instance did (a start
            # above its capacity could leave every rate above the even split, where no
            # one ever waits for tokens and the search would never begin)
            self.seeded = True
            self.capacity = max(self.min_capacity, self.cut * ran)
        elif new_hold or (self._held and self.capacity > ran):
            # a new hold-back; or one that lasts while the estimate stays above what the
            # instance runs: the rates cannot bind there, so the held container would never
            # wait for tokens again (and the shares drift towards equal) unless cut again
            self.capacity = max(self.min_capacity, min(self.capacity, self.cut * ran))
            self.saturated_once = True
        elif wanting and not self._held:
            grow = self.probe_up if self.saturated_once else self.slow_start
            self.capacity = min(self.max_capacity, self.capacity * grow)
        return wanting

    def rates(self, shares: dict[str, float]) -> dict[str, float]:
        return {n: max(0.0, share) * self.capacity for n, share in shares.items()}

    def burst(self, rate: float) -> float:
        return max(1.0, rate * self.burst_seconds)
