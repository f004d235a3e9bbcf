"""The reservation ledger: exact counts under churn, and no reservation held past its pod.

The model below plays a cluster against the pure rules: admission reserves under a UID, the
API server creates or refuses each pod later (or not before a slow webhook answers), pods
are deleted and finish, the operator's pod watch lags behind (or loses events and lists
again), and the operator counts at any moment.  Whatever the order:

- ``used`` never drops below what pods and requests in flight really hold (so admission can
  never push a namespace past ``hard``);
- once the watch has caught up and every request has ended, a count makes ``used`` exactly
  what the pods hold, and the ledger empty.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tessera.quota import Limits, QuotaView, Usage
from tessera.quota.arith import Pending
from tessera.quota.batch import Change, Count, Release, Reserve, apply_in_order
from tessera.quota.ledger import (
    PodCount,
    dead_candidates,
    expired,
    expires_at,
    needs_count,
    recounted,
)

DEADLINE = 70.0
MARGIN = 10.0
"""The API server ends a create at ``DEADLINE - MARGIN`` (its ``--request-timeout``)."""


def test_expiry_is_the_request_deadline_plus_margin() -> None:
    assert expires_at(1000.0, DEADLINE) == 1070.0
    ledger = {"a": Pending("a", Usage(pods=1), 1070.0), "b": Pending("b", Usage(pods=1), 1100)}
    assert expired(ledger, 1070.0) == set() and expired(ledger, 1071.0) == {"a"}
    seen = PodCount(Usage(), frozenset({"a"}))
    assert dead_candidates(ledger, seen, 2000.0) == {"b"}


def test_needs_count_only_when_a_count_would_change_something() -> None:
    entry = Pending("a", Usage(10, 1, 1), 100.0)
    pods = PodCount(Usage(20, 2, 2), frozenset({"x", "y"}))
    settled = QuotaView("q", Limits(), Usage(30, 3, 3), pending={"a": entry})
    assert not needs_count(settled, pods, 50.0)
    assert needs_count(settled, pods, 101.0)  # its request ended: given back, or seen
    assert needs_count(QuotaView("q", Limits(), Usage(31, 3, 3), pending={"a": entry}), pods,
                       50.0)  # drift
    assert needs_count(settled, PodCount(Usage(30, 3, 3), frozenset({"x", "y", "a"})), 50.0)
    assert needs_count(QuotaView("q", Limits(), Usage(), counted=False), pods, 0.0)
    assert recounted(pods, set(), {"a": entry}) == (Usage(30, 3, 3), {"a": entry})


@dataclass
class Cluster:
    """The world (what the API server holds) and the operator's view of it."""

    now: float = 0.0
    used: Usage | None = None
    pending: dict[str, Pending] = field(default_factory=dict)
    inflight: dict[str, tuple[Usage, float]] = field(default_factory=dict)
    """UID -> (usage, expires): admitted, create request still running."""
    pods: dict[str, tuple[Usage, bool]] = field(default_factory=dict)
    """UID -> (usage, finished): pods that exist."""
    marked: set[str] = field(default_factory=set)
    """Finished pods the operator marked released."""
    events: list[tuple[str, str]] = field(default_factory=list)
    """World events the operator's watch has not delivered yet."""
    view: dict[str, Usage] = field(default_factory=dict)
    """The operator's pod view: UID -> what the pod holds (zero once released)."""
    dead: set[str] = field(default_factory=set)
    next_uid: int = 0

    def apply(self, change: Change) -> bool:
        view = QuotaView("q", Limits(), self.used or Usage(), "", self.pending,
                         self.used is not None)
        results, state = apply_in_order(view, [change])
        self.used, self.pending = state.used, dict(state.pending)
        return results == [[]]

    def truth(self) -> Usage:
        """What really holds quota: requests that can still create their pod (before the
        API server's deadline) and pods not yet released."""
        out = Usage()
        for u, expires in self.inflight.values():
            if self.now <= expires - MARGIN:
                out = out + u
        for uid, (u, _) in self.pods.items():
            if uid not in self.marked:
                out = out + u
        return out

    # -- the API server ---------------------------------------------------------------------

    def reserve(self, usage: Usage) -> None:
        uid = f"u{self.next_uid}"
        self.next_uid += 1
        expires = expires_at(self.now, DEADLINE)
        if self.apply(Reserve(uid, uid, usage, expires)):
            self.inflight[uid] = (usage, expires)

    def create(self, i: int) -> None:
        """The request succeeds (only before its deadline), or ends refused."""
        uid = sorted(self.inflight)[i % len(self.inflight)]
        usage, expires = self.inflight.pop(uid)
        if self.now <= expires - MARGIN:  # the API server's own deadline
            self.pods[uid] = (usage, False)
            self.events.append(("ADDED", uid))

    def refuse(self, i: int) -> None:
        self.inflight.pop(sorted(self.inflight)[i % len(self.inflight)])

    def delete(self, i: int) -> None:
        uid = sorted(self.pods)[i % len(self.pods)]
        del self.pods[uid]
        self.events.append(("DELETED", uid))

    def finish(self, i: int) -> None:
        uid = sorted(self.pods)[i % len(self.pods)]
        usage, done = self.pods[uid]
        if not done:
            self.pods[uid] = (usage, True)
            self.events.append(("FINISHED", uid))

    # -- the operator -----------------------------------------------------------------------

    def deliver(self) -> None:
        """One watch event, handled as the controller does (view and release together)."""
        typ, uid = self.events.pop(0)
        if typ == "ADDED":
            if uid in self.pods:
                self.view[uid] = Usage() if uid in self.marked else self.pods[uid][0]
        elif typ == "DELETED":
            self.view.pop(uid, None)
            if uid not in self.marked and uid not in self.dead:
                self.apply(Release(uid, self.usage_of(uid)))
        elif uid in self.pods and uid not in self.marked:  # FINISHED: mark, then release
            self.marked.add(uid)
            self.view[uid] = Usage()
            self.apply(Release(uid, self.pods[uid][0]))

    def usage_of(self, uid: str) -> Usage:
        """A deleted pod's budget, as its DELETED event carries it."""
        return self.history[uid]

    history: dict[str, Usage] = field(default_factory=dict)

    def relist(self) -> None:
        """The watch broke and listed again: events in between are lost."""
        self.events.clear()
        self.view = {uid: Usage() if uid in self.marked else u
                     for uid, (u, _) in self.pods.items()}
        for uid, (u, done) in self.pods.items():
            if done and uid not in self.marked:
                self.marked.add(uid)
                self.view[uid] = Usage()
                self.apply(Release(uid, u))

    def count(self) -> None:
        seen = PodCount.of(self.view)
        dead = {uid for uid in dead_candidates(self.pending, seen, self.now)
                if uid not in self.pods}  # the controller asks the API server (a GET)
        self.dead |= dead
        self.apply(Count(seen, frozenset(dead)))


usages = st.builds(Usage, st.integers(0, 4096), st.integers(0, 100), st.just(1),
                   st.dictionaries(st.sampled_from(["1g.10gb", "3g.40gb"]), st.integers(0, 2),
                                   max_size=1))
ops = st.lists(st.one_of(
    st.tuples(st.just("reserve"), usages),
    st.tuples(st.sampled_from(["create", "refuse", "delete", "finish"]), st.integers(0, 50)),
    st.tuples(st.sampled_from(["deliver", "relist", "count"]), st.none()),
    st.tuples(st.just("tick"), st.floats(0, 40)),
), max_size=60)


def covers(used: Usage, truth: Usage) -> bool:
    return (used.memory_mib >= truth.memory_mib and used.cores >= truth.cores
            and used.pods >= truth.pods
            and all(used.mig.get(k, 0) >= v for k, v in truth.mig.items()))


ONE = Usage(1024, 10, 1)
TWO = Usage(2048, 20, 1)


@settings(max_examples=1000, deadline=None)
@given(ops)
# the watch is behind when a request's deadline passes: the pod exists, so nothing is dead
@example([("reserve", ONE), ("create", 0), ("tick", 40.0), ("tick", 40.0), ("count", None)])
# a pod came and went while the watch was behind: dead, and its late DELETED releases nothing
@example([("reserve", TWO), ("create", 0), ("deliver", None), ("reserve", ONE), ("create", 0),
          ("delete", 1), ("tick", 40.0), ("tick", 40.0), ("count", None), ("deliver", None),
          ("deliver", None)])
# a pod deleted before it was seen takes its pending reservation with it, once
@example([("reserve", TWO), ("create", 0), ("deliver", None), ("reserve", ONE), ("create", 0),
          ("delete", 1), ("deliver", None), ("deliver", None), ("count", None)])
# a slow request is still pending at every count before its deadline
@example([("reserve", ONE), ("tick", 30.0), ("count", None), ("tick", 25.0), ("count", None),
          ("create", 0), ("count", None), ("deliver", None), ("count", None)])
def test_used_never_undercounts_and_settles_exactly(history: list[tuple[str, object]]) -> None:
    c = Cluster()
    c.count()  # the quota is counted when it appears
    for op, arg in history:
        if op == "reserve":
            assert isinstance(arg, Usage)
            c.reserve(arg)
        elif op in ("create", "refuse") and c.inflight:
            getattr(c, op)(arg)
        elif op in ("delete", "finish") and c.pods:
            uid = sorted(c.pods)[int(arg) % len(c.pods)]  # type: ignore[call-overload]
            c.history[uid] = c.pods[uid][0]
            getattr(c, op)(arg)
        elif op == "deliver" and c.events:
            c.deliver()
        elif op == "relist":
            c.relist()
        elif op == "count":
            c.count()
        elif op == "tick":
            assert isinstance(arg, float)
            c.now += arg
        assert c.used is not None and covers(c.used, c.truth()), (op, c.used, c.truth())
    # every request ends, the watch catches up, time passes the deadlines: one count is exact
    for uid in list(c.inflight):
        c.refuse(sorted(c.inflight).index(uid))
    while c.events:
        c.deliver()
    c.now += DEADLINE + 1
    c.count()
    assert c.used == c.truth() and c.pending == {}
