"""The daemon's pace on the kubelet's PodResources API (``pacing``, pure) and the service
asking a fake kubelet that refuses calls past the real kubelet's limit (qps 100, burst 10,
RESOURCE_EXHAUSTED): 100 budgeted pods started at once are all confirmed without a single
refusal, asking only about pods whose answer matters. The real kubelet's answers at that
density: e2e/tests/system/test_node_density.py."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import grpc
from hypothesis import given
from hypothesis import strategies as st
from test_deviceplugin_devices import G0, SNAP
from test_deviceplugin_matching import budget_of, pod
from test_deviceplugin_wiring import service
from test_podresources import FakePodResources
from test_podresources import socket as socket  # the fixture

from tessera.api.names import VGPU
from tessera_node.deviceplugin.devices import share_id
from tessera_node.deviceplugin.matcher import pod_view
from tessera_node.deviceplugin.node_pods import POD_WATCH
from tessera_node.deviceplugin.pacing import Backoff, Pacer, PodState, to_ask
from tessera_node.deviceplugin.podresources import KubeletBusy, PodResourcesClient

GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


@given(st.floats(1, 200), st.integers(1, 10),
       st.lists(st.floats(0, 0.5), min_size=1, max_size=300))
def test_no_second_ever_holds_more_calls_than_the_rate_and_burst(
        rate: float, burst: int, gaps: list[float]) -> None:
    """Callers arriving at any times, each going when the pacer says: in every window of one
    second at most rate + burst calls."""
    clock = Clock()
    pacer = Pacer(rate, burst, clock)
    went = []
    for gap in gaps:
        clock.t += gap
        clock.t += pacer.take()  # the caller waits its turn
        went.append(clock.t)
    for i, t in enumerate(went):
        in_window = sum(1 for u in went[i:] if u < t + 1.0)
        assert in_window <= rate + burst + 1e-9


def test_backoff_doubles_while_refused_and_starts_over_after_an_answer() -> None:
    b = Backoff(0.5, 8.0)
    assert [b.refused(0) for _ in range(6)] == [0.5, 1, 2, 4, 8, 8]
    assert b.quiet(7.9) and not b.quiet(8.0)
    b.answered()
    assert b.refused(100) == 0.5


def st_(key: str, created: str, unconfirmed: bool = True, refused: bool = False) -> PodState:
    return PodState(("ns", key), created, unconfirmed, refused)


def test_who_is_asked_oldest_unconfirmed_first_only_while_something_is_pending() -> None:
    pods = [st_("young", "2026-01-01T00:00:09Z"), st_("old", "2026-01-01T00:00:01Z"),
            st_("done", "2026-01-01T00:00:00Z", unconfirmed=False),
            st_("refused", "2026-01-01T00:00:05Z", unconfirmed=False, refused=True)]
    assert to_ask(pods, True, {}, 100, 0.5, 5) == [("ns", "old"), ("ns", "young"),
                                                   ("ns", "refused")]
    # nothing pending: only the refused pod, judged again every poll
    assert to_ask(pods, False, {}, 100, 0.5, 5) == [("ns", "refused")]
    asked = {("ns", "old"): 99.8, ("ns", "refused"): 97.0}
    assert to_ask(pods, True, asked, 100, 0.5, 5) == [("ns", "young")]
    assert to_ask(pods, True, asked, 102, 0.5, 5) == [("ns", "old"), ("ns", "young"),
                                                      ("ns", "refused")]


class LimitedKubelet(FakePodResources):
    """The real kubelet's rate limit on top: qps 100, burst 10, for every client."""

    def __init__(self, path: Path, pods: dict[tuple[str, str], list[str]]) -> None:
        super().__init__(path, pods, get="on")
        self.tokens, self.at = 10.0, time.monotonic()
        self.lock = threading.Lock()
        self.refused = 0
        self.times: list[float] = []

    def Get(self, request: Any, context: Any) -> Any:
        with self.lock:
            now = time.monotonic()
            self.tokens = min(10.0, self.tokens + (now - self.at) * 100)
            self.at = now
            if self.tokens < 1:
                self.refused += 1
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
            self.tokens -= 1
            self.times.append(now)
        return super().Get(request, context)


def test_a_refused_call_is_kubelet_busy_with_the_answers_before_it(
        socket: Path) -> None:
    kubelet = LimitedKubelet(socket, {("ns", f"p{i}"): [f"GPU-0::{i}"] for i in range(40)})
    try:
        client = PodResourcesClient(str(socket))  # no pacer: as fast as it can
        try:
            client.answers([("ns", f"p{i}") for i in range(40)])
        except KubeletBusy as exc:
            got = exc.args[1]
            assert 10 <= len(got) < 40 and kubelet.refused == 1
        else:
            raise AssertionError("the kubelet never refused")
    finally:
        kubelet.stop()


def test_a_hundred_pods_at_once_confirmed_without_a_refusal(tmp_path: Path,
                                                           socket: Path) -> None:
    """100 budgeted pods bound at once; the kubelet admits them one after the other (an
    Allocate each, then its answer in PodResources): the service confirms every one, asks at
    most at its own pace, never hears RESOURCE_EXHAUSTED, and once all are confirmed asks
    nothing more. The holder check answers from what it knows, without a call."""
    n = 100
    svc = service(tmp_path)
    svc.opts.confirm_interval_s = 0.05
    svc.manager.config.shares_per_unit = n  # type: ignore[union-attr]
    svc.update(SNAP, {}, frozenset())
    objs = [pod(f"p{i:03d}", {"main": {VGPU: 1}}, budget=budget_of(GIB // 200))
            for i in range(n)]
    for i, o in enumerate(objs):
        o["metadata"]["creationTimestamp"] = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
    svc.pods.show(tuple(pod_view(o) for o in objs))
    svc.pods.health.ok(POD_WATCH)
    kubelet = LimitedKubelet(socket, {})
    svc.held.podres.socket = str(socket)
    manager = svc.require_manager()
    try:
        t0 = time.monotonic()
        for i, o in enumerate(objs):  # the kubelet admits them in order
            manager.allocate(VGPU, [share_id(G0, i)])
            kubelet.pods[("ns", o["metadata"]["name"])] = [share_id(G0, i)]
            if i % 7 == 0:  # the daemon's steps interleave with admissions
                manager.resolve(svc.held.ask(manager))
        while manager.pending_keys() and time.monotonic() - t0 < 60:
            manager.resolve(svc.held.ask(manager))
        assert not manager.pending_keys()
        assert len(manager.registry.snapshot()) == n
        assert kubelet.refused == 0
        calls = len(kubelet.times)
        assert n <= calls <= 3 * n, calls  # the oldest unconfirmed pod is the one in flight
        worst = max(sum(1 for u in kubelet.times if t <= u < t + 1) for t in kubelet.times)
        assert worst <= 22, worst
        manager.resolve(svc.held.ask(manager))
        assert len(kubelet.times) == calls  # all confirmed: nothing to ask
        held = svc.held.holders()
        assert len(held) == 1 and len(held[G0]) == n
        assert len(kubelet.times) == calls
        print(f"\n[figures] {n} pods: {calls} Gets, worst second {worst}, "
              f"{time.monotonic() - t0:.1f}s")
    finally:
        kubelet.stop()
