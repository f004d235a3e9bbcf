"""Reservations, releases and counts decided in arrival order (the group commit's rule)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tessera.quota import Limits, QuotaView, Usage, check_fit
from tessera.quota.arith import NOT_COUNTED, Pending
from tessera.quota.batch import Count, Release, Reserve, State, apply_in_order
from tessera.quota.ledger import MAX_PENDING, PodCount

PROFILES = ["1g.10gb", "3g.40gb"]
usages = st.builds(Usage, st.integers(0, 4096), st.integers(0, 200), st.integers(0, 2),
                   st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 3), max_size=2))
hards = st.builds(Limits, st.none() | st.integers(0, 16384), st.none() | st.integers(0, 400),
                  st.none() | st.integers(0, 6),
                  st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 6), max_size=2))
uids = st.sampled_from([f"uid-{i}" for i in range(6)])
changes = st.one_of(
    st.builds(Reserve, uids, st.just("p"), usages, st.just(100.0)),
    st.builds(Release, uids, st.none() | usages))


def reserve(uid: str, usage: Usage) -> Reserve:
    return Reserve(uid, f"pod-{uid}", usage, 100.0)


def test_first_come_first_served_and_a_refusal_does_not_block_the_rest() -> None:
    view = QuotaView("team", Limits(memory_mib=10_000, pods=3), Usage(4000, 0, 1))
    big, small = Usage(5000, 0, 1), Usage(1000, 0, 1)
    results, state = apply_in_order(view, [reserve("a", big), reserve("b", big),
                                           reserve("c", small)])
    assert results[0] == []
    assert [(v.resource, v.used, v.hard) for v in results[1]] == [
        ("tessera.dev/vgpu-memory", "9000Mi", "10000Mi")]
    assert results[2] == []
    assert state.used == Usage(10_000, 0, 3)
    assert set(state.pending) == {"a", "c"}


def test_a_release_makes_room_for_the_request_behind_it() -> None:
    view = QuotaView("team", Limits(cores=100), Usage(0, 100, 1))
    results, state = apply_in_order(view, [reserve("a", Usage(0, 60, 1)),
                                           Release("old", Usage(0, 50, 1)),
                                           reserve("b", Usage(0, 40, 1))])
    assert results[0] != [] and results[1] == [] and results[2] == []
    assert state.used == Usage(0, 90, 1)


def test_a_reservation_is_counted_once_however_often_it_arrives() -> None:
    """A replica whose hand-over failed after the leader wrote it reserves again."""
    view = QuotaView("team", Limits(pods=2), Usage())
    results, state = apply_in_order(view, [reserve("a", Usage(0, 10, 1)),
                                           reserve("a", Usage(0, 10, 1))])
    assert results == [[], []] and state.used == Usage(0, 10, 1)


def test_a_pending_reservation_is_released_once_with_what_it_reserved() -> None:
    entry = Pending("p", Usage(100, 10, 1), 100.0)
    view = QuotaView("team", Limits(), Usage(300, 30, 3), pending={"a": entry})
    _, state = apply_in_order(view, [Release("a", Usage(100, 10, 1)), Release("a", None)])
    assert state.used == Usage(200, 20, 2) and state.pending == {}
    # a seen pod (no entry) gives its usage back; an admission taking back gives nothing
    _, state = apply_in_order(view, [Release("b", Usage(50, 5, 1)), Release("c", None)])
    assert state.used == Usage(250, 25, 2) and set(state.pending) == {"a"}


def test_a_quota_never_counted_admits_nothing_until_counted() -> None:
    view = QuotaView("team", Limits(pods=5), Usage(), counted=False)
    results, state = apply_in_order(view, [reserve("a", Usage(0, 0, 1))])
    assert [v.reason for v in results[0]] == [NOT_COUNTED]
    assert state == State(None, {})
    assert str(results[0][0]).startswith('GPUQuota "team": is new and the operator has not')
    pods = PodCount(Usage(0, 0, 10), frozenset(f"p{i}" for i in range(10)))
    results, state = apply_in_order(view, [Count(pods), reserve("a", Usage(0, 0, 1))])
    assert state.used == Usage(0, 0, 10)
    assert [(v.resource, v.used, v.hard) for v in results[1]] == [("pods", "10", "5")]


def test_a_quota_that_cannot_be_read_admits_nothing_and_says_why() -> None:
    view = QuotaView("team", Limits(), Usage(), problem="spec.hard.memory 'x' cannot be read")
    results, _ = apply_in_order(view, [reserve("a", Usage(0, 0, 1))])
    assert str(results[0][0]) == "GPUQuota \"team\": spec.hard.memory 'x' cannot be read"


def test_a_full_ledger_refuses_until_pods_are_seen() -> None:
    pending = {f"u{i}": Pending("p", Usage(pods=1), 100.0) for i in range(MAX_PENDING)}
    view = QuotaView("team", Limits(), Usage(pods=MAX_PENDING), pending=pending)
    results, _ = apply_in_order(view, [reserve("new", Usage(pods=1))])
    assert "being created at once" in str(results[0][0])
    seen = PodCount(Usage(pods=MAX_PENDING), frozenset(pending))
    results, state = apply_in_order(view, [Count(seen), reserve("new", Usage(pods=1))])
    assert results[1] == [] and set(state.pending) == {"new"}


@given(hards, usages, st.lists(changes, max_size=12))
def test_every_applied_reservation_fit_when_it_was_decided(
        hard: Limits, start: Usage, batch: list[Reserve | Release]) -> None:
    """Applying a batch equals applying its changes one by one; nothing admitted pushes a
    limited resource past ``hard`` that was not already past it; the ledger holds exactly
    the reservations applied and not released."""
    view = QuotaView("q", hard, start)
    results, final = apply_in_order(view, batch)
    used, pending = start, {}
    for change, refused in zip(batch, results, strict=True):
        if isinstance(change, Release):
            assert refused == []
            entry = pending.pop(change.uid, None)
            given = entry.usage if entry is not None else change.usage
            used = used - given if given is not None else used
            continue
        if change.uid in pending:
            assert refused == []
            continue
        expected = check_fit(change.usage, [QuotaView("q", hard, used)])
        assert refused == expected
        if not refused:
            used = used + change.usage
            pending[change.uid] = Pending(change.pod, change.usage, change.expires)
    assert final == State(used, pending)


@given(hards, usages, st.lists(changes, max_size=8), usages, st.sets(uids), st.sets(uids))
def test_a_count_sets_used_from_pods_and_what_stays_pending(
        hard: Limits, start: Usage, before: list[Reserve | Release], pods_usage: Usage,
        seen: set[str], dead: set[str]) -> None:
    """Whatever ``used`` was (drift included), a count makes it the pods' usage plus the
    reservations neither seen nor dead, and those are exactly what stays pending."""
    _, mid = apply_in_order(QuotaView("q", hard, start), before)
    assert mid.used is not None
    view = QuotaView("q", hard, mid.used, pending=mid.pending)
    _, after = apply_in_order(view, [Count(PodCount(pods_usage, frozenset(seen)),
                                           frozenset(dead))])
    kept = {u: e for u, e in mid.pending.items() if u not in seen and u not in dead}
    total = pods_usage
    for e in kept.values():
        total = total + e.usage
    assert after == State(total, kept)
