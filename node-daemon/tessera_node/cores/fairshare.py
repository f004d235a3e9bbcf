"""Work-conserving fair share of one GPU (or MIG instance): who may use how much this period.

Pure logic, no I/O. Each control period the controller hands in, per container, its core
budget (fraction of the GPU), its GPUQuota weight, whether its quota lends and borrows, and
what it did over the last period (busy share, and whether it waited for launch tokens). Out
comes each container's *share*: the fraction of the GPU its token rate is set for.

* **Guarantee.** Every container's share is at least its budget (budgets scaled down
  together if they sum above the whole GPU), so under contention each gets its budget.
* **Lending.** A container that stayed below its budget (by more than ``margin``) without
  waiting for tokens for ``lend_after`` periods *lends*: it keeps its use plus ``margin``
  (its *keep*), and the rest of its budget joins the pool. Capacity no budget names joins
  the pool too. The pool goes to the borrowers (containers that do not lend) in proportion
  to their weights, water-filled so no share exceeds the whole GPU.
* **Reclaim.** A lender's own token rate is never lowered: it stays at its full budget, so
  the moment it wants its time back its launches flow. The first period in which it uses
  more than its keep, or waits for tokens, it stops lending and the borrowers' shares drop
  at once: lending is slow (``lend_after`` periods), reclaiming takes one.
* **Hard caps.** A container whose quota opts out (``lend=False``) neither lends nor
  borrows: its share is its budget, and what it leaves idle stays idle.

Noise: a lender's keep follows its use up at once and down only halfway per period, and
only use above the keep ends lending, so samples jittering by less than ``margin`` around a
steady use leave every share unchanged. A lender that takes no launch token at all is idle
for certain: its keep goes down (halfway per period) to ``idle_margin``, so the borrowers get
all but a point of the GPU; its first launch ends lending.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Claim:
    """A container's standing on this GPU."""

    budget: float  # guaranteed fraction of the GPU, 0..1
    weight: float = 1.0  # GPUQuota weight, > 0
    lend: bool = True  # False: a hard cap (neither lends nor borrows)

    def __post_init__(self) -> None:
        if not 0.0 <= self.budget <= 1.0:
            raise ValueError(f"budget {self.budget} outside 0..1")
        if not self.weight > 0:
            raise ValueError(f"weight {self.weight} must be > 0")


@dataclass(frozen=True)
class Sample:
    """What a container did over the last period."""

    use: float  # busy share of the GPU, 0..1
    throttled: bool = False  # it waited for launch tokens
    launched: bool = True  # False: it took no launch token at all (certainly idle, not noise)


@dataclass(frozen=True)
class Grant:
    share: float  # fraction of the GPU the container's token rate is set for
    lent: float = 0.0  # of its budget, what others may use now
    borrowed: float = 0.0  # beyond its budget, what it may use now
    lending: bool = False


@dataclass
class _State:
    quiet: int = 0
    lending: bool = False
    keep: float = 0.0


@dataclass
class FairShare:
    lend_after: int = 1  # quiet periods before a container lends
    margin: float = 0.03  # what a lender keeps above its use, fraction of the GPU
    idle_margin: float = 0.01  # what it keeps while it launches nothing at all
    states: dict[str, _State] = field(default_factory=dict)

    def step(
        self, claims: dict[str, Claim], samples: dict[str, Sample], saturated: bool = False
    ) -> dict[str, Grant]:
        """One period: fold in the samples, return every claimant's grant.

        A container without a sample this period keeps its lending state. ``saturated``: the
        GPU ran flat out, so a container below its budget may have been held back rather
        than idle: no one starts lending on such a period (reclaiming still happens)."""
        for gone in set(self.states) - set(claims):
            del self.states[gone]
        total = sum(c.budget for c in claims.values())
        scale = 1.0 / total if total > 1.0 else 1.0
        budgets = {n: c.budget * scale for n, c in claims.items()}
        pool = max(0.0, 1.0 - total)
        for name, c in claims.items():
            st = self.states.setdefault(name, _State())
            self._observe(st, c, budgets[name], samples.get(name), saturated)
            if st.lending:
                pool += budgets[name] - st.keep
        borrowers = {
            n: c.weight for n, c in claims.items() if c.lend and not self.states[n].lending
        }
        extra = water_fill(pool, borrowers, {n: 1.0 - budgets[n] for n in borrowers})
        grants = {}
        for name in claims:
            st = self.states[name]
            b = budgets[name]
            if st.lending:
                grants[name] = Grant(share=b, lent=b - st.keep, lending=True)
            else:
                x = extra.get(name, 0.0)
                grants[name] = Grant(share=b + x, borrowed=x)
        return grants

    def _observe(
        self, st: _State, c: Claim, budget: float, s: Sample | None, saturated: bool
    ) -> None:
        if s is None:
            return
        if not c.lend:
            st.quiet, st.lending, st.keep = 0, False, budget
            return
        use = min(1.0, max(0.0, s.use))
        # a lender that launches nothing at all is idle for certain, not jittering near its
        # use: it keeps less (its own rate still stands, so its return is as fast)
        m = self.margin if s.launched else self.idle_margin
        if st.lending:
            if s.throttled or use > st.keep:
                st.quiet, st.lending, st.keep = 0, False, budget  # reclaim at once
            else:
                st.keep = min(budget, max(use + m, (st.keep + use + m) / 2))
            return
        if saturated:
            return  # neither quiet nor busy: no evidence either way
        if not s.throttled and use < budget - self.margin:
            st.quiet += 1
            st.keep = use + m if st.quiet == 1 else max(st.keep, use + m)
            if st.quiet >= self.lend_after:
                st.lending = True
        else:
            st.quiet = 0


def water_fill(pool: float, weights: dict[str, float], caps: dict[str, float]) -> dict[str, float]:
    """Split ``pool`` in proportion to ``weights``, no one above its cap; what a capped one
    cannot take goes to the others. Returns each one's part (sums to min(pool, sum(caps)))."""
    out = {n: 0.0 for n in weights}
    left = max(0.0, pool)
    open_ = {n for n in weights if caps[n] > 0}
    while left > 1e-12 and open_:
        wsum = sum(weights[n] for n in open_)
        full = {n for n in open_ if out[n] + left * weights[n] / wsum >= caps[n] - 1e-12}
        if not full:
            for n in open_:
                out[n] += left * weights[n] / wsum
            break
        for n in full:
            left -= caps[n] - out[n]
            out[n] = caps[n]
        open_ -= full
    return out
