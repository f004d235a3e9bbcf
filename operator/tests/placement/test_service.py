"""The placement service's decisions over its view of nodes and pods (no API server: the
view is filled as the watches would fill it; the Binding write is a recording stub)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tessera.api.names import (
    ANNOTATION_BUDGET,
    ANNOTATION_PLACEMENT,
    GPU_POD,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.placement import record as record_
from tessera_e2e.operator.api_nodes import gpu_node
from tessera_operator.placement.cache import PlacementCache, node_view, pod_view
from tessera_operator.placement.extender import filter_answer, preempt_answer
from tessera_operator.placement.service import PlacementService

MIB = 1 << 20


class Binder:
    """Records Bindings as the API server would take them."""

    def __init__(self, fail: bool = False) -> None:
        self.bound: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    async def create(self, url: str, body: dict[str, Any]) -> dict[str, Any]:
        if self.fail:
            from tessera.kube.client import ApiError
            raise ApiError(409, "conflict", url)
        self.bound.append((url, body))
        return body


def node(name: str, gpus: int = 2, memory_mib: int | None = None) -> dict[str, Any]:
    n, status = gpu_node(name, gpus, shares=10)
    if memory_mib is not None:
        inv = json.loads(n["metadata"]["annotations"]["tessera.dev/gpus"])
        for g in inv:
            g["memoryMiB"] = memory_mib
            for u in g["units"]:
                u["memoryMiB"] = memory_mib
        n["metadata"]["annotations"]["tessera.dev/gpus"] = json.dumps(inv)
        status["allocatable"][VGPU_MEMORY] = str(gpus * memory_mib)
    return {**n, "status": status}


def pod(name: str, mem: int, *, node: str = "", priority: int = 0, uid: str = "",
        annotations: dict[str, str] | None = None, placed: dict[str, Any] | None = None
        ) -> dict[str, Any]:
    ann = {ANNOTATION_BUDGET: json.dumps({"version": 1, "containers": {"main": {
        "shares": 1, "memory_bytes": mem * MIB, "cores": 10, "mig": {}}}}),
        **(annotations or {})}
    if placed is not None:
        ann[ANNOTATION_PLACEMENT] = json.dumps(placed)
    return {"metadata": {"name": name, "namespace": "team", "uid": uid or f"uid-{name}",
                         "annotations": ann},
            "spec": {"nodeName": node, "priority": priority, "containers": [{
                "name": "main", "resources": {"limits": {
                    VGPU: "1", VGPU_MEMORY: str(mem), VGPU_CORES: "10", GPU_POD: "1"}}}]},
            "status": {"phase": "Running" if node else "Pending"}}


def service(*nodes: dict[str, Any], pods: tuple[dict[str, Any], ...] = (),
            binder: Binder | None = None) -> PlacementService:
    cache = PlacementCache(kube=None)  # type: ignore[arg-type]
    cache.nodes = {v.name: v for v in map(node_view, nodes)}
    for p in pods:
        cache._put(pod_view(p))
    return PlacementService(cache, binder or Binder())  # type: ignore[arg-type]


def test_a_pod_no_unit_holds_fails_on_every_node_with_the_largest_free_unit() -> None:
    svc = service(node("gpu-000", memory_mib=9984), node("gpu-001", memory_mib=9984))
    got = svc.filter(pod("big", 12000), ["gpu-000", "gpu-001"])
    assert got.nodes == ()
    assert got.unresolvable == {n: f"{n}: largest free unit 9984 MiB < 12000 MiB"
                                for n in ("gpu-000", "gpu-001")}
    assert svc.reservations == {}


def test_a_burst_of_filters_reserves_a_different_unit_for_each_pod() -> None:
    svc = service(node("gpu-000", gpus=7, memory_mib=9984),
                  node("gpu-001", gpus=7, memory_mib=9984))
    units = []
    for i in range(14):
        got = svc.filter(pod(f"p{i}", 6000), ["gpu-000", "gpu-001"])
        assert len(got.nodes) == 1, got
        units.extend(svc.reservations[f"uid-p{i}"].placed.record.units())
    assert len(set(units)) == 14
    late = svc.filter(pod("p14", 6000), ["gpu-000", "gpu-001"])
    assert late.nodes == () and all("largest free unit 3984 MiB < 6000 MiB" in m
                                    for m in late.failed.values()), late


def test_bind_writes_one_binding_carrying_the_record_and_keeps_the_reservation() -> None:
    binder = Binder()
    svc = service(node("gpu-000"), binder=binder)
    p = pod("p", 2000)
    assert svc.filter(p, ["gpu-000"]).nodes == ("gpu-000",)
    err = asyncio.run(svc.bind("team", "p", "uid-p", "gpu-000"))
    assert err == ""
    (url, body), = binder.bound
    assert url.endswith("/namespaces/team/pods/p/binding")
    assert body["target"]["name"] == "gpu-000"
    rec = record_.loads(body["metadata"]["annotations"][ANNOTATION_PLACEMENT])
    assert rec.node == "gpu-000" and len(rec.of("main", VGPU)) == 1
    assert svc.reservations["uid-p"].bound


def test_a_failed_binding_gives_the_room_back() -> None:
    svc = service(node("gpu-000"), binder=Binder(fail=True))
    svc.filter(pod("p", 2000), ["gpu-000"])
    err = asyncio.run(svc.bind("team", "p", "uid-p", "gpu-000"))
    assert "binding team/p to gpu-000" in err
    assert svc.reservations == {}


def test_recorded_pods_hold_their_units_and_ended_ones_do_not() -> None:
    n = node("gpu-000", gpus=1, memory_mib=10000)
    unit = "GPU-gpu-000-0"
    rec = {"version": 1, "node": "gpu-000", "containers": {"main": {VGPU: [unit]}}}
    holder = pod("old", 8000, node="gpu-000", placed=rec)
    svc = service(n, pods=(holder,))
    assert svc.filter(pod("new", 4000), ["gpu-000"]).nodes == ()
    ended = {**holder, "status": {"phase": "Succeeded"}}
    svc = service(n, pods=(ended,))
    assert svc.filter(pod("new", 4000), ["gpu-000"]).nodes == ("gpu-000",)


def test_the_scheduler_gets_only_nodes_it_asked_about_and_go_field_names() -> None:
    svc = service(node("gpu-000", memory_mib=1000), node("gpu-001"))
    out = filter_answer({"Pod": pod("p", 2000), "NodeNames": ["gpu-000", "gpu-001"]}, svc)
    assert out["NodeNames"] == ["gpu-001"] and out["Nodes"] is None
    assert set(out["FailedAndUnresolvableNodes"]) == {"gpu-000"}
    out = filter_answer({"Pod": pod("q", 2000), "Nodes": {"items": [
        {"metadata": {"name": "gpu-000"}}, {"metadata": {"name": "gpu-001"}}]}}, svc)
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-001"]


def test_preemption_names_the_fewest_lower_priority_pods_and_never_an_empty_set() -> None:
    n = node("gpu-000", gpus=1, memory_mib=10000)
    unit = "GPU-gpu-000-0"
    rec = {"version": 1, "node": "gpu-000", "containers": {"main": {VGPU: [unit]}}}
    low = [pod(f"low{i}", 4000, node="gpu-000", priority=0, placed=rec) for i in range(2)]
    svc = service(n, pods=tuple(low))
    out = preempt_answer({"Pod": pod("high", 5000, priority=100),
                          "NodeNameToMetaVictims": {"gpu-000": {"Pods": []}}}, svc)
    victims = out["NodeNameToMetaVictims"]["gpu-000"]["Pods"]
    assert len(victims) == 1 and victims[0]["UID"] in {"uid-low0", "uid-low1"}
    # a pod of equal priority preempts no one
    out = preempt_answer({"Pod": pod("peer", 5000, priority=0),
                          "NodeNameToMetaVictims": {"gpu-000": {"Pods": []}}}, svc)
    assert out["NodeNameToMetaVictims"] == {}
    # fits already: no node with an empty victim list (the scheduler would fail)
    out = preempt_answer({"Pod": pod("small", 1000, priority=100),
                          "NodeNameToMetaVictims": {"gpu-000": {"Pods": []}}}, svc)
    assert out["NodeNameToMetaVictims"] == {}


def test_unit_room_held_by_lower_priority_pods_is_preempted_in_the_filter_once() -> None:
    """Node totals hold the pod (the scheduler's preemption finds no victim there), but no
    unit does: the filter evicts the fewest lower-priority pods, holds the room, and does
    not evict again while they end."""
    n = node("gpu-000", gpus=2, memory_mib=10000)
    low = [pod(f"low{i}", 6000, node="gpu-000", priority=0, placed={
        "version": 1, "node": "gpu-000", "containers": {"main": {VGPU: [f"GPU-gpu-000-{i}"]}}})
        for i in range(2)]
    svc = service(n, pods=tuple(low))
    evicted: list[tuple[str, list[str]]] = []
    svc.evict = lambda who, vs: evicted.append((who, [v.key for v in vs]))
    high = pod("high", 6000, priority=100)
    got = svc.filter(high, ["gpu-000"])
    assert got.nodes == ()
    assert "preempting 1 lower-priority pod(s)" in got.failed["gpu-000"], got
    assert len(evicted) == 1 and len(evicted[0][1]) == 1
    again = svc.filter(high, ["gpu-000"])
    assert "waiting for 1 preempted pod(s) to end" in again.failed["gpu-000"], again
    assert len(evicted) == 1
    # a pod of the same priority as the holders cannot take the held room meanwhile
    assert svc.filter(pod("other", 6000), ["gpu-000"]).nodes == ()
    # the victim is gone: the nominated pod gets its room
    victim = evicted[0][1][0].split("/")[1]
    svc.cache._drop(f"uid-{victim}")
    assert svc.filter(high, ["gpu-000"]).nodes == ("gpu-000",)


@pytest.mark.parametrize("policy,expect_same", [("binpack", True), ("spread", False)])
def test_gpu_policy_decides_whether_two_small_pods_share_a_unit(policy: str,
                                                                expect_same: bool) -> None:
    svc = service(node("gpu-000", gpus=2))
    ann = {"tessera.dev/gpu-policy": policy}
    for name in ("a", "b"):
        assert svc.filter(pod(name, 2000, annotations=ann), ["gpu-000"]).nodes
    a, b = (svc.reservations[f"uid-{n}"].placed.record.units() for n in ("a", "b"))
    assert (a == b) is expect_same


def test_node_policy_binpack_fills_the_busier_node_spread_the_emptier() -> None:
    unit = "GPU-gpu-000-0"
    busy = pod("busy", 40000, node="gpu-000", placed={
        "version": 1, "node": "gpu-000", "containers": {"main": {VGPU: [unit]}}})
    svc = service(node("gpu-000"), node("gpu-001"), pods=(busy,))
    assert svc.filter(pod("b", 1000, annotations={"tessera.dev/node-policy": "binpack"}),
                      ["gpu-000", "gpu-001"]).nodes == ("gpu-000",)
    assert svc.filter(pod("s", 1000, annotations={"tessera.dev/node-policy": "spread"}),
                      ["gpu-000", "gpu-001"]).nodes == ("gpu-001",)


def test_the_daemons_commitments_count_only_for_pods_bound_without_a_record() -> None:
    """A unit the daemon still reports committed after its pod was deleted (its figures
    trail by a confirmation round) is free when every pod on the node has a record; a pod
    bound by another scheduler (no record) makes the daemon's figures count."""
    n = node("gpu-000", gpus=1, memory_mib=10000)
    n["metadata"]["annotations"]["tessera.dev/gpu-commitments"] = json.dumps(
        {"GPU-gpu-000-0": {"memory": 10000 * MIB, "committed": 8000 * MIB, "containers": 1}})
    svc = service(n)
    assert svc.filter(pod("new", 4000), ["gpu-000"]).nodes == ("gpu-000",)
    foreign = pod("foreign", 8000, node="gpu-000")  # bound, no record
    svc = service(n, pods=(foreign,))
    got = svc.filter(pod("new", 4000), ["gpu-000"])
    assert got.nodes == () and "largest free unit 2000 MiB" in got.failed["gpu-000"], got


def test_a_deleted_pods_reservation_goes_at_once() -> None:
    """Bound, then deleted before the watch showed its record: its units are free again
    at the next decision, not after the reservation's two minutes."""
    svc = service(node("gpu-000", gpus=1, memory_mib=10000))
    svc.filter(pod("gone", 8000), ["gpu-000"])
    assert asyncio.run(svc.bind("team", "gone", "uid-gone", "gpu-000")) == ""
    assert svc.filter(pod("next", 8000), ["gpu-000"]).nodes == ()
    svc.cache._drop("uid-gone", gone=True)
    assert svc.filter(pod("next", 8000), ["gpu-000"]).nodes == ("gpu-000",)
