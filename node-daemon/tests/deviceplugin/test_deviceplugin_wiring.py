"""The device plugin's wiring in tessera-node: libtessera's versioned install, the flags, what
the service advertises through NVML failures and MIG withdrawals, and the registry of the
containers it set up."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from test_deviceplugin_devices import G0, G1, M0, M1, SNAP
from test_deviceplugin_matching import Cycle, budget_of, pod

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, VGPU
from tessera.kube.health import Health
from tessera_node.cli import build_parser, options
from tessera_node.container import library
from tessera_node.container.response import LIB_NAME, PRELOAD_NAME, preload_line
from tessera_node.deviceplugin.devices import HEALTHY, UNHEALTHY, Unit, share_id
from tessera_node.deviceplugin.manager import NodeState
from tessera_node.deviceplugin.matcher import ContainerRef, Held, allocation_key, pod_view
from tessera_node.deviceplugin.registry import ContainerRegistry
from tessera_node.deviceplugin.server import AllocateError
from tessera_node.deviceplugin.service import DevicePlugin
from tessera_node.settings import Options

GIB = 1 << 30
ELF = b"\x7fELF" + b"\0" * 60


def test_libtessera_is_installed_once_per_version_and_never_rewritten(tmp_path: Path) -> None:
    src = tmp_path / "libtessera.so"
    src.write_bytes(ELF + b"v1")
    first = library.install(src, tmp_path / "lib")
    assert first.name == library.version_of(ELF + b"v1")
    assert (first / LIB_NAME).read_bytes() == ELF + b"v1"
    assert (first / PRELOAD_NAME).read_text() == preload_line()
    assert (first / LIB_NAME).stat().st_mode & 0o222 == 0  # read-only
    inode = (first / LIB_NAME).stat().st_ino
    assert library.install(src, tmp_path / "lib") == first
    assert (first / LIB_NAME).stat().st_ino == inode  # the mapped file is left alone
    src.write_bytes(ELF + b"v2")  # an upgrade: a new directory beside the old one
    second = library.install(src, tmp_path / "lib")
    assert second != first and (first / LIB_NAME).read_bytes() == ELF + b"v1"
    assert sorted(p.name for p in (tmp_path / "lib").iterdir()) == sorted([first.name,
                                                                          second.name])


@pytest.mark.parametrize(("content", "error"), [
    (None, "libtessera not readable at"),
    (b"#!/bin/sh\n", "is not a shared library"),
])
def test_libtessera_that_cannot_be_installed_is_an_error(
    tmp_path: Path, content: bytes | None, error: str
) -> None:
    src = tmp_path / "libtessera.so"
    if content is not None:
        src.write_bytes(content)
    with pytest.raises(library.LibraryError, match=error):
        library.install(src, tmp_path / "lib")


def test_a_version_directory_with_other_content_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "libtessera.so"
    src.write_bytes(ELF)
    target = library.install(src, tmp_path / "lib")
    (target / LIB_NAME).chmod(0o644)
    (target / LIB_NAME).write_bytes(ELF + b"tampered")
    with pytest.raises(library.LibraryError, match="holds another library"):
        library.install(src, tmp_path / "lib")


@pytest.mark.parametrize(("args", "error"), [
    (["--device-visibility", "nvidia"], "--device-visibility must be one of"),
    (["--share-policy", "random"], "--share-policy must be one of"),
    (["--device-visibility", "sim"], "--device-visibility sim needs --sim-node"),
    (["--shares-per-unit", "0"], "--shares-per-unit must be at least 1"),
    (["--budget-wait", "500"], "--budget-wait must be 0 to 120"),
])
def test_bad_device_plugin_flags_are_refused(
    args: list[str], error: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TESSERA_SIM_NODE", raising=False)
    with pytest.raises(ValueError, match=error):
        options(build_parser().parse_args(["run", "--node-name", "n1", *args]))


def test_device_plugin_flags() -> None:
    opts = options(build_parser().parse_args([
        "run", "--node-name", "n1", "--device-visibility", "sim", "--sim-node", "/x/node.conf",
        "--shares-per-unit", "4", "--share-policy", "spread", "--device-plugin", "false"]))
    assert (opts.device_visibility, opts.sim_node, opts.shares_per_unit, opts.share_policy,
            opts.device_plugin) == ("sim", "/x/node.conf", 4, "spread", False)
    assert Options().device_plugin and Options().device_visibility == "volume-mounts"


def service(tmp_path: Path) -> DevicePlugin:
    opts = Options(node_name="n1", state_dir=str(tmp_path), libtessera=str(tmp_path / "l.so"))
    (tmp_path / "l.so").write_bytes(ELF)
    kube: Any = None  # never called here
    svc = DevicePlugin(kube, opts, Health(stuck_after_s=60), lambda: None, ContainerRegistry())
    svc._prepare()
    return svc


def health_of(svc: DevicePlugin) -> dict[str, dict[str, str]]:
    m = svc.require_manager()
    return {r: {d.id: d.health for d in devs} for r, devs in m.advertised().items()}


def test_nvml_failing_makes_every_unit_unhealthy_and_recovers(tmp_path: Path) -> None:
    svc = service(tmp_path)
    svc.update(SNAP, {G1: "Shares"}, frozenset({"1g.10gb"}))
    healthy = health_of(svc)
    assert set(healthy[VGPU].values()) == {HEALTHY} and len(healthy[VGPU]) == 30
    assert healthy["tessera.dev/mig-1g.10gb"] == {}  # shared: the whole resource stays empty
    svc.update(None, {G1: "Shares"}, frozenset({"1g.10gb"}))
    assert set(health_of(svc)[VGPU].values()) == {UNHEALTHY}
    svc.update(SNAP, {G1: "Shares"}, frozenset({"1g.10gb"}))
    assert health_of(svc) == healthy


def test_nothing_is_served_or_confirmed_before_the_gpus_are_read(tmp_path: Path) -> None:
    """A restarted daemon must not confirm its running containers' allocations against a
    node with no known units (that refused their budgets: "memory ... is unknown")."""
    svc = service(tmp_path)
    svc.plugins.plugins_dir = str(tmp_path / "kubelet")
    svc.error = None  # as run() leaves it once prepared
    asyncio.run(svc.step())  # kube is None: any API call would fail
    assert svc.plugins.servers == {} and svc.plugins.unregistered == {}
    assert "device plugin: the GPUs not read yet" in svc.not_ready()
    svc.update(SNAP, {}, frozenset())
    assert svc.devices.read_once()
    assert "device plugin: the GPUs not read yet" not in svc.not_ready()


def test_withdrawn_devices_leave_the_lists_until_the_gpu_changed(tmp_path: Path) -> None:
    svc = service(tmp_path)
    svc.update(SNAP, {}, frozenset({"1g.10gb"}))
    assert set(health_of(svc)["tessera.dev/mig-1g.10gb"]) == {M0, M1}
    svc.devices.withdraw(G1, [M0])
    assert set(health_of(svc)["tessera.dev/mig-1g.10gb"]) == {M1}
    svc.devices.withdraw(G0, [G0])  # a mode change takes the whole GPU
    assert share_id(G0, 0) not in health_of(svc)[VGPU]
    svc.devices.changed(G1)
    svc.devices.changed(G0)
    assert set(health_of(svc)["tessera.dev/mig-1g.10gb"]) == {M0, M1}
    assert share_id(G0, 0) in health_of(svc)[VGPU]


def test_the_registry_lists_containers_set_up_until_their_pods_end(tmp_path: Path) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(50 * GIB)),
                         pod("b", {"main": {VGPU: 1}}, budget=budget_of(40 * GIB))])
    c.m.allocate(VGPU, [share_id(G0, 0)])
    c.m.allocate(VGPU, [share_id(G0, 1)])
    assert c.m.registry.snapshot() == []  # pending: not set up yet
    both = [Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),)),
            Held(ContainerRef("ns", "b", "main"), VGPU, (share_id(G0, 1),))]
    c.m.resolve(both)
    a, b = c.m.registry.snapshot()
    assert (a.namespace, a.pod, a.container, a.units, a.gpus) == ("ns", "a", "main", (G0,),
                                                                  (G0,))
    assert a.budget is not None and a.budget.memory_bytes == 50 * GIB and a.refused is None
    assert a.budget_file == str(c.writer.budget_path(allocation_key(VGPU, [share_id(G0, 0)])))
    assert a.ledger_dir.endswith("/run") and a.pod_uid == c.pods[0]["metadata"]["uid"]
    assert b.budget is None and b.refused is not None and "would exceed" in b.refused
    c.pods[0]["status"] = {"phase": "Failed"}
    c.m.resolve(both[1:])
    assert [e.pod for e in c.m.registry.snapshot()] == ["b"]


def test_a_restarted_daemon_counts_the_budgets_already_on_disk(tmp_path: Path) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(50 * GIB))])
    c.m.allocate(VGPU, [share_id(G0, 0)])
    c.m.resolve([Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),))])
    again = Cycle(tmp_path, [pod("b", {"main": {VGPU: 1}}, budget=budget_of(40 * GIB))])
    with pytest.raises(AllocateError, match="no pending pod on n1 asking for 1"):
        again.m.allocate(VGPU, [share_id(G0, 1)])  # 50 + 40 GiB > 80 GiB
    again.pods[0]["metadata"]["annotations"][ANNOTATION_BUDGET] = budget_of(30 * GIB)
    again.m.allocate(VGPU, [share_id(G0, 1)])  # 50 + 30 fits


def test_preferred_allocation_packs_only_onto_units_with_room_for_the_pending_budget(
    tmp_path: Path
) -> None:
    c = Cycle(tmp_path, [pod("a", {"main": {VGPU: 1}}, budget=budget_of(50 * GIB)),
                         pod("b", {"main": {VGPU: 1}}, budget=budget_of(40 * GIB))])
    c.m.update(NodeState(units=[Unit(G0, G0, 0, None, 80 * GIB, True),
                                Unit(G1, G1, 1, None, 80 * GIB, True)]))
    c.m.allocate(VGPU, [share_id(G0, 0)])
    c.m.resolve([Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),))])
    free = [share_id(u, k) for u in (G0, G1) for k in range(4) if (u, k) != (G0, 0)]
    plugin = c.m.resource(VGPU)
    # pack alone prefers G0 (in use, fewer free shares), but 50 + 40 GiB do not fit there
    assert plugin.preferred(free, [], 1) == [share_id(G1, 0)]
    c.pods[1]["metadata"]["annotations"][ANNOTATION_BUDGET] = budget_of(20 * GIB)
    assert plugin.preferred(free, [], 1) == [share_id(G0, 1)]  # it fits: pack onto G0
    c.pods[1]["metadata"]["annotations"][ANNOTATION_BUDGET] = budget_of(90 * GIB)
    assert plugin.preferred(free, [], 1) == [share_id(G0, 1)]  # fits nowhere: the policy's


def test_nothing_is_resolved_before_the_gpus_are_read(tmp_path: Path) -> None:
    """A restarted daemon knows its pods before its GPUs: checking its running containers'
    budgets against no devices would refuse them all, so it waits for the first read."""
    import asyncio

    svc = service(tmp_path)
    listed: list[int] = []
    svc.pods.health.synced = lambda name: True  # type: ignore[method-assign]

    def ask(manager: Any) -> list[Held]:
        listed.append(1)
        return []

    svc.held.ask = ask  # type: ignore[method-assign]
    asyncio.run(svc._confirm(svc.require_manager()))
    assert listed == []  # GPUs not read: no allocation confirmed, none refused
    svc.update(SNAP, {}, frozenset())
    asyncio.run(svc._confirm(svc.require_manager()))
    assert listed == [1]


def test_holders_fail_closed_and_count_allocations_not_confirmed(tmp_path: Path) -> None:
    """The MIG enactor asks which pods hold a unit before it destroys one: before the pod
    watch has listed, nobody can say (an error: every device counts as held); a unit an
    Allocate gave out counts as held until the kubelet shows its pod; then the pod holds it
    as the kubelet said, until the pod ends, without asking the kubelet again (it is asked
    only about pods whose answer can change something: the one pending here)."""
    from tessera_node.deviceplugin.held import UNCONFIRMED
    from tessera_node.deviceplugin.matcher import pod_view

    svc = service(tmp_path)
    svc.update(SNAP, {}, frozenset())
    with pytest.raises(OSError, match="not listed yet"):
        svc.held.holders()
    svc.pods.health.synced = lambda name: True  # type: ignore[method-assign]
    asked: list[list[tuple[str, str]]] = []
    shown: list[Held] = []

    def answers(pods: Any, enough: Any = None) -> dict[tuple[str, str], list[Held]]:
        asked.append(list(pods))
        return {k: [h for h in shown if (h.ref.namespace, h.ref.pod) == k] for k in pods}

    svc.held.podres.answers = answers  # type: ignore[method-assign]
    a = pod("a", {"main": {VGPU: 1}}, budget=budget_of(GIB))
    svc.pods.show((pod_view(a), pod_view(pod("done", {"main": {VGPU: 1}}, phase="Succeeded")),
                   pod_view(pod("cpu-only", {"main": {"cpu": 1}}))))
    assert svc.held.holders() == {}
    asyncio.run(svc._confirm(svc.require_manager()))
    assert asked == []  # nothing pending: nothing to ask
    svc.require_manager().allocate(VGPU, [share_id(G0, 0)])
    assert svc.held.holders() == {G0: [UNCONFIRMED]}
    shown.append(Held(ContainerRef("ns", "a", "main"), VGPU, (share_id(G0, 0),)))
    asyncio.run(svc._confirm(svc.require_manager()))
    assert asked == [[("ns", "a")]]  # not the ended pod, not one without tessera resources
    assert svc.held.holders() == {G0: ["ns/a"]}
    asyncio.run(svc._confirm(svc.require_manager()))
    assert len(asked) == 1  # confirmed: never asked again
    a["status"]["phase"] = "Succeeded"
    svc.pods.show((pod_view(a),))
    assert svc.held.holders() == {}


def test_the_registry_learns_each_containers_runtime_id_from_its_pods_status(
        tmp_path: Path) -> None:
    """A pod with two GPU containers: the audit can hold each process to its own container's
    budget only if the registry knows which runtime ID (named in the process's cgroup) is
    which container. The kubelet writes them in the pod's status once the containers start;
    a new allocation of the same devices forgets the old container before its files change."""
    two = pod("two", {"a": {VGPU: 1}, "b": {VGPU: 1}}, budget=BudgetAnnotation(containers={
        n: PerShareBudget(shares=1, memory_bytes=GIB, cores=10) for n in "ab"
    }).to_annotation())
    c = Cycle(tmp_path, [two])
    c.m.allocate(VGPU, [share_id(G0, 0)])
    c.m.allocate(VGPU, [share_id(G0, 1)])
    c.m.resolve([Held(ContainerRef("ns", "two", "a"), VGPU, (share_id(G0, 0),)),
                 Held(ContainerRef("ns", "two", "b"), VGPU, (share_id(G0, 1),))])
    assert [e.container_id for e in c.m.registry.snapshot()] == [None, None]  # not started
    two["status"]["containerStatuses"] = [
        {"name": n, "state": {"running": {}}, "containerID": f"containerd://{n * 64}"}
        for n in "ab"]
    view = pod_view(two)
    assert view.container_ids == {"a": "a" * 64, "b": "b" * 64}
    c.m.registry.identify({(view.uid, n): i for n, i in view.container_ids.items()})
    assert [(e.container, e.container_id) for e in c.m.registry.snapshot()] == [
        ("a", "a" * 64), ("b", "b" * 64)]
    c.pods[0]["status"]["phase"] = "Succeeded"
    # devices allocated again: the entry goes before the files are replaced
    c.pods.append(pod("next", {"main": {VGPU: 1}}, budget=budget_of(GIB)))
    c.m.allocate(VGPU, [share_id(G0, 0)])
    assert [e.container for e in c.m.registry.snapshot()] == ["b"]
