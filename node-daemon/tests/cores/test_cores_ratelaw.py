"""The rate law against a plant model: a GPU that runs kernels first come, first served."""

from __future__ import annotations

import random

import pytest

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
