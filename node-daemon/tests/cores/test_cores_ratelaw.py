"""The rate law against a plant model (a GPU that runs kernels first come, first served),
and its properties over any sequence of observations (hypothesis)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_node.cores.ratelaw import Observation, RateLaw


def plant(
    rates: dict[str, float], costs: dict[str, float], demand: dict[str, float], rng: random.Random
) -> dict[str, Observation]:
    """One 100 ms interval: each tenant launches min(rate, demand) kernels/s of mean cost
    costs[name] seconds (+-50 % noise); a saturated GPU splits time by offered work."""
    dt = 0.1
    work = {}
    tokens = {}
    for n, r in rates.items():
        k = min(r, demand[n]) * dt
        tokens[n] = k
        work[n] = k * costs[n] * rng.uniform(0.9, 1.1)
    total = sum(work.values())
    scale = min(1.0, dt / total) if total else 1.0
    return {n: Observation(busy=work[n] * scale / dt, tokens=tokens[n], seconds=dt) for n in rates}


def run(
    law: RateLaw, costs: dict[str, float], demand: dict[str, float], steps: int
) -> list[dict[str, float]]:
    rng = random.Random(1)
    rates = {n: t.rate for n, t in law.tenants.items()}
    shares = []
    for _ in range(steps):
        obs = plant(rates, costs, demand, rng)
        shares.append({n: o.busy for n, o in obs.items()})
        rates = law.step(obs)
    return shares


def test_two_saturating_tenants_reach_their_targets() -> None:
    law = RateLaw()
    law.set_target("a", 0.3)
    law.set_target("b", 0.7)
    costs = {"a": 0.0005, "b": 0.002}  # b's kernels cost four times a's
    shares = run(law, costs, {"a": 1e9, "b": 1e9}, 40)
    tail = shares[-20:]
    a = sum(s["a"] for s in tail) / len(tail)
    b = sum(s["b"] for s in tail) / len(tail)
    assert a / (a + b) == pytest.approx(0.3, abs=0.02)
    assert a + b > 0.9  # nearly work-conserving


def test_target_change_takes_effect_within_a_few_intervals() -> None:
    law = RateLaw()
    law.set_target("a", 0.3)
    law.set_target("b", 0.7)
    costs = {"a": 0.001, "b": 0.001}
    run(law, costs, {"a": 1e9, "b": 1e9}, 20)
    law.set_target("a", 0.5)
    law.set_target("b", 0.5)
    shares = run(law, costs, {"a": 1e9, "b": 1e9}, 5)
    assert shares[-1]["a"] / (shares[-1]["a"] + shares[-1]["b"]) == pytest.approx(0.5, abs=0.05)


def test_a_new_target_learns_the_cost_afresh() -> None:
    """A lend, a reclaim or a resize moves a target: the cost per token learned before (here
    from kernels since grown 30 % cheaper; in the daemon often from long before, as nothing
    is learned while the GPU is saturated) is dropped, and the target holds from the second
    interval on instead of after the whole estimate window (within the plant's +-10 %
    kernel noise, which one fresh sample carries; the old estimate missed by 26 % then)."""
    law = RateLaw()
    law.set_target("a", 0.3)
    run(law, {"a": 0.001}, {"a": 1e9}, 20)
    law.set_target("a", 0.6)
    shares = run(law, {"a": 0.0007}, {"a": 1e9}, 3)
    assert [s["a"] for s in shares[1:]] == pytest.approx([0.6 * law.headroom] * 2, abs=0.1)


def test_saturation_walks_rates_back() -> None:
    law = RateLaw()
    law.set_target("a", 0.5)
    law.tenants["a"].rate = 10000.0
    for _ in range(law.saturated_after - 1):  # a saturated interval or two may be noise
        rates = law.step({"a": Observation(busy=1.0, tokens=1000, seconds=0.1)})
        assert rates["a"] == pytest.approx(10000.0)
    rates = law.step({"a": Observation(busy=1.0, tokens=1000, seconds=0.1)})
    assert rates["a"] == pytest.approx(10000.0 * law.backoff)
    rates = law.step({"a": Observation(busy=0.9, tokens=1000, seconds=0.1)})
    rates = law.step({"a": Observation(busy=1.0, tokens=1000, seconds=0.1)})
    assert law.saturated_for == 1


def test_zero_target_stops_and_idle_tenant_keeps_probing() -> None:
    law = RateLaw()
    law.set_target("z", 0.0)
    law.set_target("idle", 0.4)
    rates = law.step({"idle": Observation(busy=0.0, tokens=0, seconds=0.1)})
    assert rates["z"] == 0.0
    assert rates["idle"] == law.probe_rate
    with pytest.raises(ValueError):
        law.set_target("bad", 1.5)


def test_tokens_without_busy_time_teach_no_cost_once_one_is_known() -> None:
    law = RateLaw()
    law.set_target("a", 0.2)
    law.step({"a": Observation(busy=0.2, tokens=40, seconds=0.1)})
    known = law.tenants["a"].cost
    assert known == pytest.approx(0.02 / 40)
    # the process ended within the window: its tokens are counted, its busy time is not
    rates = law.step({"a": Observation(busy=0.0, tokens=26, seconds=0.1)})
    assert law.tenants["a"].cost == known
    assert rates["a"] == pytest.approx(0.2 * law.headroom / known)


def test_saturation_backs_off_only_those_launching() -> None:
    law = RateLaw()
    for n in ("busy", "idle"):
        law.set_target(n, 0.5)
        law.tenants[n].rate = 1000.0
    for _ in range(law.saturated_after + 2):
        rates = law.step({"busy": Observation(busy=1.0, tokens=100, seconds=0.1),
                          "idle": Observation(busy=0.0, tokens=0, seconds=0.1)})
    assert rates["busy"] < 1000.0
    assert rates["idle"] == 1000.0


# -- properties ---------------------------------------------------------------------------------

NAMES = ("a", "b", "c")
observation_st = st.builds(Observation, busy=st.floats(0.0, 1.0),
                           tokens=st.floats(0.0, 1e6), seconds=st.floats(0.0, 1.0))
period_st = st.tuples(
    st.dictionaries(st.sampled_from(NAMES), observation_st),  # who launched, what it did
    st.one_of(st.none(), st.floats(0.0, 1.5)),  # the GPU's busy share (None: the sum)
    st.dictionaries(st.sampled_from(NAMES), st.floats(0.0, 1.0)),  # new targets this period
)


def unsaturated_rate(law: RateLaw, name: str, before: float) -> float:
    """What the law gives a tenant when no back-off applies."""
    t = law.tenants[name]
    cost = t.cost
    if t.target <= 0:
        return 0.0
    rate = before if cost is None else t.target * law.headroom / cost
    return min(law.max_rate, max(law.min_rate, rate))


@settings(max_examples=300, deadline=None)
@given(targets=st.dictionaries(st.sampled_from(NAMES), st.floats(0.0, 1.0), min_size=1),
       periods=st.lists(period_st, max_size=30))
def test_rates_stay_in_bounds_and_follow_the_learned_cost(
        targets: dict[str, float], periods: list[tuple[dict[str, Observation], float | None,
                                                         dict[str, float]]]) -> None:
    """Whatever is observed: every tenant gets a rate, 0 for a zero target and otherwise
    within [min_rate, max_rate]; nothing is learned while the GPU is saturated; a back-off
    lowers only the rates of tenants that launched, by ``backoff``, and only from the
    ``saturated_after``-th saturated period in a row; every other rate is what the target
    buys at the learned cost (or the rate it had, before a cost is known)."""
    law = RateLaw()
    for n, t in targets.items():
        law.set_target(n, t)
    for observations, gpu_busy, retarget in periods:
        for n, t in retarget.items():
            law.set_target(n, t)
        observations = {n: o for n, o in observations.items() if n in law.tenants}
        before = {n: t.rate for n, t in law.tenants.items()}
        history = {n: list(t.history) for n, t in law.tenants.items()}
        total = gpu_busy if gpu_busy is not None else sum(
            o.busy for o in observations.values())
        saturated = total >= law.saturated_at
        backing_off = saturated and law.saturated_for + 1 >= law.saturated_after
        rates = law.step(observations, gpu_busy=gpu_busy)
        assert set(rates) == set(law.tenants)
        for n, rate in rates.items():
            t = law.tenants[n]
            assert rate == t.rate
            if t.target <= 0:
                assert rate == 0.0
                continue
            assert law.min_rate <= rate <= law.max_rate
            if saturated:
                assert list(t.history) == history[n]  # nothing learned
            o = observations.get(n)
            if backing_off and o is not None and o.tokens > 0:
                assert rate <= max(law.min_rate, before[n] * law.backoff) * (1 + 1e-9)
            else:
                assert rate == pytest.approx(unsaturated_rate(law, n, before[n]), rel=1e-9)
        assert law.burst(max(rates.values(), default=0.0)) >= 1.0


@settings(max_examples=200, deadline=None)
@given(target=st.floats(0.01, 1.0), new=st.floats(0.0, 1.0),
       cost=st.floats(1e-6, 1e-2), tokens=st.floats(1.0, 1e4))
def test_a_new_target_scales_the_rate_that_held_the_old_one(
        target: float, new: float, cost: float, tokens: float) -> None:
    """Moving a target by more than ``retarget_at`` forgets the learned cost and scales the
    rate by the targets' ratio; a smaller move keeps both."""
    law = RateLaw()
    law.set_target("a", target)
    law.step({"a": Observation(busy=min(1.0, tokens * cost / 0.1), tokens=tokens,
                               seconds=0.1)}, gpu_busy=0.5)
    t = law.tenants["a"]
    rate, learned = t.rate, list(t.history)
    law.set_target("a", new)
    if learned and abs(new - target) > law.retarget_at:
        assert t.history == type(t.history)()
        assert t.rate == pytest.approx(min(law.max_rate, max(law.min_rate, rate * new / target)))
    else:
        assert list(t.history) == learned and t.rate == rate
    assert t.target == new
