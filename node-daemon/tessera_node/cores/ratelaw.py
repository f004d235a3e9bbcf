"""The rate law: per-container token rates from measured GPU busy shares.

Pure logic, no I/O. libtessera spends one token per kernel (a graph: one per kernel node)
and never knows what a kernel costs; the law learns it from measurement:

* While the GPU is not saturated, a container's measured busy share is proportional to the
  tokens it spends, so ``cost = busy seconds / tokens`` (a ratio of sums over the last few
  intervals) is what one token buys, and ``rate = target * headroom / cost`` buys its
  target. A budget change therefore takes effect at the next interval. A target that moves
  by more than ``retarget_at`` (a lend, a reclaim, a resize) scales the rate that held the
  old one and learns the cost afresh: what was learned before may be from long ago.
* While the GPU is saturated, shares only reflect the *ratio* of the rates and launch
  queues grow, so no cost is learned, and from the ``saturated_after``-th saturated interval
  on every rate is walked back (``backoff``) until the queues drain (a saturated interval or
  two is as often noise in the samples as a backlog); ``headroom`` (< 1) keeps the sum of the
  targets just below saturation.
* A container that has not run yet gets a low probing rate, so the first measurement is
  taken on an unsaturated GPU.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Observation:
    """What one container did over one control interval."""

    busy: float  # fraction of the GPU's time its processes kept it busy (NVML), 0..1
    tokens: float  # tokens it took from its bucket during the interval
    seconds: float  # interval length


@dataclass
class TenantState:
    target: float  # budget: fraction of the GPU, 0..1
    rate: float  # tokens per second currently in the budget file
    history: deque[tuple[float, float]] = field(default_factory=deque)  # (busy s, tokens)

    @property
    def cost(self) -> float | None:
        """Busy seconds one token buys, over the history; None while unknown (or too small
        to divide by: a busy share of a few denormals)."""
        busy_s = sum(h[0] for h in self.history)
        tokens = sum(h[1] for h in self.history)
        cost = busy_s / tokens if tokens > 0 and busy_s > 0 else 0.0
        return cost if cost > 0 else None


@dataclass
class RateLaw:
    """Per-GPU controller state. ``step`` is called once per interval."""

    probe_rate: float = 100.0
    min_rate: float = 1.0
    max_rate: float = 1e7
    window: int = 5  # intervals the cost estimate spans
    headroom: float = 0.99  # aim the targets at this fraction of the GPU
    saturated_at: float = 0.995  # total busy share at which the GPU counts as saturated
    saturated_after: int = 3  # consecutive saturated intervals before rates back off
    backoff: float = 0.95  # rate factor per saturated interval
    burst_seconds: float = 0.01  # bucket depth, as seconds of the rate
    retarget_at: float = 0.02  # a target change above this starts the cost estimate afresh
    tenants: dict[str, TenantState] = field(default_factory=dict)
    saturated_for: int = 0

    def set_target(self, name: str, target: float) -> None:
        if not 0.0 <= target <= 1.0:
            raise ValueError(f"target {target} outside 0..1")
        t = self.tenants.get(name)
        if t is None:
            self.tenants[name] = TenantState(target=target, rate=self.probe_rate)
            return
        if t.history and t.target > 0 and abs(target - t.target) > self.retarget_at:
            # a new target (a lend, a reclaim, a resize): the cost learned so far is from
            # before, often from periods long ago (nothing is learned while the GPU is
            # saturated), so start from the rate that held the old target, scaled, and learn
            # the cost afresh from the next periods
            t.rate = min(self.max_rate, max(self.min_rate, t.rate * target / t.target))
            t.history.clear()
        t.target = target

    def remove(self, name: str) -> None:
        self.tenants.pop(name, None)

    def step(
        self, observations: dict[str, Observation], gpu_busy: float | None = None
    ) -> dict[str, float]:
        """Fold in one interval's observations; return each tenant's new token rate.

        ``gpu_busy``: the GPU's total busy share (defaults to the sum over tenants)."""
        total = gpu_busy if gpu_busy is not None else sum(o.busy for o in observations.values())
        saturated = total >= self.saturated_at
        self.saturated_for = self.saturated_for + 1 if saturated else 0
        back_off = self.saturated_for >= self.saturated_after
        rates: dict[str, float] = {}
        for name, t in self.tenants.items():
            obs = observations.get(name)
            # Tokens without any busy time, once a cost is known, are an attribution gap (a
            # process that just ended or started: NVML's samples lag the ledger's), not free
            # kernels: learning from them would let the rate jump when the owner returns.
            gap = obs is not None and obs.busy <= 0 and bool(t.history)
            if (not saturated and obs is not None and obs.seconds > 0 and obs.tokens > 0
                    and not gap):
                t.history.append((obs.busy * obs.seconds, obs.tokens))
                while len(t.history) > self.window:
                    t.history.popleft()
            cost = t.cost
            if t.target <= 0:
                rate = 0.0
            elif cost is None:
                rate = t.rate
            else:
                rate = t.target * self.headroom / cost
            if back_off and obs is not None and obs.tokens > 0:
                # only those launching fill the queues: an idle owner's rate stays where
                # its budget puts it, so it has its time back the moment it launches again
                rate = min(rate, t.rate * self.backoff)
            t.rate = min(self.max_rate, max(self.min_rate if t.target > 0 else 0.0, rate))
            rates[name] = t.rate
        return rates

    def burst(self, rate: float) -> float:
        return max(1.0, rate * self.burst_seconds)
