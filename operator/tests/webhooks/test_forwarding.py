"""Reservation hand-over between replicas: the wire format and who may use it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.quota.arith import Usage, Violation
from tessera.reservations.forwarding import (
    authorized,
    token_from_key,
    usage_from_wire,
    usage_to_wire,
    violation_from_wire,
    violation_to_wire,
)

counts = st.integers(min_value=0, max_value=10**9)
usages = st.builds(Usage, counts, counts, counts,
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb", "7g.80gb"]),
                                   st.integers(min_value=1, max_value=64)))


@given(usages)
def test_usage_survives_the_wire(u: Usage) -> None:
    assert usage_from_wire(usage_to_wire(u)) == u


@given(st.text(), st.text(), st.text(), st.text(), st.text(), st.text())
def test_violations_survive_the_wire(quota: str, res: str, req: str, used: str, hard: str,
                                     reason: str) -> None:
    v = Violation(quota, res, req, used, hard, reason)
    assert violation_from_wire(violation_to_wire(v)) == v


@pytest.mark.parametrize("bad", [
    {"memoryMiB": -1, "cores": 0, "pods": 1, "mig": {}},
    {"memoryMiB": "1024", "cores": 0, "pods": 1, "mig": {}},
    {"memoryMiB": 1.5, "cores": 0, "pods": 1, "mig": {}},
    {"memoryMiB": True, "cores": 0, "pods": 1, "mig": {}},
    {"memoryMiB": 1, "cores": 0, "pods": 1, "mig": {"1g.10gb": -2}},
    {"memoryMiB": 1, "cores": 0, "pods": 1, "mig": []},
    {"cores": 0, "pods": 1, "mig": {}},
])
def test_a_malformed_usage_is_refused_not_guessed(bad: dict[str, Any]) -> None:
    """A negative or non-integer usage would let a caller free quota it never held."""
    with pytest.raises((ValueError, KeyError, TypeError, AttributeError)):
        usage_from_wire(bad)


def test_only_holders_of_the_serving_key_are_replicas() -> None:
    token = token_from_key(b"-----BEGIN PRIVATE KEY-----\nabc\n")
    assert token != token_from_key(b"-----BEGIN PRIVATE KEY-----\nabd\n")
    assert authorized(f"Bearer {token}", token)
    for header in (None, "", token, f"Bearer {token}x", f"bearer {token}",
                   "Bearer " + token_from_key(b"other")):
        assert not authorized(header, token)
