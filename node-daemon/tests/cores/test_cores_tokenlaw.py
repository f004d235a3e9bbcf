"""The token law's capacity search inside a MIG instance (pure): a model instance that runs
``capacity`` launches per second first come, first served, against the law's estimate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_node.cores.tokenlaw import TokenLaw, TokenSample

PERIOD = 0.1


def period(law: TokenLaw, true_capacity: float, shares: dict[str, float]
           ) -> dict[str, TokenSample]:
    """Saturating containers: each launches at its token rate while the instance keeps up;
    past its capacity the instance serves them alike (their queues full) and whoever's
    rate is above that even split stops waiting for tokens."""
    rates = law.rates(shares)
    if sum(rates.values()) <= true_capacity:
        return {n: TokenSample(r * PERIOD, PERIOD, True) for n, r in rates.items()}
    even = true_capacity / len(rates)
    served = {n: min(r, even) for n, r in rates.items()}
    left = true_capacity - sum(served.values())
    for n in served:  # what the slow ones leave, the others take
        extra = min(rates[n] - served[n], left)
        served[n] += extra
        left -= extra
    return {n: TokenSample(served[n] * PERIOD, PERIOD, served[n] >= rates[n] - 1e-9)
            for n in rates}


def test_a_hold_back_that_lasts_cuts_an_estimate_above_what_the_instance_runs() -> None:
    """A container held back by the instance whose rate stays above what it gets never
    waits for tokens again: an estimate above what the instance runs must come down while
    the hold-back lasts, or the split drifts towards equal and stays there."""
    law = TokenLaw()
    both_waited = {"a": TokenSample(60, PERIOD, True), "b": TokenSample(120, PERIOD, True)}
    law.observe(both_waited)  # seeded from what ran: 0.8 x 1800/s
    assert law.capacity == 1440
    held = {"a": TokenSample(78, PERIOD, True), "b": TokenSample(120, PERIOD, False)}
    assert law.observe(held) == {"a", "b"}  # b stopped waiting, still launching: held back
    assert law.capacity == 1440  # saturated: never raised (0.8 x 1980/s is more)
    law.capacity = 2600.0  # say the estimate is above what the instance runs again
    assert law.observe(held) == {"a", "b"}  # the hold-back lasts
    assert law.capacity == 0.8 * 1980  # cut again
    law.capacity = 1500.0  # below what it runs: no cut while the hold-back lasts
    law.observe(held)
    assert law.capacity == 1500.0


@settings(max_examples=60, deadline=None)
@given(true_capacity=st.floats(50, 20000), start=st.floats(10, 1e5),
       a=st.floats(0.05, 0.95))
def test_the_estimate_settles_near_the_capacity_and_the_split_holds(
    true_capacity: float, start: float, a: float
) -> None:
    """Wherever the rates start (the first period runs at them), the search settles below
    1.1 x the instance's capacity with the split within 3 points over 10 s."""
    law = TokenLaw(capacity=start)
    shares = {"a": a, "b": 1 - a}
    for _ in range(600):  # a minute of periods
        law.observe(period(law, true_capacity, shares))
    tokens = {"a": 0.0, "b": 0.0}
    for _ in range(100):  # then 10 s measured
        samples = period(law, true_capacity, shares)
        law.observe(samples)
        for n, s in samples.items():
            tokens[n] += s.tokens
    assert abs(tokens["a"] / sum(tokens.values()) - a) <= 0.03
    assert law.capacity <= 1.1 * true_capacity
