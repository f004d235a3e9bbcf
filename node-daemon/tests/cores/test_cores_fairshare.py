"""The work-conserving fair share (pure): properties over arbitrary claims and samples."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_node.cores.fairshare import Claim, FairShare, Grant, Sample, water_fill

EPS = 1e-9

claims_st = st.dictionaries(
    st.sampled_from("abcdef"),
    st.builds(
        Claim,
        budget=st.floats(0.0, 0.6),
        weight=st.integers(1, 1000).map(float),
        lend=st.booleans(),
    ),
    min_size=1,
    max_size=6,
)
sample_st = st.builds(Sample, use=st.floats(0.0, 1.0), throttled=st.booleans())


def scaled(claims: dict[str, Claim]) -> dict[str, float]:
    total = sum(c.budget for c in claims.values())
    k = 1 / total if total > 1 else 1.0
    return {n: c.budget * k for n, c in claims.items()}


def check_invariants(claims: dict[str, Claim], grants: dict[str, Grant]) -> None:
    b = scaled(claims)
    assert set(grants) == set(claims)
    for n, g in grants.items():
        # budgets respected: no one's share below its (scaled) budget, none above the GPU
        assert g.share >= b[n] - EPS
        assert g.share <= 1.0 + EPS
        assert g.lent >= -EPS and g.borrowed >= -EPS
        assert not (g.lent > EPS and g.borrowed > EPS)
        if not claims[n].lend:  # hard cap: exactly its budget, nothing lent or borrowed
            assert g.share == pytest.approx(b[n]) and g.lent == 0 and g.borrowed == 0
    # what is in use or kept never exceeds the GPU
    committed = sum(g.share - g.lent for g in grants.values())
    assert committed <= max(1.0, sum(b.values())) + 1e-6
    # work-conserving: while someone can borrow, nothing is left over
    borrowers = [n for n, g in grants.items() if claims[n].lend and not g.lending]
    if borrowers and all(grants[n].share < 1 - 1e-6 for n in borrowers):
        assert committed == pytest.approx(1.0, abs=1e-6)
    # borrowed in proportion to weight among borrowers below the cap
    free = [n for n in borrowers if grants[n].share < 1 - 1e-6]
    for x in free:
        for y in free:
            wx, wy = claims[x].weight, claims[y].weight
            assert grants[x].borrowed * wy == pytest.approx(grants[y].borrowed * wx, abs=1e-6)


@settings(max_examples=300, deadline=None)
@given(claims=claims_st, rounds=st.lists(st.dictionaries(st.sampled_from("abcdef"), sample_st),
                                         min_size=1, max_size=12))
def test_budgets_respected_and_work_conserving(
    claims: dict[str, Claim], rounds: list[dict[str, Sample]]
) -> None:
    fs = FairShare()
    for samples in rounds:
        check_invariants(claims, fs.step(claims, samples))


@settings(max_examples=300, deadline=None)
@given(claims=claims_st, rounds=st.lists(st.dictionaries(st.sampled_from("abcdef"), sample_st),
                                         min_size=1, max_size=12), who=st.sampled_from("abcdef"))
def test_no_starvation_reclaim_in_one_period(
    claims: dict[str, Claim], rounds: list[dict[str, Sample]], who: str
) -> None:
    """However the others behave, a container that wants its budget back (it waits for
    tokens) is not lending from the very next period on, and its share is its budget or more."""
    if who not in claims:
        return
    fs = FairShare()
    for samples in rounds:
        fs.step(claims, samples)
    g = fs.step(claims, {who: Sample(use=1.0, throttled=True)})
    assert not g[who].lending and g[who].lent == 0
    assert g[who].share >= scaled(claims)[who] - EPS


@settings(max_examples=200, deadline=None)
@given(
    claims=claims_st,
    uses=st.dictionaries(st.sampled_from("abcdef"), st.floats(0.0, 1.0)),
    seed=st.integers(0, 1 << 30),
)
def test_stable_under_noisy_samples(
    claims: dict[str, Claim], uses: dict[str, float], seed: int
) -> None:
    """Steady uses jittering by less than half the margin: after settling, nobody changes
    between lending and borrowing, and no share moves by more than the jitter's reach."""
    fs = FairShare()
    rng = random.Random(seed)
    jitter = fs.margin / 2
    base = {n: uses.get(n, 1.0) for n in claims}
    # a steady use well clear of the lending threshold (the threshold itself is hysteresis)
    b = scaled(claims)
    base = {n: (u if abs(u - (b[n] - fs.margin)) > 2 * jitter else b[n]) for n, u in base.items()}

    def noisy() -> dict[str, Sample]:
        return {
            n: Sample(use=min(1.0, max(0.0, u + rng.uniform(-jitter, jitter))),
                      throttled=u >= b[n] - fs.margin)
            for n, u in base.items()
        }

    for _ in range(fs.lend_after + 3):
        fs.step(claims, noisy())
    prev = fs.step(claims, noisy())
    for _ in range(30):
        cur = fs.step(claims, noisy())
        for n in claims:
            assert cur[n].lending == prev[n].lending
            assert abs(cur[n].share - prev[n].share) <= 2 * jitter * len(claims) + 1e-9
        prev = cur


def test_idle_lends_by_weight_and_reclaims_at_once() -> None:
    claims = {"a": Claim(0.2), "b": Claim(0.3, weight=3), "c": Claim(0.5, weight=1)}
    fs = FairShare(lend_after=2)
    busy = {n: Sample(use=c.budget, throttled=True) for n, c in claims.items()}
    g = fs.step(claims, busy)
    assert [g[n].share for n in "abc"] == pytest.approx([0.2, 0.3, 0.5])
    idle = dict(busy, a=Sample(use=0.0))
    g = fs.step(claims, idle)
    assert not g["a"].lending  # one quiet period is not enough
    g = fs.step(claims, idle)
    assert g["a"].lending and g["a"].share == pytest.approx(0.2)  # its rate is kept
    lent = 0.2 - fs.margin
    assert g["a"].lent == pytest.approx(lent)
    assert g["b"].borrowed == pytest.approx(lent * 3 / 4)
    assert g["c"].borrowed == pytest.approx(lent * 1 / 4)
    g = fs.step(claims, dict(busy, a=Sample(use=0.08)))  # it comes back
    assert not g["a"].lending
    assert [g[n].share for n in "abc"] == pytest.approx([0.2, 0.3, 0.5])


def test_a_lender_that_launches_nothing_keeps_only_the_idle_margin() -> None:
    """Idle for certain (no launch token at all): the borrowers get all but ``idle_margin``
    of the GPU within a few periods; one that launches a little keeps the full margin; the
    idle one's first launch ends lending at once."""
    claims = {"a": Claim(0.2), "b": Claim(0.3), "c": Claim(0.5)}
    fs = FairShare()
    busy = {n: Sample(use=c.budget, throttled=True) for n, c in claims.items()}
    fs.step(claims, busy)
    for _ in range(5):
        g = fs.step(claims, dict(busy, a=Sample(use=0.0, launched=False)))
    assert g["a"].lending
    assert g["a"].lent == pytest.approx(0.2 - fs.idle_margin, abs=0.01 * fs.margin)
    assert g["b"].share + g["c"].share == pytest.approx(1 - fs.idle_margin, abs=0.01)
    fs2 = FairShare()
    fs2.step(claims, busy)
    for _ in range(5):
        g2 = fs2.step(claims, dict(busy, a=Sample(use=0.0)))  # launches, sampled as 0
    assert g2["a"].lent == pytest.approx(0.2 - fs2.margin)
    g = fs.step(claims, dict(busy, a=Sample(use=0.05)))  # it launches again
    assert not g["a"].lending and g["b"].share == pytest.approx(0.3)


def test_hard_cap_leaves_idle_capacity_idle() -> None:
    claims = {"a": Claim(0.2, lend=False), "b": Claim(0.3, lend=False), "c": Claim(0.5)}
    fs = FairShare()
    for _ in range(5):
        g = fs.step(claims, {"a": Sample(0.0), "b": Sample(0.3, True), "c": Sample(0.5, True)})
    assert [g[n].share for n in "abc"] == pytest.approx([0.2, 0.3, 0.5])
    assert g["a"].lent == 0 and g["b"].borrowed == 0 and g["c"].borrowed == 0


def test_unbudgeted_capacity_goes_to_borrowers_not_hard_caps() -> None:
    claims = {"a": Claim(0.2, lend=False), "b": Claim(0.3, weight=2), "c": Claim(0.1)}
    g = FairShare().step(claims, {})
    assert g["a"].share == pytest.approx(0.2)
    assert g["b"].borrowed == pytest.approx(0.4 * 2 / 3)
    assert g["c"].borrowed == pytest.approx(0.4 / 3)


def test_water_fill_caps_and_redistributes() -> None:
    out = water_fill(1.0, {"a": 1, "b": 1, "c": 2}, {"a": 0.1, "b": 1.0, "c": 1.0})
    assert out["a"] == pytest.approx(0.1)
    assert out["b"] == pytest.approx(0.3) and out["c"] == pytest.approx(0.6)
    assert water_fill(5.0, {"a": 1}, {"a": 0.5}) == {"a": 0.5}


def test_bad_claims_are_refused() -> None:
    with pytest.raises(ValueError):
        Claim(1.5)
    with pytest.raises(ValueError):
        Claim(0.5, weight=0)


def closed_loop(
    claims: dict[str, Claim], demand: list[dict[str, bool]], seed: int = 1
) -> list[dict[str, float]]:
    """Fair share + rate law against a first-come-first-served GPU model: each period every
    wanting container launches min(rate, what it can) kernels of its mean cost (+-10 %);
    an oversubscribed GPU splits its time by offered work. Returns busy shares per period."""
    from tessera_node.cores.ratelaw import Observation, RateLaw

    rng = random.Random(seed)
    cost = {n: 1e-4 * (1 + i) for i, n in enumerate(claims)}  # kernels cost 1x, 2x, 3x
    fs, law = FairShare(), RateLaw()
    rates = {n: law.probe_rate for n in claims}
    out = []
    for want in demand:
        dt = 0.1
        tokens = {n: (rates[n] * dt if want[n] else 0.0) for n in claims}
        work = {n: tokens[n] * cost[n] * rng.uniform(0.9, 1.1) for n in claims}
        scale = min(1.0, dt / sum(work.values())) if sum(work.values()) else 1.0
        busy = {n: work[n] * scale / dt for n in claims}
        out.append(busy)
        samples = {n: Sample(use=busy[n], throttled=want[n]) for n in claims}
        grants = fs.step(claims, samples, saturated=sum(busy.values()) >= law.saturated_at)
        for n, g in grants.items():
            law.set_target(n, min(1.0, g.share))
        rates = law.step({n: Observation(busy[n], tokens[n], dt) for n in claims})
    return out


def test_closed_loop_split_lend_and_reclaim_in_periods() -> None:
    claims = {"a": Claim(0.2), "b": Claim(0.3), "c": Claim(0.5)}
    on = {"a": True, "b": True, "c": True}
    idle = dict(on, a=False)
    busy = closed_loop(claims, [on] * 60 + [idle] * 30 + [on] * 30)
    mean = {n: sum(p[n] for p in busy[20:60]) / 40 for n in claims}
    for n, c in claims.items():
        assert abs(mean[n] - c.budget) <= 0.02, mean
    assert sum(mean.values()) >= 0.97, mean  # work-conserving under contention
    # a idle: within 5 periods (500 ms) the others keep the GPU >= 95 % busy (over three
    # periods: the model's kernel costs jitter by 10 %), and from then on
    total = [sum(p.values()) for p in busy]
    lent = next(i for i in range(60, 88) if sum(total[i:i + 3]) / 3 >= 0.95)
    assert lent - 60 <= 5, [round(t, 3) for t in total[60:90]]
    assert sum(total[lent:90]) / (90 - lent) >= 0.95
    # a back: within 2 periods (200 ms) it holds its budget again
    back = next(i for i in range(90, 120) if busy[i]["a"] >= 0.18)
    assert back - 90 <= 2, [round(p["a"], 3) for p in busy[90:100]]
    rest = [p["a"] for p in busy[back:120]]
    assert abs(sum(rest) / len(rest) - 0.2) <= 0.01 and min(rest) >= 0.15, rest


def test_closed_loop_hard_caps_leave_idle_time_idle() -> None:
    claims = {"a": Claim(0.2, lend=False), "b": Claim(0.3, lend=False),
              "c": Claim(0.5, lend=False)}
    on = {"a": True, "b": True, "c": True}
    busy = closed_loop(claims, [on] * 40 + [dict(on, a=False)] * 40)
    late = busy[60:80]
    assert all(p["a"] == 0 for p in late)
    assert abs(sum(p["b"] for p in late) / 20 - 0.3) <= 0.02
    assert abs(sum(p["c"] for p in late) / 20 - 0.5) <= 0.02
