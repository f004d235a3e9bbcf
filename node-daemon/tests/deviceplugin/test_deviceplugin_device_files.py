"""The device files a container gets with the ``sim`` visibility: a table of containers' units
and their files (the driver's names and capability minors), what Allocate mounts for them,
and the manager choosing them."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_deviceplugin_matching import budget_of, pod

from tessera.api.names import VGPU
from tessera.api.resources import mig_resource_name
from tessera_node.budget.writer import BudgetWriter
from tessera_node.container.device_files import (
    DeviceFilesError,
    container_files,
    parse_mig_minors,
)
from tessera_node.container.response import (
    SIM_DEV_DIR,
    HostPaths,
    SimPaths,
    container_response,
)
from tessera_node.deviceplugin.devices import Unit, share_id
from tessera_node.deviceplugin.manager import Manager, NodeState, PluginConfig
from tessera_node.deviceplugin.matcher import pod_view
from tessera_node.deviceplugin.server import AllocateError
from tessera_node.settings import FORGET_PENDING_S

GIB = 1 << 30
G0, G1, G2 = (f"GPU-{k}0000000-0000-0000-0000-000000000000" for k in range(3))
MA, MB = "MIG-a0000000-0000-0000-0000-000000000000", "MIG-b0000000-0000-0000-0000-000000000000"
MIG_1G = mig_resource_name("1g.10gb")


def driver_table() -> str:
    """mig-minors as the driver writes it: its capabilities numbered in the order of one
    table (NVLink's fabric-mgmt 0, MIG config and monitor, then per GPU and GI ID the GI's
    access followed by its 8 CIs')."""
    lines, minor = ["config 1", "monitor 2"], 3
    for g in range(32):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {minor}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {minor + 1 + ci}" for ci in range(8)]
            minor += 9
    return "\n".join(lines) + "\n"


MINORS = parse_mig_minors(driver_table())
UNITS = [
    Unit(G0, G0, 0, None, 80 * GIB, True, minor=0),
    Unit(G1, G1, 1, None, 80 * GIB, True, minor=1),
    Unit(MA, G2, 2, "1g.10gb", 10 * GIB, True, minor=2, gi_id=13, ci_id=0),
    Unit(MB, G2, 2, "1g.10gb", 10 * GIB, True, minor=2, gi_id=4, ci_id=0),
]


@pytest.mark.parametrize(("case", "units", "files"), [
    ("a whole GPU", [G1], ("nvidia1",)),
    ("a share of a GPU", [G0], ("nvidia0",)),
    ("a MIG instance", [MA], ("nvidia2", "nvidia-caps/nvidia-cap390",
                              "nvidia-caps/nvidia-cap391")),
    ("two GPUs", [G0, G1], ("nvidia0", "nvidia1")),
    ("two instances of one GPU", [MA, MB], ("nvidia2", "nvidia-caps/nvidia-cap390",
                                            "nvidia-caps/nvidia-cap391",
                                            "nvidia-caps/nvidia-cap309",
                                            "nvidia-caps/nvidia-cap310")),
    ("a GPU and an instance", [G1, MB], ("nvidia1", "nvidia2", "nvidia-caps/nvidia-cap309",
                                         "nvidia-caps/nvidia-cap310")),
])
def test_a_containers_device_files(case: str, units: list[str], files: tuple[str, ...]
                                   ) -> None:
    assert container_files(units, UNITS, MINORS) == files, case


@pytest.mark.parametrize(("case", "unit", "minors", "why"), [
    ("minor unknown", Unit(G0, G0, 0, None, GIB, True), MINORS, "minor number"),
    ("no compute instance ID", Unit(MA, G2, 2, "1g.10gb", GIB, True, minor=2, gi_id=13),
     MINORS, "compute instance IDs"),
    ("a table without it", UNITS[2], parse_mig_minors("gpu2/gi13/access 390\n"),
     "gpu2/gi13/ci0/access"),
])
def test_files_that_cannot_be_named(case: str, unit: Unit, minors: dict[str, int],
                                    why: str) -> None:
    with pytest.raises(DeviceFilesError, match=why):
        container_files([unit.uuid], [unit], minors)
    with pytest.raises(DeviceFilesError, match="not a unit"):
        container_files([G2], UNITS, MINORS)


def test_the_drivers_table_is_read_as_it_is_written() -> None:
    assert MINORS["config"] == 1 and MINORS["gpu0/gi1/access"] == 12
    assert MINORS["gpu0/gi1/ci0/access"] == 13 and MINORS["gpu3/gi3/ci3/access"] == 439
    assert len(MINORS) == 2 + 32 * 15 * 9
    assert parse_mig_minors("gpu0/gi0/access 3\nbroken\nx y\n\n") == {"gpu0/gi0/access": 3}


def test_allocate_mounts_exactly_the_files_read_only() -> None:
    paths = HostPaths("/lib/v1", "/c/k/budget", "/c/k/ledger", "/c/managed")
    sim = SimPaths.of("/gpu/lib", "/gpu/node.conf")
    assert (sim.state, sim.dev_dir, sim.mig_minors) == (
        "/gpu/node.conf.state", "/gpu/dev", "/gpu/proc/driver/nvidia-caps/mig-minors")
    files = container_files([MA], UNITS, MINORS)
    r = container_response(paths, [MA], "sim", sim, files)
    devs = [(m.container_path, m.host_path, m.read_only) for m in r.mounts
            if m.container_path.startswith(SIM_DEV_DIR)]
    assert devs == [(f"{SIM_DEV_DIR}/{f}", f"/gpu/dev/{f}", True) for f in files]
    assert r.envs["TESSERA_SIM_DEV"] == SIM_DEV_DIR and "CUDA_VISIBLE_DEVICES" not in r.envs


class SimCycle:
    """The resource manager with the ``sim`` visibility over a node directory."""

    def __init__(self, tmp: Path, pods: list[dict[str, object]]) -> None:
        self.sim = SimPaths.of("/gpu/lib", str(tmp / "node.conf"))
        self.pods = pods
        self.m = Manager(
            PluginConfig(node="n1", shares_per_unit=4, lib_dir="/opt/tessera/lib/v1",
                         visibility="sim", forget_after_s=FORGET_PENDING_S, sim=self.sim),
            BudgetWriter(tmp / "containers", pending_wait_ms=5000),
            lambda: [pod_view(p) for p in self.pods], lambda p, c, why: None)
        self.m.update(NodeState(units=UNITS))

    def devices(self, resource: str, ids: list[str]) -> list[tuple[str, str]]:
        r = self.m.allocate(resource, ids)
        assert r.envs["TESSERA_SIM_DEV"] == SIM_DEV_DIR, r.envs
        return [(m.container_path, m.host_path) for m in r.mounts
                if m.container_path.startswith(SIM_DEV_DIR)]


def test_the_manager_mounts_each_containers_files(tmp_path: Path) -> None:
    table = Path(SimPaths.of("", str(tmp_path / "node.conf")).mig_minors)
    c = SimCycle(tmp_path, [
        pod("a", {"main": {VGPU: 1}}, budget=budget_of(8 * GIB)),
        pod("b", {"main": {VGPU: 1}}, budget=budget_of(8 * GIB)),
        pod("w", {"main": {MIG_1G: 1}}, budget=budget_of(10 * GIB)),
    ])
    with pytest.raises(AllocateError, match="device files"):  # no table yet
        c.devices(VGPU, [share_id(G0, 0)])
    table.parent.mkdir(parents=True)
    table.write_text(driver_table())
    gpu0 = [(f"{SIM_DEV_DIR}/nvidia0", f"{tmp_path}/dev/nvidia0")]
    # two pods on shares of one GPU: the same device file
    assert c.devices(VGPU, [share_id(G0, 0)]) == gpu0
    assert c.devices(VGPU, [share_id(G0, 1)]) == gpu0
    assert [h for _, h in c.devices(MIG_1G, [MA])] == [
        f"{tmp_path}/dev/{f}" for f in ("nvidia2", "nvidia-caps/nvidia-cap390",
                                        "nvidia-caps/nvidia-cap391")]
