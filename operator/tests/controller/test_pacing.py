"""The leader writes one quota's status at most once per interval, and a quota it has not
written lately at once."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from tessera.controller.pacing import Pacer


def test_a_key_never_written_is_due_at_once() -> None:
    assert Pacer[str](1.0).split({"a", "b"}, 100.0) == ({"a", "b"}, set())


def test_a_key_written_waits_out_the_interval_then_is_due() -> None:
    p = Pacer[str](1.0)
    p.wrote("a", 10.0)
    assert p.split({"a", "b"}, 10.5) == ({"b"}, {"a"})
    assert p.next_due({"a", "b"}) == 11.0
    assert p.split({"a"}, 11.0) == ({"a"}, set())


def test_next_due_is_none_when_nothing_was_written() -> None:
    assert Pacer[str](1.0).next_due({"a"}) is None


def test_forgotten_keys_are_due_again() -> None:
    p = Pacer[str](1.0)
    p.wrote("gone", 5.0)
    p.wrote("kept", 5.0)
    p.forget({"kept"})
    assert p.split({"gone", "kept"}, 5.1) == ({"gone"}, {"kept"})


@given(st.lists(st.floats(0, 100), min_size=1, max_size=200), st.floats(0.1, 5))
def test_writes_of_one_key_are_never_closer_than_the_interval(times: list[float],
                                                              interval: float) -> None:
    """Whatever the moments a key is found dirty, the writes it is let through are at least
    the interval apart, and a moment the interval after the last write always writes."""
    p = Pacer[str](interval)
    written: list[float] = []
    for t in sorted(times):
        due, later = p.split({"q"}, t)
        assert due | later == {"q"} and not due & later
        if due:
            p.wrote("q", t)
            written.append(t)
    assert all(b >= a + interval for a, b in pairwise(written))
    assert written and written[0] == min(times)
    assert p.split({"q"}, written[-1] + interval)[0] == {"q"}
