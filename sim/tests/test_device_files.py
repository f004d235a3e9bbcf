"""The node's device files and what a container sees through them (README.md, "Device files
and visibility"): the driver's files and capability table on the node; nvidia-smi, NVML and
CUDA with TESSERA_SIM_DEV naming a directory that holds only some of them."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from .conftest import Node
from .test_multiprocess import start, wait_line

WORKLOAD = str(Path(__file__).with_name("workload.py"))
QUERY = ("--query-gpu=index,uuid,pci.bus_id,memory.total", "--format=csv,noheader,nounits")


def mig_minors(node: Node) -> dict[str, int]:
    text = (node.path.parent / "proc/driver/nvidia-caps/mig-minors").read_text()
    return {name: int(minor) for name, minor in (line.split() for line in text.splitlines())}


def uuids(node: Node, prefix: str) -> list[str]:
    return [w.rstrip(")") for w in node.smi("-L").stdout.split() if w.startswith(prefix)]


def mig_ids(node: Node) -> dict[str, tuple[int, int, int]]:
    """MIG UUID -> (GPU index, GI ID, CI ID), from the host's default table and -L."""
    rows = re.findall(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+\d+\s+\|", node.smi().stdout, re.M)
    return dict(zip(uuids(node, "MIG-"), ((int(g), int(gi), int(ci)) for g, gi, ci in rows),
                    strict=True))


@pytest.fixture
def container(tmp_path: Path) -> Iterator[Callable[..., Node]]:
    """A container's view of a node: ``view(node, gpus, migs)`` is a copy of ``node`` whose
    processes have only the device files of the GPU indices ``gpus`` and of the MIG devices
    ``migs`` (UUIDs; their GPU's file too), as tessera's device plugin mounts them."""
    counter = iter(range(100))

    def view(node: Node, gpus: tuple[int, ...] = (), migs: tuple[str, ...] = ()) -> Node:
        dev = tmp_path / f"dev{next(counter)}"
        (dev / "nvidia-caps").mkdir(parents=True)
        minors, ids = mig_minors(node), mig_ids(node) if migs else {}
        names = [f"nvidia{g}" for g in gpus]
        for m in migs:
            g, gi, ci = ids[m]
            names += [f"nvidia{g}", f"nvidia-caps/nvidia-cap{minors[f'gpu{g}/gi{gi}/access']}",
                      f"nvidia-caps/nvidia-cap{minors[f'gpu{g}/gi{gi}/ci{ci}/access']}"]
        for name in names:
            assert (node.path.parent / "dev" / name).exists(), name  # the node has it
            (dev / name).touch()
        inside = Node(node.path)
        inside.env["TESSERA_SIM_DEV"] = str(dev)
        return inside

    yield view


def cuda(node: Node, cvd: str | None = None) -> str:
    env = dict(node.env)
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    r = subprocess.run([sys.executable, WORKLOAD, "info"], env=env, capture_output=True,
                       text=True, timeout=60)
    return r.stdout.strip()


def test_the_node_has_its_gpus_files_and_the_drivers_capability_table(
    make_node: Callable[..., Node]
) -> None:
    node = make_node("H100-80GB", "A100-40GB:mig")
    assert node.smi("-L").returncode == 0  # the node starts
    root = node.path.parent
    assert sorted(p.name for p in (root / "dev").glob("nvidia?")) == ["nvidia0", "nvidia1"]
    lines = (root / "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    # the driver's table: config, monitor, then 32 GPUs x 15 GPU instances x (GI + 8 CIs)
    assert lines[:4] == ["config 1", "monitor 2", "gpu0/gi0/access 3", "gpu0/gi0/ci0/access 4"]
    assert len(lines) == 2 + 32 * 15 * 9
    minors = mig_minors(node)
    assert minors["gpu0/gi1/access"] == 12 and minors["gpu0/gi1/ci0/access"] == 13
    assert minors["gpu3/gi3/ci3/access"] == 439 and minors["gpu31/gi14/ci7/access"] == 4322
    assert not (root / "dev/nvidia-caps").exists()  # no instance yet
    assert node.smi("mig", "-i", "1", "-cgi", "1g.5gb", "-C").returncode == 0
    (gpu, gi, ci), = mig_ids(node).values()
    made = sorted(p.name for p in (root / "dev/nvidia-caps").iterdir())
    assert made == sorted(f"nvidia-cap{minors[c]}" for c in (
        f"gpu{gpu}/gi{gi}/access", f"gpu{gpu}/gi{gi}/ci{ci}/access"))


def test_one_gpu_of_two(make_node: Callable[..., Node], container: Callable[..., Node]
                        ) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    host = node.smi(*QUERY).stdout.splitlines()
    gpu1 = host[1].split(", ")
    inside = container(node, gpus=(1,))
    assert inside.smi("-L").stdout == f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {gpu1[1]})\n"
    assert inside.smi(*QUERY).stdout.splitlines() == [", ".join(["0", *gpu1[1:]])]
    table = inside.smi().stdout
    blocks = re.findall(r"^\|\s+(\d+)\s+(NVIDIA [^|]*?)\s+N/A \| (\S+)", table, re.M)
    assert blocks == [("0", "NVIDIA A100-SXM4-40GB", gpu1[2])], table
    assert "0MiB / 40960MiB" in table and "81559MiB" not in table
    assert cuda(inside).endswith(" NVIDIA A100-SXM4-40GB")
    assert cuda(inside).startswith("1 ")
    # CUDA_VISIBLE_DEVICES still works, within what the container sees
    assert cuda(inside, "0").startswith("1 ") and cuda(inside, gpu1[1]).startswith("1 ")
    assert cuda(inside, "1") == "cuInit failed: 100"  # CUDA_ERROR_NO_DEVICE
    assert cuda(inside, host[0].split(", ")[1]) == "cuInit failed: 100"


@pytest.fixture
def three_instances(make_node: Callable[..., Node]) -> tuple[Node, list[str]]:
    """An H100 and an A100 with three 1g.5gb instances: the node and the MIG UUIDs."""
    node = make_node("H100-80GB", "A100-40GB:mig")
    assert node.smi("mig", "-i", "1", "-cgi", "1g.5gb,1g.5gb,1g.5gb", "-C").returncode == 0
    migs = uuids(node, "MIG-")
    assert len(migs) == 3
    return node, migs


def test_one_mig_instance_of_several(three_instances: tuple[Node, list[str]],
                                     container: Callable[..., Node]) -> None:
    node, migs = three_instances
    a100 = uuids(node, "GPU-")[1]
    _, gi, ci = mig_ids(node)[migs[1]]
    inside = container(node, migs=(migs[1],))
    assert inside.smi("-L").stdout.splitlines() == [
        f"GPU 0: NVIDIA A100-SXM4-40GB (UUID: {a100})",
        f"  MIG 1g.5gb       Device  0: (UUID: {migs[1]})"]
    assert [r.split(", ")[:2] for r in inside.smi(*QUERY).stdout.splitlines()] == [["0", a100]]
    table = inside.smi().stdout
    assert re.findall(r"^\|\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+\|\s+(\S+) / (\S+)", table,
                      re.M) == [("0", str(gi), str(ci), "0", "0MiB", "4864MiB")], table
    assert cuda(inside) == f"1 {4864 << 20} {4864 << 20} NVIDIA A100-SXM4-40GB MIG 1g.5gb"
    assert cuda(inside, migs[0]) == "cuInit failed: 100"  # another container's instance
    # processes: only those on the container's instance, whoever runs them
    procs = []
    for uuid, mib in ((migs[0], "300"), (migs[1], "200")):
        node.env["CUDA_VISIBLE_DEVICES"] = uuid
        procs.append(start(node, "hold", mib))
    try:
        assert [wait_line(p) for p in procs] == ["alloc 0", "alloc 0"]
        apps = ("--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits")
        assert len(node.smi(*apps).stdout.splitlines()) == 2
        assert inside.smi(*apps).stdout.splitlines() == [f"{procs[1].pid}, 200"]
        rows = re.findall(r"^\|\s+0\s+(\d+)\s+(\d+)\s+(\d+)\s+C ", inside.smi().stdout, re.M)
        assert rows == [(str(gi), str(ci), str(procs[1].pid))]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_two_mig_instances(three_instances: tuple[Node, list[str]],
                           container: Callable[..., Node]) -> None:
    node, migs = three_instances
    inside = container(node, migs=(migs[0], migs[2]))
    assert [line.split("UUID: ")[1].rstrip(")") for line in inside.smi("-L").stdout.splitlines()
            ] == [uuids(node, "GPU-")[1], migs[0], migs[2]]
    assert "Device  1:" in inside.smi("-L").stdout  # re-indexed
    table = inside.smi().stdout
    assert len(re.findall(r"^\|\s+0\s+\d+\s+\d+\s+[01]\s+\|", table, re.M)) == 2, table
    # CUDA enumerates one MIG device, the first it sees; CUDA_VISIBLE_DEVICES picks another
    assert cuda(inside).endswith("MIG 1g.5gb") and cuda(inside).startswith("1 ")
    assert cuda(inside, migs[2]).startswith("1 ")
    assert cuda(inside, migs[1]) == "cuInit failed: 100"
