"""Where a container's shares go: the node-local choice by free memory, counting allocations
not confirmed yet (issue 34, deliverable 2), and tessera's recorded placement honoured
(``tessera.dev/placement``): pure rules table-tested, then the resource manager under a fake
kubelet that admits pods as the real one does (one at a time, in its watch's order;
GetPreferredAllocation, then Allocate, per container; PodResources only later), and over the
plugin's real gRPC."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_deviceplugin_matching import budget_of, pod
from test_deviceplugin_server import FakeKubelet

from tessera.api.names import ANNOTATION_PLACEMENT, VGPU
from tessera.placement.record import PlacementRecord, dumps
from tessera_node.budget.writer import BudgetWriter
from tessera_node.deviceplugin import pending, placed
from tessera_node.deviceplugin.allocation import preferred, roomy
from tessera_node.deviceplugin.devices import Unit, share_id, unit_of
from tessera_node.deviceplugin.manager import Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import (
    ContainerRef,
    Held,
    PodView,
    admission_order,
    candidates,
    pod_view,
)
from tessera_node.deviceplugin.proto import api_pb2
from tessera_node.deviceplugin.proto import api_pb2_grpc as _grpc
from tessera_node.deviceplugin.server import AllocateError, PluginServer
from tessera_node.settings import FORGET_PENDING_S

api_grpc: Any = _grpc
MIB = 1 << 20
GIB = 1 << 30
INSTANCE = 9984 * MIB  # an H100's 1g.10gb
GPUS = ("GPU-00000000-0000-0000-0000-000000000000", "GPU-10000000-0000-0000-0000-000000000000")
MIGS = tuple(f"MIG-{g}{k}000000-0000-0000-0000-000000000000"
             for g in range(2) for k in range(7))  # 14 units, as node-0's
GPU_OF = {m: GPUS[int(m[4])] for m in MIGS}
SHARES = 10


# -- pure rules --------------------------------------------------------------------------


def ids(units: Sequence[str], n: int = 3) -> list[str]:
    return [share_id(u, k) for u in units for k in range(n)]


@pytest.mark.parametrize(
    ("free_mib", "must", "size", "need_mib", "want_units"),
    [
        ({"A": 4000, "B": 10000, "C": 7000}, [], 1, 6000, {"B", "C"}),  # A cannot hold it
        ({"A": 4000, "B": 10000, "C": 7000}, [], 2, 8000, {"A", "B", "C"}),  # too few: all
        ({"A": 4000, "B": 10000, "C": 7000}, ["A::1"], 2, 6000, {"B", "C"}),  # A is a must
        ({"A": 4000, "B": 5000}, [], 1, 6000, {"A", "B"}),  # none does: the policy's
    ],
)
def test_roomy_keeps_the_units_whose_free_memory_holds_the_budget(
        free_mib: dict[str, int], must: list[str], size: int, need_mib: int,
        want_units: set[str]) -> None:
    free = {u: m * MIB for u, m in free_mib.items()}
    got = roomy(ids(list(free)), must, size, free, need_mib * MIB)
    assert {unit_of(d) for d in got} == want_units


@pytest.mark.parametrize(
    ("free_mib", "policy", "size", "want"),
    [
        # pack: the GPU with the least free memory first (g0: A+B), then its fullest unit
        ({"A": 1000, "B": 2000, "C": 9500, "D": 10000}, "pack", 1, ["A::0"]),
        ({"A": 1000, "B": 2000, "C": 9500, "D": 10000}, "pack", 2, ["A::0", "B::0"]),
        ({"A": 5000, "B": 6000, "C": 9500, "D": 10000}, "pack", 1, ["C::0"]),
        # spread: the GPU with the most free memory, then its emptiest unit; a second share
        # goes to another GPU first
        ({"A": 1000, "B": 2000, "C": 9500, "D": 10000}, "spread", 1, ["D::0"]),
        ({"A": 1000, "B": 2000, "C": 9500, "D": 10000}, "spread", 2, ["D::0", "C::0"]),
    ],
)
def test_preferred_orders_by_free_memory_when_known(
        free_mib: dict[str, int], policy: str, size: int, want: list[str]) -> None:
    gpu_of = {"A": "g0", "B": "g0", "C": "g1", "D": "g2"}
    free = {u: m * MIB for u, m in free_mib.items()}
    got = preferred(ids(list(free), 1), [], size, gpu_of, policy, free)  # type: ignore[arg-type]
    assert got == want


def placement(containers: dict[str, dict[str, list[str]]], node: str = "n1") -> str:
    return dumps(PlacementRecord(node, {c: {r: tuple(us) for r, us in by.items()}
                                        for c, by in containers.items()}))


def placed_pod(name: str, units: list[str] | None, memory: int = 6000 * MIB,
               raw: str | None = None, created: str = "2026-01-01T00:00:00Z",
               container: str = "main") -> dict[str, Any]:
    o = pod(name, {container: {VGPU: len(units or [0])}},
            budget=budget_of(memory, len(units or [0]), container))
    if units is not None or raw is not None:
        o["metadata"]["annotations"][ANNOTATION_PLACEMENT] = (
            raw if raw is not None else placement({container: {VGPU: units or []}}))
    o["metadata"]["creationTimestamp"] = created
    return o


@pytest.mark.parametrize(
    ("units", "raw", "given", "why"),
    [
        (None, None, ["MIG-00"], None),  # no record: any units
        (["MIG-00"], None, ["MIG-00"], None),
        (["MIG-00", "MIG-10"], None, ["MIG-10", "MIG-00"], None),  # a set: any order
        (["MIG-00"], None, ["MIG-01"], "devices on MIG-01 are not the units tessera placed "
                                       "pod ns/p container main on (MIG-00)"),
        (["MIG-00", "MIG-10"], None, ["MIG-00"], "are not the units tessera placed"),
        (None, "{not json", ["MIG-00"], "tessera.dev/placement is not JSON"),
        (None, json.dumps({"version": 9, "node": "n1", "containers": {}}), ["MIG-00"],
         "version 9 is not 1"),
    ],
)
def test_a_placed_container_is_given_its_recorded_units_only(
        units: list[str] | None, raw: str | None, given: list[str], why: str | None) -> None:
    view = pod_view(placed_pod("p", units, raw=raw))
    got = placed.check(view, "main", VGPU, given)
    assert (got is None) if why is None else (why in (got or "")), got


@pytest.mark.parametrize(
    ("units", "available", "must", "want"),
    [
        (["A"], ["A::3", "A::1", "B::0"], [], ["A::1"]),  # the lowest free share of A
        (["A", "B"], ["A::2", "B::0", "B::5", "C::0"], [], ["A::2", "B::0"]),
        (["A", "B"], ["A::2", "B::0", "B::5"], ["B::5"], ["A::2", "B::5"]),  # a must on B
        (["A"], ["A::2", "C::0"], ["C::0"], ["A::2"]),  # a must elsewhere: not compatible
        (["A", "B"], ["A::2", "C::0"], [], ["A::2"]),  # B has no free share: fewer
    ],
)
def test_offer_is_one_share_of_each_recorded_unit(
        units: list[str], available: list[str], must: list[str], want: list[str]) -> None:
    assert placed.offer(units, available, must, len(units)) == want


def test_reserved_counts_recorded_placements_not_allocated_yet() -> None:
    views = [pod_view(o) for o in (
        placed_pod("a", ["MIG-00"], 3000 * MIB), placed_pod("b", ["MIG-00"], 2000 * MIB),
        placed_pod("c", None, 5000 * MIB), placed_pod("d", ["MIG-01"]))]
    started = PodView(**{**views[1].__dict__, "started": frozenset({"main"})})
    mem = {m: INSTANCE for m in MIGS}
    taken = frozenset({ContainerRef("ns", "d", "main")})
    assert placed.reserved([views[0], started, views[2], views[3]], "n1", VGPU, taken,
                           mem) == {"MIG-00": [3000 * MIB]}
    assert placed.reserved(views, "n2", VGPU, frozenset(), mem) == {}


def test_admission_order_is_the_watchs_then_creation_then_containers() -> None:
    a = pod_view(placed_pod("a", None, created="2026-01-01T00:00:05Z"))
    b = pod_view(placed_pod("b", None, created="2026-01-01T00:00:01Z"))
    c = pod_view(pod("c", {"init": {VGPU: 1}, "main": {VGPU: 1}}, init=("init",)))
    # one watch event (a list): by creation time; later events: in the watch's order
    assert [p.name for p, _ in candidates([a, b], "n1", VGPU, 1)] == ["b", "a"]
    a2, b2 = (PodView(**{**a.__dict__, "seen": 1}), PodView(**{**b.__dict__, "seen": 2}))
    assert [p.name for p, _ in candidates([b2, a2], "n1", VGPU, 1)] == ["a", "b"]
    assert sorted([(c, "main"), (c, "init")], key=admission_order)[0][1] == "init"


def test_an_allocation_is_tentatively_for_the_first_free_candidate_it_fits() -> None:
    views = [pod_view(placed_pod(n, None)) for n in ("a", "b", "c")]
    cands = [(v, "main") for v in views]
    ref = {v.name: ContainerRef("ns", v.name, "main") for v in views}
    assert pending.next_up(cands, frozenset({ref["a"]}))[0].name == "b"  # type: ignore[index]
    assert pending.next_up(cands, frozenset(ref.values())) is None
    fits_b = lambda p, c: p.name == "b"  # noqa: E731
    assert pending.owner(cands, frozenset(), fits_b)[0].name == "b"
    assert pending.owner(cands, frozenset(), lambda p, c: False)[0].name == "a"
    assert pending.owner(cands, frozenset(ref.values()), fits_b)[0].name == "a"
    t = {"k1": pending.Tentative((ref["a"],), ("MIG-00",), 6000 * MIB),
         "k2": pending.Tentative((ref["b"],), ("MIG-01",), None),
         "k3": pending.Tentative((ref["c"],), ("MIG-02",), 1)}
    gone = [views[0], views[1]]  # c deleted: its allocation no longer counts
    assert pending.held(t, gone, {"MIG-01": INSTANCE}) == {
        "MIG-00": [6000 * MIB], "MIG-01": [INSTANCE]}
    assert pending.held(t, gone, {}, skip="k1") == {"MIG-01": [0]}


# -- the resource manager under a fake kubelet -------------------------------------------


class Node:
    """node-0 as in the issue: two H100s, seven shared 1g.10gb instances each; the pods
    bound to it; a kubelet that admits them as the real one does."""

    def __init__(self, tmp: Path, pods: list[dict[str, Any]], policy: str = "pack",
                 units: Sequence[str] = MIGS) -> None:
        self.pods = pods
        self.events: list[tuple[str, str, str]] = []
        self.writer = BudgetWriter(tmp / "containers", pending_wait_ms=5000)
        self.m = Manager(
            PluginConfig(node="n1", shares_per_unit=SHARES, lib_dir="/opt/tessera/lib/v1",
                         visibility="cdi", forget_after_s=FORGET_PENDING_S,
                         policy=policy),  # type: ignore[arg-type]
            self.writer, self.views, lambda p, c, why: self.events.append((p.name, c, why)))
        self.m.update(NodeState(
            units=[Unit(m, GPU_OF[m], int(m[4]), "1g.10gb", INSTANCE, True) for m in units],
            sharing={g: "Shares" for g in GPUS}))
        self.allocated: dict[tuple[str, str], list[str]] = {}
        self.failed: dict[str, str] = {}

    def views(self) -> list[PodView]:
        return [PodView(**{**pod_view(o).__dict__, "seen": i + 1})
                for i, o in enumerate(self.pods)]

    def admit(self, name: str, container: str = "main", n: int = 1) -> None:
        """The kubelet's devicesToAllocate, then Allocate: GetPreferredAllocation when
        more devices are free than needed, its answer taken where available, the rest
        filled in; a failed Allocate fails the pod."""
        in_use = {d for ds in self.allocated.values() for d in ds}
        available = [d.id for d in self.m.advertised()[VGPU] if d.id not in in_use]
        chosen: list[str] = []
        if n < len(available):
            chosen = [d for d in self.m.resource(VGPU).preferred(available, [], n)
                      if d in available][:n]
        chosen += [d for d in available if d not in chosen][:n - len(chosen)]
        try:
            self.m.allocate(VGPU, chosen)
        except AllocateError as exc:
            self.failed[name] = str(exc)
            return
        self.allocated[(name, container)] = chosen

    def confirm(self) -> None:
        """PodResources shows every allocation; the daemon resolves."""
        self.m.resolve([Held(ContainerRef("ns", p, c), VGPU, tuple(ds))
                        for (p, c), ds in self.allocated.items()])

    def budgets(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Pod -> its budget file's state, units."""
        out = {}
        for e in self.m.registry.snapshot():
            out[e.pod] = ("refused" if e.refused else "ready", e.units)
        return out


@pytest.mark.parametrize("policy", ["pack", "spread"])
@pytest.mark.parametrize("confirm_every", [0, 1, 3])
def test_ten_6000_mib_pods_at_once_each_alone_on_an_instance(
        tmp_path: Path, policy: str, confirm_every: int) -> None:
    """The issue's burst: ten pods of 6,000 MiB bound at once onto 14 instances of 9,984
    MiB, admitted before any is confirmed (or with confirmations between): every one ready,
    each alone on its instance, none refused."""
    node = Node(tmp_path, [placed_pod(f"p{i}", None) for i in range(10)], policy)
    for i in range(10):
        node.admit(f"p{i}")
        if confirm_every and i % confirm_every == 0:
            node.confirm()
    assert not node.failed
    node.confirm()
    got = node.budgets()
    assert sorted(got) == [f"p{i}" for i in range(10)]
    assert all(state == "ready" for state, _ in got.values()), got
    assert len({units for _, units in got.values()}) == 10, got
    assert not node.events
    if policy == "pack":  # the first GPU's seven instances first
        assert sum(units[0] in MIGS[:7] for _, units in got.values()) == 7
    else:
        assert sum(units[0] in MIGS[:7] for _, units in got.values()) == 5


@pytest.mark.parametrize(
    ("budgets_mib", "units", "ready"),
    [
        # 3000-MiB pods fill an instance three at a time (9000 of 9984), 6000s alone
        ([6000, 3000, 3000, 3000, 6000], MIGS[:3], 5),
        ([3000] * 6, MIGS[:2], 6),
        # four 6000s, three instances: the fourth fits nowhere; the kubelet hands it a share
        # anyway (the scheduler saw room: 29952 MiB) and its budget is refused, with an Event
        ([6000] * 4, MIGS[:3], 3),
    ],
)
def test_mixed_budgets_fill_by_memory(tmp_path: Path, budgets_mib: list[int],
                                      units: Sequence[str], ready: int) -> None:
    node = Node(tmp_path, [placed_pod(f"p{i}", None, m * MIB)
                           for i, m in enumerate(budgets_mib)], units=units)
    for i in range(len(budgets_mib)):
        node.admit(f"p{i}")
    node.confirm()
    got = node.budgets()
    assert sum(state == "ready" for state, _ in got.values()) == ready, got
    assert len(node.events) == len(budgets_mib) - ready


def test_a_pod_deleted_before_its_confirmation_no_longer_holds_its_unit(tmp_path: Path
                                                                       ) -> None:
    node = Node(tmp_path, [placed_pod("a", None), placed_pod("b", None)], units=MIGS[:1])
    node.admit("a")
    del node.pods[0]  # a deleted while its allocation waits for PodResources
    assert node.m.resource(VGPU).preferred(ids(MIGS[:1], SHARES)[1:], [], 1) == \
        [share_id(MIGS[0], 1)]
    node.admit("b")  # its Allocate succeeds on the one instance
    assert ("b", "main") in node.allocated and not node.failed


def test_recorded_placements_hold_their_units_for_pods_without_one(tmp_path: Path) -> None:
    """The extender reserved MIG-00 and MIG-01 for pods not admitted yet: a pod without a
    record is not offered them."""
    node = Node(tmp_path, [placed_pod("r0", [MIGS[0]]), placed_pod("r1", [MIGS[1]]),
                           placed_pod("free", None)], units=MIGS[:3])
    node.pods.append(node.pods.pop(0))  # r0 bound last: r1, free, r0 in the watch
    node.admit("r1")
    node.admit("free")
    assert unit_of(node.allocated[("free", "main")][0]) == MIGS[2]
    node.admit("r0")
    node.confirm()
    got = node.budgets()
    assert {p: u for p, (_, u) in got.items()} == {
        "r0": (MIGS[0],), "r1": (MIGS[1],), "free": (MIGS[2],)}
    assert all(s == "ready" for s, _ in got.values())


def test_a_placed_pod_is_offered_and_given_only_its_recorded_units(tmp_path: Path) -> None:
    """Placed pods, pack would put elsewhere: GetPreferredAllocation answers their records;
    a kubelet handing other devices fails the Allocate, naming both; an unreadable record
    fails it with the parse error; the recorded units still match when the kubelet hands
    any share of them."""
    two = placed_pod("two", [MIGS[9], MIGS[3]], 2000 * MIB)
    node = Node(tmp_path, [placed_pod("a", [MIGS[12]]), two,
                           placed_pod("bad", None, raw="{oops")])
    plugin = node.m.resource(VGPU)
    every = [d.id for d in node.m.advertised()[VGPU]]
    assert plugin.preferred(every, [], 1) == [share_id(MIGS[12], 0)]
    with pytest.raises(AllocateError, match=(
            rf"devices on {MIGS[0]} are not the units tessera placed pod ns/a container "
            rf"main on \({MIGS[12]}\)")):
        node.m.allocate(VGPU, [share_id(MIGS[0], 0)])
    node.m.allocate(VGPU, [share_id(MIGS[12], 7)])  # any share of its unit
    assert plugin.preferred(every, [share_id(MIGS[3], 4)], 2) == [
        share_id(MIGS[9], 0), share_id(MIGS[3], 4)]
    node.m.allocate(VGPU, [share_id(MIGS[3], 4), share_id(MIGS[9], 0)])
    with pytest.raises(AllocateError, match=r"tessera\.dev/placement is not JSON"):
        node.m.allocate(VGPU, [share_id(MIGS[5], 0)])
    # confirmation refuses a placed container PodResources shows on other units (the
    # kubelet gave it what Allocate matched to another candidate)
    node.allocated = {("a", "main"): [share_id(MIGS[3], 4), share_id(MIGS[9], 0)],
                      ("two", "main"): [share_id(MIGS[12], 7)]}
    node.confirm()
    refused = {p for p, _, why in node.events if "are not the units tessera placed" in why}
    assert refused == {"a", "two"}, node.events


@pytest.fixture
def plugins_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="dp", dir="/tmp"))  # unix socket paths are short
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_the_fake_kubelet_over_grpc_places_pods_on_their_recorded_units(
        plugins_dir: Path) -> None:
    """Over the plugin's gRPC, a kubelet that admits as the real one: three placed pods and
    two without records; each placed container gets exactly its recorded unit, the others
    the free memory that is left beside the placements recorded but not admitted yet."""
    kubelet = FakeKubelet(plugins_dir)
    node = Node(plugins_dir, [
        placed_pod("r0", [MIGS[13]]), placed_pod("n0", None), placed_pod("r1", [MIGS[0]]),
        placed_pod("n1", None), placed_pod("r2", [MIGS[1]], 3000 * MIB)], units=MIGS)
    plugin = PluginServer(node.m.resource(VGPU), plugins_dir)
    plugin.start()
    try:
        kubelet.registered.get(timeout=10)
        with grpc.insecure_channel(f"unix://{plugin.socket}") as ch:
            stub = api_grpc.DevicePluginStub(ch)
            for o in node.pods:
                name = o["metadata"]["name"]
                in_use = {d for ds in node.allocated.values() for d in ds}
                available = [d.id for d in node.m.advertised()[VGPU] if d.id not in in_use]
                pref = stub.GetPreferredAllocation(api_pb2.PreferredAllocationRequest(
                    container_requests=[api_pb2.ContainerPreferredAllocationRequest(
                        available_deviceIDs=available, allocation_size=1)]), timeout=10)
                got = list(pref.container_responses[0].deviceIDs)
                stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=got)]), timeout=10)
                node.allocated[(name, "main")] = got
            with pytest.raises(grpc.RpcError) as err:  # a kubelet ignoring the preference
                node.pods.append(placed_pod("r3", [MIGS[2]]))
                stub.Allocate(api_pb2.AllocateRequest(container_requests=[
                    api_pb2.ContainerAllocateRequest(devices_ids=[share_id(MIGS[4], 0)])]),
                    timeout=10)
            assert "are not the units tessera placed pod ns/r3" in (err.value.details() or "")
        node.pods.pop()
        node.confirm()
        units = {p: u for p, (s, u) in node.budgets().items() if s == "ready"}
        assert units["r0"] == (MIGS[13],) and units["r1"] == (MIGS[0],)
        assert units["r2"] == (MIGS[1],)
        assert len(units) == 5, units  # all ready: no instance over its memory
        # the 6000s without a record keep off r0's and r1's instances (reserved, 6000 each);
        # one shares r2's (3000 + 6000 of 9984), pack's fullest that still holds it
        assert {units["n0"], units["n1"]} == {(MIGS[1],), (MIGS[2],)}, units
    finally:
        plugin.stop()
        kubelet.stop()
