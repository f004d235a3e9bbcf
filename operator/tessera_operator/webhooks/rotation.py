"""When the leader renews the webhook serving certificate, and in which steps (no I/O).

The API server must trust the certificate every replica serves at every moment, and the
replicas switch certificates one by one.  So a renewal takes three steps, each written to the
serving Secret (the state lives there, so a new leader carries on where the old one stopped):

1. **publish**: a new CA and certificate are made; the Secret's CA bundle becomes old + new
   CA and the new certificate waits beside the served one; the leader copies the bundle into
   the webhook configurations' ``caBundle`` at once.
2. **switch**: once the webhook configurations trust the new CA, and ``step_s`` after the
   publish (the API server has reloaded its webhook clients), the new certificate becomes
   the served one; every replica loads it within its check interval.
3. **drop**: ``step_s`` after the switch (every replica serves the new certificate), the old
   CA leaves the bundle.

A renewal starts at ``renew_fraction`` of the certificate's lifetime (of the shorter of its
own and the configured one, so a shortened lifetime applies at once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import Enum


@dataclass(frozen=True)
class Policy:
    lifetime_s: float
    """Lifetime of each certificate made."""
    renew_fraction: float
    """Renew when this fraction of the served certificate's lifetime has passed."""
    step_s: float
    """Least time between two steps of a renewal."""
    check_s: float
    """How often the leader steps and every replica re-reads the Secret."""

    def problems(self) -> list[str]:
        """What makes the policy unsafe (empty: none)."""
        out = []
        if not 0 < self.renew_fraction < 1:
            out.append(f"the renewal fraction must be between 0 and 1, got {self.renew_fraction}")
        if self.check_s <= 0 or self.step_s < 2 * self.check_s:
            out.append(f"the rotation step ({self.step_s} s) must be at least twice the check "
                       f"interval ({self.check_s} s), which must be positive: every replica "
                       "reloads the certificate within one check interval")
        margin = self.lifetime_s * (1 - self.renew_fraction)
        need = 2 * (self.step_s + 3 * self.check_s)
        if margin < need:
            out.append(f"a certificate lifetime of {self.lifetime_s} s leaves {margin:.0f} s "
                       f"after the renewal starts; its steps need {need:.0f} s "
                       "(twice step + 3 check intervals): lengthen the lifetime")
        return out


class Step(Enum):
    KEEP = "keep"
    PUBLISH = "publish"
    """Make a new CA and certificate; the bundle gains the new CA."""
    SWITCH = "switch"
    """Serve the waiting certificate."""
    DROP = "drop"
    """The bundle keeps only the served certificate's CA."""


@dataclass(frozen=True)
class State:
    """The Secret, as the rotation sees it; CAs are named by fingerprint."""

    served_ca: str | None
    """CA of the served certificate, one of ``bundle``; None: no CA of the bundle signed
    it (then a renewal starts at once)."""
    not_before: float
    not_after: float
    """Validity of the served certificate (seconds since the epoch)."""
    bundle: tuple[str, ...]
    """CAs of the Secret's bundle (``ca.crt``)."""
    next_ca: str | None = None
    """CA of the certificate waiting to be served (from the bundle), if any."""
    next_validity: tuple[float, float] | None = None
    """Validity of the waiting certificate."""
    step_at: float | None = None
    """When the last step was written."""
    trusted: frozenset[str] = frozenset()
    """CAs every webhook of the webhook configurations trusts now."""


def renew_at(state: State, policy: Policy) -> float:
    own = state.not_after - state.not_before
    return state.not_before + policy.renew_fraction * min(own, policy.lifetime_s)


def plan(state: State, now: float, policy: Policy) -> Step:
    """The step to take now."""
    since = now - (state.step_at if state.step_at is not None else -math.inf)
    if state.next_ca is not None:
        if state.next_ca not in state.bundle:
            return Step.PUBLISH  # a half-written renewal: start it again
        expired = now >= state.not_after
        if expired or (since >= policy.step_s and state.next_ca in state.trusted):
            return Step.SWITCH
        return Step.KEEP
    if state.served_ca is None or now >= renew_at(state, policy):
        return Step.PUBLISH
    if len(state.bundle) > 1 and since >= policy.step_s:
        return Step.DROP
    return Step.KEEP


def after(state: State, step: Step, now: float, new_ca: str = "",
          new_validity: tuple[float, float] = (0.0, 0.0)) -> State:
    """The state once ``step`` is written (``new_ca``, ``new_validity``: what PUBLISH made).
    The Secret's I/O does the same to the Secret (the property tests run the rules on this)."""
    if step is Step.KEEP:
        return state
    if step is Step.PUBLISH:
        kept = tuple(c for c in state.bundle if c != state.next_ca or c == state.served_ca)
        return replace(state, bundle=(*kept, new_ca), next_ca=new_ca,
                       next_validity=new_validity, step_at=now)
    if step is Step.SWITCH:
        assert state.next_ca is not None and state.next_validity is not None
        return replace(state, served_ca=state.next_ca, next_ca=None, next_validity=None,
                       not_before=state.next_validity[0], not_after=state.next_validity[1],
                       step_at=now)
    assert state.served_ca is not None
    return replace(state, bundle=(state.served_ca,), step_at=now)
