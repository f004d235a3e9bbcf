"""Which pod is that, memory fit, what Allocate returns, and the resource manager's whole
cycle (Allocate -> pending -> PodResources List -> ready / refused -> removed)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, VGPU
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container.response import (
    HostPaths,
    SimPaths,
    container_response,
    preload_line,
)
from tessera_node.deviceplugin import fit
from tessera_node.deviceplugin.devices import Unit, share_id
from tessera_node.deviceplugin.manager import Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import (
    ContainerRef,
    Held,
    allocation_key,
    candidates,
    confirm,
    pod_view,
)
from tessera_node.deviceplugin.server import AllocateError
from tessera_node.settings import FORGET_PENDING_S

GIB = 1 << 30
G0 = "GPU-00000000-0000-0000-0000-000000000000"
M0 = "MIG-a0000000-0000-0000-0000-000000000000"


def pod(name: str, limits: dict[str, dict[str, int]], node: str = "n1", phase: str = "Pending",
        started: tuple[str, ...] = (), deleting: bool = False, budget: str | None = None,
        init: tuple[str, ...] = ()) -> dict[str, Any]:
    def container(c: str) -> dict[str, Any]:
        return {"name": c, "resources": {"limits": {k: str(v) for k, v in limits[c].items()}}}
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    if budget is not None:
        meta["annotations"] = {ANNOTATION_BUDGET: budget}
    return {
        "metadata": meta,
        "spec": {"nodeName": node,
                 "initContainers": [container(c) for c in limits if c in init],
                 "containers": [container(c) for c in limits if c not in init]},
        "status": {"phase": phase, "containerStatuses": [
            {"name": c, "state": {"running": {}}} for c in started]},
    }


@pytest.mark.parametrize(
    ("pods", "want"),
    [
        ([pod("a", {"main": {VGPU: 2}})], [("a", "main")]),
        ([pod("a", {"main": {VGPU: 1}})], []),  # another count
        ([pod("a", {"main": {VGPU: 2}}, node="n2")], []),  # another node
        ([pod("a", {"main": {VGPU: 2}}, phase="Running")], []),
        ([pod("a", {"main": {VGPU: 2}}, deleting=True)], []),
        ([pod("a", {"main": {VGPU: 2}}, started=("main",))], []),
        ([pod("a", {"main": {VGPU: 2}}), pod("m", {"main": {VGPU: 2}})],  # matched already
         [("a", "main")]),
        # several pods at once: every one is a candidate
        ([pod("b", {"main": {VGPU: 2}}), pod("a", {"x": {VGPU: 2}, "y": {VGPU: 2}})],
         [("a", "x"), ("a", "y"), ("b", "main")]),
        ([pod("a", {"i": {VGPU: 2}, "main": {VGPU: 2}}, init=("i",))],
         [("a", "i"), ("a", "main")]),
    ],
)
def test_candidates(pods: list[dict[str, Any]], want: list[tuple[str, str]]) -> None:
    views = [pod_view(p) for p in pods]
    matched = frozenset({ContainerRef("ns", "m", "main")})
    got = candidates(views, "n1", VGPU, 2, matched)
    assert [(p.name, c) for p, c in got] == want


def test_confirm_is_exact_and_the_app_container_wins() -> None:
    ids = ["A::0", "B::3"]
    key = allocation_key(VGPU, ids)
    assert key == allocation_key(VGPU, list(reversed(ids)))
    assert key != allocation_key("tessera.dev/mig-1g.10gb", ids)
    rows = [
        Held(ContainerRef("ns", "p", "init"), VGPU, ("B::3", "A::0")),
        Held(ContainerRef("ns", "p", "main"), VGPU, ("A::0", "B::3")),
        Held(ContainerRef("ns", "q", "main"), VGPU, ("A::0",)),
    ]
    assert confirm(rows, {key: 0.0, "other": 0.0}) == {key: ContainerRef("ns", "p", "main")}


def test_a_row_asked_before_an_allocation_was_made_never_confirms_it() -> None:
    """The kubelet handed an ended pod's share to the next pod: the ended pod's answer,
    asked before the new Allocate, names the same key but says nothing of the new holder."""
    key = allocation_key(VGPU, ["A::0"])
    old = Held(ContainerRef("ns", "ended", "main"), VGPU, ("A::0",), asked_at=100.0)
    new = Held(ContainerRef("ns", "next", "main"), VGPU, ("A::0",), asked_at=205.0)
    assert confirm([old], {key: 200.0}) == {}
    assert confirm([old], {key: 100.0}) == {key: old.ref}  # asked as it was made: counts
    assert confirm([old, new], {key: 200.0}) == {key: new.ref}
    assert confirm([new, old], {key: 200.0}) == {key: new.ref}  # order cannot bring it back


@pytest.mark.parametrize(
    ("held", "want", "fits"),
    [
        ([], 80 * GIB, True),
        ([40 * GIB], 40 * GIB, True),
        ([40 * GIB, 30 * GIB], 11 * GIB, False),
        ([80 * GIB], 1, False),
    ],
)
def test_overcommit(held: list[int], want: int, fits: bool) -> None:
    why = fit.overcommit([G0], want, {G0: 80 * GIB}, {G0: held})
    assert (why is None) == fits
    if not fits:
        assert why and "would exceed its 81920 MiB" in why
    assert fit.overcommit([M0], 1, {M0: None}, {}) == f"memory of {M0} is unknown"


@given(st.lists(st.integers(0, 100 * GIB), max_size=8), st.integers(0, 100 * GIB))
def test_granting_only_what_fits_never_overcommits(wants: list[int], total: int) -> None:
    held: dict[str, list[int]] = {G0: []}
    for w in wants:
        if fit.overcommit([G0], w, {G0: total}, held) is None:
            held[G0].append(w)
    assert sum(held[G0]) <= total


PATHS = HostPaths("/opt/tessera/lib/v1.2.3", "/var/lib/tessera/c/k/budget",
                  "/var/lib/tessera/c/k/run/ledger", "/var/lib/tessera/c/managed")


@pytest.mark.parametrize(
    ("visibility", "extra_mounts", "cdi", "envs"),
    [
        ("cdi", [], (f"nvidia.com/gpu={G0}", f"nvidia.com/gpu={M0}"), {}),
        ("volume-mounts",
         [(f"/var/run/nvidia-container-devices/{G0}", "/dev/null", True),
          (f"/var/run/nvidia-container-devices/{M0}", "/dev/null", True)], (),
         {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"}),
        ("sim",
         [("/usr/local/tessera-sim/lib", "/sim/lib", True),
          ("/usr/local/tessera-sim/node.ini", "/sim/node.ini", True),
          ("/usr/local/tessera-sim/node.state", "/sim/node.ini.state", False),
          ("/usr/local/tessera-sim/dev/nvidia0", "/sim/dev/nvidia0", True),
          ("/usr/local/tessera-sim/dev/nvidia-caps/nvidia-cap12",
           "/sim/dev/nvidia-caps/nvidia-cap12", True)], (),
         {"LD_LIBRARY_PATH": "/usr/local/tessera-sim/lib",
          "TESSERA_SIM_NODE": "/usr/local/tessera-sim/node.ini",
          "TESSERA_SIM_STATE": "/usr/local/tessera-sim/node.state",
          "TESSERA_SIM_DEV": "/usr/local/tessera-sim/dev"}),
    ],
)
def test_allocate_response(visibility: str, extra_mounts: list[tuple[str, str, bool]],
                           cdi: tuple[str, ...], envs: dict[str, str]) -> None:
    r = container_response(PATHS, [G0, M0], visibility,  # type: ignore[arg-type]
                           SimPaths.of("/sim/lib", "/sim/node.ini"),
                           ("nvidia0", "nvidia-caps/nvidia-cap12"))
    base = [
        ("/usr/local/lib/tessera/libtessera.so", "/opt/tessera/lib/v1.2.3/libtessera.so", True),
        ("/etc/ld.so.preload", "/opt/tessera/lib/v1.2.3/ld.so.preload", True),
        # the ledger file alone: writable, but never removed or replaced from inside
        ("/run/tessera/ledger", "/var/lib/tessera/c/k/run/ledger", False),
        ("/run/tessera/budget", "/var/lib/tessera/c/k/budget", True),
        ("/run/tessera/managed", "/var/lib/tessera/c/managed", True),
    ]
    assert [(m.container_path, m.host_path, m.read_only) for m in r.mounts] == base + extra_mounts
    assert r.cdi_devices == cdi and r.envs == envs
    # never a device list a pod could have written itself
    assert r.envs.get("NVIDIA_VISIBLE_DEVICES", "/var/run/nvidia-container-devices") == \
        "/var/run/nvidia-container-devices"
    assert preload_line() == "/usr/local/lib/tessera/libtessera.so\n"


def test_the_library_knows_where_the_plugin_mounts_it() -> None:
    """Loaded from there, libtessera is managed (a missing budget file refuses memory) even
    when something covers /run/tessera: the path it compares with is the one mounted."""
    header = (Path(__file__).resolve().parents[3] / "hook" / "src" / "formats.h").read_text()
    m = re.search(r'#define TB_LIB_PATH "([^"]+)"', header)
    assert m and m.group(1) == preload_line().strip(), m


def budget_of(memory: int, shares: int = 1, container: str = "main") -> str:
    return BudgetAnnotation(containers={container: PerShareBudget(
        shares=shares, memory_bytes=memory, cores=30)}).to_annotation()


class Cycle:
    def __init__(self, tmp: Path, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.events: list[tuple[str, str, str]] = []
        self.writer = BudgetWriter(tmp / "containers", pending_wait_ms=5000)
        self.m = Manager(
            PluginConfig(node="n1", shares_per_unit=4, lib_dir="/opt/tessera/lib/v1",
                         visibility="cdi", forget_after_s=FORGET_PENDING_S),
            self.writer, lambda: [pod_view(p) for p in self.pods],
            lambda p, c, why: self.events.append((p.name, c, why)),
        )
        self.m.update(NodeState(units=[Unit(G0, G0, 0, None, 80 * GIB, True)]))


def test_cycle_pending_ready_refused_removed(tmp_path: Path) -> None:
    c = Cycle(tmp_path, [
        pod("a", {"main": {VGPU: 1}}, budget=budget_of(50 * GIB)),
        pod("b", {"main": {VGPU: 1}}, budget=budget_of(40 * GIB)),
    ])
    ra = c.m.allocate(VGPU, [share_id(G0, 0)])
    rb = c.m.allocate(VGPU, [share_id(G0, 1)])
    ka, kb = allocation_key(VGPU, [share_id(G0, 0)]), allocation_key(VGPU, [share_id(G0, 1)])
    assert ra.cdi_devices == (f"nvidia.com/gpu={G0}",)
    assert str(c.writer.budget_path(kb)) in [m.host_path for m in rb.mounts]
    assert c.writer.read(ka).state == "pending" and c.writer.read(kb).state == "pending"
    assert c.writer.read(ka).wait_ms == 5000
    # the kubelet shows a first, then both: the second would overcommit G0
    c.m.resolve([Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),))])
    a = c.writer.read(ka)
    assert a.state == "ready" and a.entries[0].uuid == G0 and a.entries[0].memory == 50 * GIB
    assert a.entries[0].cores == 30
    assert c.writer.read(kb).state == "pending"
    both = [Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),)),
            Held(ContainerRef("ns", "b", "main"), VGPU, (share_id(G0, 1),))]
    c.m.resolve(both)
    b = c.writer.read(kb)
    assert b.state == "refused" and "would exceed its 81920 MiB" in b.reason
    assert c.events == [("b", "main", b.reason)]
    c.m.resolve(both)
    assert len(c.events) == 1  # one Event, not one per period
    # the kubelet lists nothing for a moment (it restarted): a's pod has not ended, a's
    # files stay (removing them would detach the running container's budget mount)
    c.m.resolve([])
    assert sorted(r.key for r in c.writer.records()) == sorted([ka, kb])
    # a ends: its files go; b's are kept while the kubelet shows it
    c.pods[0]["status"] = {"phase": "Succeeded"}
    c.m.resolve(both[1:])
    assert [r.key for r in c.writer.records()] == [kb]
    assert not (c.writer.root / ka).exists()
    # and b, refused while a held the GPU, is judged again: its budget fits now, so its
    # next process (or the container restarted) runs under it; no second Event
    c.m.resolve(both[1:])
    b = c.writer.read(kb)
    assert b.state == "ready" and b.entries[0].memory == 40 * GIB
    assert len(c.events) == 1


def test_a_share_handed_on_is_never_confirmed_as_the_ended_pods(tmp_path: Path) -> None:
    """a ends; the kubelet hands its share to b before the daemon's watch shows a ended, and
    the daemon still keeps a's answer (the same device ID, so the same key). b's Allocate
    must not be confirmed as a's: its files would be removed when a is seen to end, under
    b's starting container (the runtime then mounts a directory made in their place: CI,
    Kubernetes 1.34, 'budget file /run/tessera/budget not a regular file')."""
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(2 * GIB)),
                         pod("b", {"main": {VGPU: 1}}, budget=budget_of(GIB))])
    share = (share_id(G0, 0),)
    key = allocation_key(VGPU, share)
    c.m.allocate(VGPU, share)  # a's
    a_row = Held(ContainerRef("ns", "a", "main"), VGPU, share, asked_at=time.time())
    c.m.resolve([a_row])
    assert c.writer.read(key).entries[0].memory == 2 * GIB
    c.pods[0]["status"] = {"phase": "Running", "containerStatuses": [
        {"name": "main", "state": {"running": {}}}]}
    c.m.allocate(VGPU, share)  # b's: a has ended, the watch does not show it yet
    c.m.resolve([a_row])  # only a's old answer is known
    assert c.writer.read(key).state == "pending"
    c.pods[0]["status"] = {"phase": "Succeeded"}
    c.m.resolve([a_row])  # a seen ended: b's files stay
    assert [r.key for r in c.writer.records()] == [key]
    assert c.writer.budget_path(key).is_file()
    c.m.resolve([Held(ContainerRef("ns", "b", "main"), VGPU, share, asked_at=time.time())])
    got = c.writer.read(key)
    assert got.state == "ready" and got.entries[0].memory == GIB


def test_a_directory_where_the_budget_file_was_is_replaced_at_allocate(tmp_path: Path) -> None:
    """A container created after its allocation's files were removed: containerd made a
    directory at the missing mount source. The next Allocate of those devices writes a
    budget file again instead of failing on the directory."""
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(GIB))])
    key = allocation_key(VGPU, [share_id(G0, 0)])
    c.writer.budget_path(key).mkdir(parents=True)
    c.m.allocate(VGPU, [share_id(G0, 0)])
    assert c.writer.budget_path(key).is_file()
    assert c.writer.read(key).state == "pending"


def test_allocate_that_cannot_write_the_budget_file_fails_with_the_reason(
    tmp_path: Path,
) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(GIB))])
    key = allocation_key(VGPU, [share_id(G0, 0)])
    (c.writer.root / key).write_text("not a directory")
    with pytest.raises(AllocateError, match="cannot write the container's budget file"):
        c.m.allocate(VGPU, [share_id(G0, 0)])
    assert not c.m.pending_keys()


def test_a_container_refused_for_a_pod_not_seen_yet_is_set_up_once_it_is(
    tmp_path: Path,
) -> None:
    """The daemon's pod watch may lag (its API server restarted): a container whose pod it
    has not seen is refused for now, not for its life."""
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(8 * GIB))])
    c.m.allocate(VGPU, [share_id(G0, 0)])
    key = allocation_key(VGPU, [share_id(G0, 0)])
    held = [Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),))]
    seen = c.pods.pop()
    c.m.resolve(held)
    assert c.writer.read(key).state == "refused"
    assert "pod ns/a not found" in c.writer.read(key).reason
    generation = c.writer.read(key).generation
    c.m.resolve(held)
    assert c.writer.read(key).generation == generation  # the same reason: not rewritten
    c.pods.append(seen)
    c.m.resolve(held)
    assert c.writer.read(key).state == "ready" and c.writer.read(key).entries[0].memory == 8 * GIB


def test_allocate_fails_only_when_no_pending_pod_fits(tmp_path: Path) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(90 * GIB))])
    with pytest.raises(AllocateError, match="no pending pod on n1 asking for 1"):
        c.m.allocate(VGPU, [share_id(G0, 0)])
    c.pods.append(pod("b", {"main": {VGPU: 1}}, budget=budget_of(10 * GIB)))
    c.m.allocate(VGPU, [share_id(G0, 0)])  # b fits
    with pytest.raises(AllocateError, match="two shares"):
        c.m.allocate(VGPU, [share_id(G0, 1), share_id(G0, 2)])


def test_pod_without_budget_is_refused_and_stale_pending_is_forgotten(tmp_path: Path) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(GIB))])
    c.m.allocate(VGPU, [share_id(G0, 0)])
    key = allocation_key(VGPU, [share_id(G0, 0)])
    c.pods[0]["metadata"]["annotations"] = {}
    c.m.resolve([Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),))])
    assert c.writer.read(key).state == "refused"
    assert "no tessera.dev/budget annotation" in c.writer.read(key).reason
    assert [e[:2] for e in c.events] == [("a", "main")]
    c.pods.append(pod("b", {"main": {VGPU: 1}}, budget=budget_of(GIB)))
    c.m.allocate(VGPU, [share_id(G0, 1)])  # b's, never shown held by the kubelet
    del c.pods[0]  # a deleted
    c.m.resolve([], now=c.writer.records()[-1].created + 301)
    assert c.writer.records() == []
