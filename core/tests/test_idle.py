"""Idle holders: the pure rules (tessera.idle), by table and hypothesis."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.duration import format_duration, parse_duration
from tessera.idle import (
    IdlePolicy,
    IdleTracker,
    Use,
    idle_holding,
    idle_message,
    pod_use,
    policy_of,
    step,
)

GAP = 30.0
samples = st.lists(st.tuples(st.floats(0.1, 20), st.integers(0, 1 << 34),
                             st.one_of(st.none(), st.floats(0, 100))), max_size=60)
policies = st.builds(IdlePolicy, st.integers(10, 300).map(float),
                     st.sampled_from(["Report", "Evict"]), st.integers(1, 100).map(float))


def run(policy: IdlePolicy, seq: list[tuple[float, int, float | None]]):
    t, ep, out = 0.0, None, []
    for dt, mem, sm in seq:
        t += dt
        ep, v = step(ep, t, mem, sm, policy, GAP)
        out.append((t, mem, sm, v))
    return out


@given(policies, samples)
def test_never_acts_before_after_and_only_on_idle_holding(policy, seq):
    trace = run(policy, seq)
    for i, (t, mem, sm, v) in enumerate(trace):
        if v.due is not None:
            assert v.idle_s >= policy.after_s
            assert v.due == policy.action
            # every sample of the episode, back to its start, was idle-holding
            start = t - v.idle_s
            for t2, mem2, sm2, _v in trace[: i + 1]:
                if t2 >= start:
                    assert idle_holding(mem2, sm2, policy.below)
        if mem == 0 or sm is None or sm >= policy.below:
            assert v.idle_s == 0 and v.due is None


@given(policies, samples)
def test_activity_resets(policy, seq):
    trace = run(policy, seq)
    for (t, _m, _s, v), (t2, mem2, sm2, v2) in itertools.pairwise(trace):
        if not idle_holding(mem2, sm2, policy.below):
            assert v2.idle_s == 0
        elif v.idle_s > 0 and t2 - t <= GAP:
            assert v2.idle_s == pytest.approx(v.idle_s + (t2 - t))


@given(policies, samples)
def test_one_event_per_episode(policy, seq):
    trace = run(policy, seq)
    news = 0
    for _t, _m, _s, v in trace:
        if v.idle_s == 0:
            news = 0
        news += v.new
        assert news <= 1
        if v.new:
            assert v.due is not None


def test_a_long_idle_holder_is_due_once_then_every_sample():
    p = IdlePolicy(60, "Evict", 1)
    ep, seen = None, []
    for t in range(0, 100, 10):
        ep, v = step(ep, float(t), 1 << 30, 0.5, p, GAP)
        seen.append((v.due, v.new))
    assert seen[:6] == [(None, False)] * 6
    assert seen[6] == ("Evict", True)
    assert seen[7:] == [("Evict", False)] * 3


def test_a_gap_or_a_clock_going_back_restarts_the_episode():
    p = IdlePolicy(20, "Report", 1)
    ep, v = step(None, 0, 1, 0, p, GAP)
    ep, v = step(ep, 100, 1, 0, p, GAP)
    assert v.idle_s == 0
    ep, v = step(ep, 50, 1, 0, p, GAP)
    assert v.idle_s == 0


def test_no_policy_is_never_idle():
    assert step(None, 0, 1, 0, None, GAP)[1].idle_s == 0


def test_tracker_forgets_pods_gone():
    tr: IdleTracker[str] = IdleTracker(GAP)
    p = IdlePolicy(10, "Report", 1)
    tr.observe(0, {"a": (1, 0.0, p), "b": (1, 0.0, p)})
    v = tr.observe(10, {"a": (1, 0.0, p)})
    assert v["a"].due == "Report" and v["a"].new
    assert set(tr.episodes) == {"a"}


def test_pod_use():
    assert pod_use([]) == (0, 0.0)
    assert pod_use([Use(5, 0.2), Use(7, 3.0)]) == (12, 3.0)
    assert pod_use([Use(5, 0.2), Use(0, None)]) == (5, None)


def test_policy_of_takes_the_strictest_and_skips_bad_values():
    q = [{"spec": {"idle": {"after": "30m"}}},
         {"spec": {"idle": {"after": "5m", "action": "Evict", "below": 3}}},
         {"spec": {"idle": {"after": "soon"}}}, {"spec": {}}, {}]
    assert policy_of(q) == IdlePolicy(300, "Evict", 3.0)
    assert policy_of(q[:1]) == IdlePolicy(1800, "Report", 1.0)
    assert policy_of([{"spec": {"idle": {"after": "1m", "action": "Kill"}}}]) is None
    assert policy_of([]) is None


def test_message():
    p = IdlePolicy(60, "Evict")
    v = step(step(None, 0, 3 << 30, 0, p, 100)[0], 90, 3 << 30, 0, p, 100)[1]
    text = idle_message(v, IdlePolicy(60, "Evict"), "evicting it")
    assert text == ("pod holds 3072 MiB of GPU memory and its containers used under 1% of the "
                    "SMs for 1m30s (GPUQuota idle: after 1m, action Evict): evicting it")


@pytest.mark.parametrize("text,s", [("90s", 90), ("30m", 1800), ("1h30m", 5400),
                                    ("2h", 7200), ("1h0m5s", 3605)])
def test_durations(text, s):
    assert parse_duration(text) == s


@pytest.mark.parametrize("text", ["", "1d", "1.5h", "30s1m", "m", "-1s", " 1m", "1m "])
def test_not_durations(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@given(st.integers(0, 10 ** 7))
def test_format_parses_back(s):
    assert parse_duration(format_duration(s)) == s


# -- the API field (GPUQuota spec.idle): the webhook validates through the same model ------

def _spec(idle):
    from tessera.api.quota import GPUQuotaSpec
    return GPUQuotaSpec.model_validate({"idle": idle})


def test_spec_idle_defaults_and_bounds():
    i = _spec({"after": "30m"}).idle
    assert i is not None and (i.after_s, i.action, i.below) == (1800, "Report", 1)
    assert _spec({"after": "10s", "action": "Evict", "below": 5}).idle.after_s == 10
    for bad in ({"after": "9s"}, {"after": "721h"}, {"after": ""}, {"after": "1d"},
                {"after": "1m", "action": "Stop"}, {"after": "1m", "below": 0},
                {"after": "1m", "below": 101}, {"action": "Evict"},
                {"after": "1m", "other": 1}):
        with pytest.raises(ValueError):
            _spec(bad)

