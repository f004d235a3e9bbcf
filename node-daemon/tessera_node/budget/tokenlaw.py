"""Token rates where NVML measures nothing per process: inside MIG instances.

Pure logic, no I/O. NVML answers NOT_SUPPORTED for per-process utilisation (and for the
device's own utilisation) on MIG devices, so what the controller knows there is what the
ledgers count: tokens each container took (one per kernel) and whether it waited for them.

* **Use** is a container's share of the tokens the instance ran, against an estimate of the
  instance's *capacity* (tokens per second it runs when saturated). Shares of tokens are
  shares of time exactly when the containers' kernels cost the same on average; otherwise
  a container's time share is off by the ratio of its mean kernel cost to the others'.
* **Capacity** is searched for: while every container that is active waits for tokens (the
  rates bind) it grows, fast until the first saturation (``slow_start``), slowly after it
  (``probe_up``); as soon as an active container takes most of its rate without ever
  waiting (its launches back up on the instance: the stream queues are full), the estimate
  drops to ``cut`` × what the instance ran in that period.
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

from dataclasses import dataclass


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
    probe_up: float = 1.01  # growth per period after it
    cut: float = 0.8  # on saturation: this share of what the instance ran
    active_at: float = 0.6  # taking this share of its rate makes a container active
    burst_seconds: float = 0.01
    saturated_once: bool = False
    saturated: bool = False  # in the last period

    def uses(self, samples: dict[str, TokenSample]) -> dict[str, float]:
        """Each container's use of the instance over the period, as a fraction."""
        return {
            n: min(1.0, s.tokens / s.seconds / self.capacity) if s.seconds > 0 else 0.0
            for n, s in samples.items()
        }

    def observe(self, rates: dict[str, float], samples: dict[str, TokenSample]) -> None:
        """Fold in one period (``rates``: what was in force during it)."""
        active = {
            n: s for n, s in samples.items()
            if s.seconds > 0 and rates.get(n, 0) > 0
            and (s.throttled or s.tokens / s.seconds >= self.active_at * rates[n])
        }
        self.saturated = any(not s.throttled for s in active.values())
        if self.saturated:
            # launches queue on the instance: what it ran is its capacity
            ran = sum(s.tokens / s.seconds for s in samples.values() if s.seconds > 0)
            self.capacity = max(self.min_capacity, min(self.capacity, self.cut * ran))
            self.saturated_once = True
        elif active:
            grow = self.probe_up if self.saturated_once else self.slow_start
            self.capacity = min(self.max_capacity, self.capacity * grow)

    def rates(self, shares: dict[str, float]) -> dict[str, float]:
        return {n: max(0.0, share) * self.capacity for n, share in shares.items()}

    def burst(self, rate: float) -> float:
        return max(1.0, rate * self.burst_seconds)
