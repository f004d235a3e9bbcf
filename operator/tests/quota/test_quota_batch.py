"""Reservations and releases decided in arrival order (the group commit's rule)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.quota import Limits, QuotaView, Usage, check_fit
from tessera.quota.batch import Change, apply_in_order

PROFILES = ["1g.10gb", "3g.40gb"]
usages = st.builds(Usage, st.integers(0, 4096), st.integers(0, 200), st.integers(0, 2),
                   st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 3), max_size=2))
hards = st.builds(Limits, st.none() | st.integers(0, 16384), st.none() | st.integers(0, 400),
                  st.none() | st.integers(0, 6),
                  st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 6), max_size=2))
changes = st.builds(Change, usages, st.booleans())


def test_first_come_first_served_and_a_refusal_does_not_block_the_rest() -> None:
    view = QuotaView("team", Limits(memory_mib=10_000, pods=3), Usage(4000, 0, 1))
    big, small = Usage(5000, 0, 1), Usage(1000, 0, 1)
    results, used = apply_in_order(view, [Change(big, True), Change(big, True),
                                          Change(small, True)])
    assert results[0] == []
    assert [(v.resource, v.used, v.hard) for v in results[1]] == [
        ("tessera.dev/vgpu-memory", "9000Mi", "10000Mi")]
    assert results[2] == []
    assert used == Usage(10_000, 0, 3)


def test_a_release_makes_room_for_the_request_behind_it() -> None:
    view = QuotaView("team", Limits(cores=100), Usage(0, 100, 1))
    results, used = apply_in_order(view, [Change(Usage(0, 60, 1), True),
                                          Change(Usage(0, 50, 1), False),
                                          Change(Usage(0, 40, 1), True)])
    assert results[0] != [] and results[1] == [] and results[2] == []
    assert used == Usage(0, 90, 1)


@given(hards, usages, st.lists(changes, max_size=12))
def test_every_applied_reservation_fit_when_it_was_decided(
        hard: Limits, start: Usage, batch: list[Change]) -> None:
    """Applying a batch equals applying its changes one by one; nothing admitted pushes a
    limited resource past ``hard`` that was not already past it."""
    view = QuotaView("q", hard, start)
    results, final = apply_in_order(view, batch)
    used = start
    for change, refused in zip(batch, results, strict=True):
        if not change.add:
            assert refused == []
            used = used - change.usage
            continue
        expected = check_fit(change.usage, [QuotaView("q", hard, used)])
        assert refused == expected
        if not refused:
            used = used + change.usage
    assert final == used
