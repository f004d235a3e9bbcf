"""The serving certificate's renewal rules (tessera_operator.webhooks.rotation), without I/O.

The property: simulated over several lifetimes, with the leader stepping at most one check
interval apart, the API server catching up with a changed caBundle after a delay, and each
replica loading a switched certificate after up to one check interval, every replica serves
at every moment an unexpired certificate whose CA the API server trusts (no admission fails)
and the certificate is renewed again and again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tessera_operator.webhooks.rotation import Policy, State, Step, after, plan, renew_at


def _policy(lifetime: float, fraction: float, check: float, step_factor: float) -> Policy:
    return Policy(lifetime_s=lifetime, renew_fraction=fraction, step_s=check * step_factor,
                  check_s=check)


@dataclass
class World:
    """What the leader wrote, what the API server trusts, what each replica serves."""

    policy: Policy
    rng: random.Random
    state: State
    trusted_at: list[tuple[float, frozenset[str]]]
    served_at: list[list[tuple[float, str, float]]]
    """Per replica: (from when, CA, not after) of what it serves."""
    validity: dict[str, tuple[float, float]] = field(default_factory=dict)
    made: int = 0
    switches: int = 0

    @classmethod
    def start(cls, policy: Policy, rng: random.Random, replicas: int = 2) -> World:
        vb, va = -min(300.0, policy.lifetime_s / 10), policy.lifetime_s
        state = State(served_ca="ca0", not_before=vb, not_after=va, bundle=("ca0",),
                      trusted=frozenset({"ca0"}))
        return cls(policy, rng, state, [(0.0, frozenset({"ca0"}))],
                   [[(0.0, "ca0", va)] for _ in range(replicas)], {"ca0": (vb, va)})

    def tick(self, now: float) -> Step:
        step = plan(self.state, now, self.policy)
        new_ca, validity = "", (0.0, 0.0)
        if step is Step.PUBLISH:
            self.made += 1
            new_ca = f"ca{self.made}"
            validity = (now - min(300.0, self.policy.lifetime_s / 10),
                        now + self.policy.lifetime_s)
            self.validity[new_ca] = validity
        before = self.state
        self.state = after(self.state, step, now, new_ca, validity)
        if self.state.bundle != before.bundle:
            # the leader patches the configurations at once; the API server follows later
            bundle = frozenset(self.state.bundle)
            self.state = State(**{**self.state.__dict__, "trusted": bundle})
            # (in order: the API server follows the configurations through a watch)
            lag = self.rng.uniform(0, self.policy.step_s / 2)
            self.trusted_at.append((max(now + lag, self.trusted_at[-1][0]), bundle))
        if step is Step.SWITCH:
            self.switches += 1
            ca = self.state.served_ca
            assert ca is not None
            for history in self.served_at:
                history.append((now + self.rng.uniform(0, self.policy.check_s), ca,
                                self.validity[ca][1]))
        return step

    def check(self, t: float) -> None:
        trusted = [x for x in self.trusted_at if x[0] <= t][-1][1]  # the latest in order
        for r, history in enumerate(self.served_at):
            _, ca, not_after = [x for x in history if x[0] <= t][-1]
            assert ca in trusted, f"t={t:.1f}: replica {r} serves {ca}, trusted {trusted}"
            assert t < not_after, f"t={t:.1f}: replica {r} serves {ca}, expired {not_after}"
        assert self.state.served_ca in self.state.bundle


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checks=st.floats(20, 1500), fraction=st.floats(0.3, 0.9),
       check=st.floats(0.2, 120), step_factor=st.floats(2, 6), seed=st.integers(0, 2**32))
def test_every_replica_always_serves_a_trusted_unexpired_certificate(
        checks: float, fraction: float, check: float, step_factor: float,
        seed: int) -> None:
    """``checks``: the lifetime in check intervals."""
    lifetime = checks * check
    policy = _policy(lifetime, fraction, check, step_factor)
    assume(not policy.problems())
    rnd = random.Random(seed)
    world = World.start(policy, rnd)
    t, end = 0.0, 3.2 * lifetime
    ticks = 0
    while t < end and ticks < 20_000:
        nxt = t + rnd.uniform(0.05, 1.0) * check
        # between two ticks nothing happens but the API server and replicas catching up
        for sample in (t, (t + nxt) / 2, nxt - 1e-6):
            world.check(sample)
        t = nxt
        world.tick(t)
        ticks += 1
    assume(ticks < 20_000)
    assert world.switches >= 3, world.switches  # renewed each lifetime, and again


def test_the_three_steps_in_order() -> None:
    p = Policy(lifetime_s=90, renew_fraction=2 / 3, step_s=4, check_s=1)
    s = State(served_ca="a", not_before=0, not_after=90, bundle=("a",),
              trusted=frozenset({"a"}))
    assert renew_at(s, p) == 60
    assert plan(s, 59.9, p) is Step.KEEP
    assert plan(s, 60, p) is Step.PUBLISH
    s = after(s, Step.PUBLISH, 60, "b", (60, 150))
    assert (s.bundle, s.next_ca, s.served_ca) == (("a", "b"), "b", "a")
    assert plan(s, 70, p) is Step.KEEP  # the configurations do not trust b yet
    s = State(**{**s.__dict__, "trusted": frozenset({"a", "b"})})
    assert plan(s, 63.9, p) is Step.KEEP  # the API server may not have caught up
    assert plan(s, 64, p) is Step.SWITCH
    s = after(s, Step.SWITCH, 64)
    assert (s.served_ca, s.next_ca, s.not_after) == ("b", None, 150)
    assert plan(s, 67.9, p) is Step.KEEP  # replicas are still loading b
    assert plan(s, 68, p) is Step.DROP
    s = after(s, Step.DROP, 68)
    assert s.bundle == ("b",) and plan(s, 100, p) is Step.KEEP


def test_an_expired_certificate_is_replaced_without_waiting_for_the_configurations() -> None:
    p = Policy(lifetime_s=90, renew_fraction=2 / 3, step_s=4, check_s=1)
    s = State(served_ca="a", not_before=0, not_after=90, bundle=("a",))
    s = after(s, plan(s, 500, p), 500, "b", (500, 590))
    assert plan(s, 500.5, p) is Step.SWITCH  # a is expired: b cannot be worse


def test_a_certificate_no_ca_of_the_bundle_signed_is_renewed_at_once() -> None:
    p = Policy(lifetime_s=90, renew_fraction=2 / 3, step_s=4, check_s=1)
    s = State(served_ca=None, not_before=0, not_after=90, bundle=("x",))
    assert plan(s, 1, p) is Step.PUBLISH


def test_a_shortened_lifetime_applies_to_the_served_certificate() -> None:
    p = Policy(lifetime_s=90, renew_fraction=2 / 3, step_s=4, check_s=1)
    s = State(served_ca="a", not_before=0, not_after=3650 * 86400, bundle=("a",))
    assert plan(s, 60, p) is Step.PUBLISH


@pytest.mark.parametrize(("policy", "says"), [
    (Policy(30, 2 / 3, 4, 1), "lengthen the lifetime"),
    (Policy(3600, 1.0, 4, 1), "between 0 and 1"),
    (Policy(3600, 2 / 3, 1, 1), "at least twice the check interval"),
    (Policy(3600, 2 / 3, 4, 0), "must be positive"),
])
def test_unsafe_policies_are_named(policy: Policy, says: str) -> None:
    assert any(says in p for p in policy.problems()), policy.problems()


def test_the_default_policy_is_safe() -> None:
    from tessera_operator.controller.settings import DEFAULTS as D
    assert not Policy(D.cert_lifetime_s, D.cert_renew_fraction, D.cert_step_s,
                      D.cert_check_interval_s).problems()
