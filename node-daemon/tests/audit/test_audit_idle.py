"""Idle holders on the node (tessera_node.audit.idle): uses from NVML and ledger launch
counts, the policy read from the namespace's GPUQuotas, one Event per episode, the gauge, evictions
(a PodDisruptionBudget's 429 retried, reported once per episode), with a fake API server."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import generate_latest

from tessera.kube.client import ApiError
from tessera_node.audit.idle import (
    REASON_BLOCKED,
    REASON_EVICTED,
    REASON_IDLE,
    IdleReclaim,
    PodKey,
    UnitSample,
    sm_uses,
)

GIB = 1 << 30


class FakeKube:
    def __init__(self, quotas: dict[str, list[dict[str, Any]]],
                 evict_status: int | None = None) -> None:
        self.quotas = quotas
        self.evict_status = evict_status
        self.events: list[dict[str, Any]] = []
        self.evictions: list[tuple[str, dict[str, Any]]] = []
        self.lists = 0

    async def list(self, url: str, **_: Any) -> dict[str, Any]:
        self.lists += 1
        ns = url.split("/namespaces/")[1].split("/")[0]
        return {"items": self.quotas.get(ns, [])}

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        if url.endswith("/eviction"):
            self.evictions.append((url, body))
            if self.evict_status is not None:
                raise ApiError(self.evict_status, '{"message": "no"}', "evict")
        else:
            self.events.append(body)
        return body


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


IDLE = PodKey("team", "idle", "uid-idle")
BUSY = PodKey("team", "busy", "uid-busy")
OTHER = PodKey("other", "idle2", "uid-other")


def gpu(pod: PodKey, memory: int, sm: float) -> UnitSample:
    return UnitSample(pod, "main", "GPU-0", memory, sm, None)


def quota(action: str, after: str = "30s", below: int = 1) -> list[dict[str, Any]]:
    return [{"spec": {"idle": {"after": after, "action": action, "below": below}}}]


def run(r: IdleReclaim, clock: Clock, samples: list[UnitSample], steps: int,
        dt: float = 10.0) -> None:
    for _ in range(steps):
        asyncio.run(r.step(samples))
        clock.t += dt


def reasons(kube: FakeKube) -> list[str]:
    return [e["reason"] for e in kube.events]


def test_report_posts_one_event_per_episode_and_the_gauge() -> None:
    kube, clock = FakeKube({"team": quota("Report")}), Clock()
    r = IdleReclaim(kube, 10, clock)  # type: ignore[arg-type]
    samples = [gpu(IDLE, 2 * GIB, 0.0), gpu(BUSY, 2 * GIB, 40.0)]
    run(r, clock, samples, 3)  # t = 0, 10, 20: not yet
    assert kube.events == []
    run(r, clock, samples, 3)  # 30: due, then twice more
    assert reasons(kube) == [REASON_IDLE]
    ev = kube.events[0]
    assert ev["involvedObject"]["name"] == "idle" and ev["type"] == "Normal"
    assert "2048 MiB" in ev["message"] and "for 30s" in ev["message"]
    assert "reported only" in ev["message"]
    assert kube.evictions == []
    text = generate_latest().decode()
    assert 'tessera_pod_gpu_idle_seconds{namespace="team",pod="idle"} 50.0' in text
    assert 'pod="busy"' not in text
    # busy again: the episode ends, the gauge goes; idle again: a new Event after 30 s
    run(r, clock, [gpu(IDLE, 2 * GIB, 30.0)], 1)
    assert 'pod="idle"' not in generate_latest().decode()
    run(r, clock, samples, 4)
    assert reasons(kube) == [REASON_IDLE, REASON_IDLE]
    assert kube.lists <= 2  # the policy is read once a minute per namespace


def test_evict_evicts_the_idle_pod_only_and_once() -> None:
    kube, clock = FakeKube({"team": quota("Evict")}), Clock()
    r = IdleReclaim(kube, 10, clock)  # type: ignore[arg-type]
    samples = [gpu(IDLE, GIB, 0.5), gpu(BUSY, GIB, 50.0), gpu(OTHER, GIB, 0.0)]
    run(r, clock, samples, 6)
    assert [u for u, _ in kube.evictions] == ["/api/v1/namespaces/team/pods/idle/eviction"]
    body = kube.evictions[0][1]
    assert body["kind"] == "Eviction" and body["apiVersion"] == "policy/v1"
    assert body["deleteOptions"]["preconditions"]["uid"] == "uid-idle"
    assert reasons(kube) == [REASON_IDLE, REASON_EVICTED]
    assert kube.events[0]["type"] == "Warning" and "evicting it" in kube.events[0]["message"]


def test_a_pdb_blocks_then_the_eviction_is_retried_every_audit() -> None:
    kube, clock = FakeKube({"team": quota("Evict")}, evict_status=429), Clock()
    r = IdleReclaim(kube, 10, clock)  # type: ignore[arg-type]
    run(r, clock, [gpu(IDLE, GIB, 0.0)], 6)
    assert len(kube.evictions) == 3  # at 30, 40, 50 s
    assert reasons(kube) == [REASON_IDLE, REASON_BLOCKED]
    assert "PodDisruptionBudget" in kube.events[1]["message"]
    kube.evict_status = None
    run(r, clock, [gpu(IDLE, GIB, 0.0)], 1)
    assert reasons(kube) == [REASON_IDLE, REASON_BLOCKED, REASON_EVICTED]


def test_no_policy_no_memory_or_unknown_use_is_never_acted_on() -> None:
    kube, clock = FakeKube({"team": quota("Evict")}), Clock()
    r = IdleReclaim(kube, 10, clock)  # type: ignore[arg-type]
    unknown = UnitSample(IDLE, "main", "MIG-1", GIB, None, None)
    run(r, clock, [gpu(OTHER, GIB, 0.0), gpu(BUSY, 0, 0.0), unknown], 10)
    assert kube.evictions == [] and kube.events == []


def test_quotas_unreadable_nothing_is_done() -> None:
    class Failing(FakeKube):
        async def list(self, url: str, **_: Any) -> dict[str, Any]:
            raise ApiError(403, "{}", "list")

    kube, clock = Failing({}), Clock()
    r = IdleReclaim(kube, 10, clock)  # type: ignore[arg-type]
    run(r, clock, [gpu(IDLE, GIB, 0.0)], 10)
    assert kube.evictions == [] and kube.events == []


def test_mig_use_is_the_launch_count_moving() -> None:
    last: dict[tuple[str, str, str], int] = {}
    s = UnitSample(IDLE, "main", "MIG-1", GIB, None, 5)
    assert sm_uses([s], last)[IDLE][0].sm is None  # no previous count yet
    assert sm_uses([s], last)[IDLE][0].sm == 0.0
    moved = UnitSample(IDLE, "main", "MIG-1", GIB, None, 6)
    assert sm_uses([moved], last)[IDLE][0].sm == 100.0
    assert sm_uses([], last) == {} and last == {}
