"""Topology through pynvml (the binding the node daemon uses): NUMA affinity, the common
ancestor of two GPUs, NVLink state and the far end of each link; the node file's checks."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tessera_sim import SIM_DIR
from tessera_sim.node import NVLINKS_PER_GPU, NvLink, Topology

from .conftest import Node

FOUR = ("H100-80GB",) * 4
PAIRS = Topology.parse("0-1,2-3:2", "0,0,1,1", 4)


def _numa(nv: Any, h: Any) -> int:
    mask = nv.nvmlDeviceGetMemoryAffinity(h, 1, nv.NVML_AFFINITY_SCOPE_NODE)[0]
    return int(mask).bit_length() - 1


def _active(nv: Any, h: Any) -> list[int]:
    return [link for link in range(NVLINKS_PER_GPU)
            if nv.nvmlDeviceGetNvLinkState(h, link) == nv.NVML_FEATURE_ENABLED]


def test_numa_nodes_and_common_ancestor(make_node: Callable[..., Node],
                                        nvml: Callable[[Node], Any]) -> None:
    nv = nvml(make_node(*FOUR, topology=PAIRS))
    h = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    assert [_numa(nv, x) for x in h] == [0, 0, 1, 1]
    socket = nv.nvmlDeviceGetMemoryAffinity(h[3], 2, nv.NVML_AFFINITY_SCOPE_SOCKET)
    assert list(socket) == [2, 0]
    # on PCIe hosts the GPU is no NUMA node of its own: real NVML says NOT_SUPPORTED too
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetNumaNodeId(h[0])
    ancestor = nv.nvmlDeviceGetTopologyCommonAncestor
    assert ancestor(h[0], h[0]) == nv.NVML_TOPOLOGY_INTERNAL
    assert ancestor(h[0], h[1]) == nv.NVML_TOPOLOGY_NODE
    assert ancestor(h[2], h[3]) == nv.NVML_TOPOLOGY_NODE
    assert ancestor(h[1], h[2]) == nv.NVML_TOPOLOGY_SYSTEM
    assert nv.nvmlDeviceGetPciInfo_v3(h[2]).busId == "00000000:37:00.0"


def test_nvlink_state_and_far_ends(make_node: Callable[..., Node],
                                   nvml: Callable[[Node], Any]) -> None:
    nv = nvml(make_node(*FOUR, topology=PAIRS))
    h = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(4)]
    bus = [nv.nvmlDeviceGetPciInfo(x).busId for x in h]
    assert [_active(nv, x) for x in h] == [[0], [0], [0, 1], [0, 1]]
    assert nv.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 0).busId == bus[1]
    assert nv.nvmlDeviceGetNvLinkRemotePciInfo(h[1], 0).busId == bus[0]
    assert [nv.nvmlDeviceGetNvLinkRemotePciInfo(h[3], k).busId for k in (0, 1)] == [bus[2]] * 2
    far = nv.nvmlDeviceGetNvLinkRemotePciInfo(h[2], 1)
    assert far.pciDeviceId == nv.nvmlDeviceGetPciInfo(h[3]).pciDeviceId
    assert far.pciSubSystemId == 0  # not filled, as nvml.h says
    assert nv.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], 0) == nv.NVML_NVLINK_DEVICE_TYPE_GPU
    # an inactive link has no far end; a link index past the last one is invalid
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkRemotePciInfo(h[0], 1)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkRemoteDeviceType(h[0], 5)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetNvLinkState(h[0], NVLINKS_PER_GPU)
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetNvLinkRemotePciInfo(h[0], NVLINKS_PER_GPU)


def test_default_topology_and_all(make_node: Callable[..., Node],
                                  nvml: Callable[[Node], Any]) -> None:
    nv = nvml(make_node("H100-80GB", "A100-40GB"))
    h = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
    assert [_numa(nv, x) for x in h] == [0, 0]
    assert all(nv.nvmlDeviceGetNvLinkState(x, k) == nv.NVML_FEATURE_DISABLED
               for x in h for k in range(NVLINKS_PER_GPU))
    assert nv.nvmlDeviceGetTopologyCommonAncestor(h[0], h[1]) == nv.NVML_TOPOLOGY_NODE
    everyone = Topology.parse("all", "", 3)
    assert everyone.nvlink == (NvLink(0, 1), NvLink(0, 2), NvLink(1, 2))
    assert everyone.links(1) == [0, 2]


def test_mig_devices_have_no_topology(make_node: Callable[..., Node],
                                      nvml: Callable[[Node], Any]) -> None:
    node = make_node("H100-80GB:mig", "H100-80GB", topology=Topology.parse("0-1", "", 2))
    assert node.smi("mig", "-i", "0", "-cgi", "1g.10gb", "-C").returncode == 0
    nv = nvml(node)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(0), 0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetNvLinkState(mig, 0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetMemoryAffinity(mig, 1, nv.NVML_AFFINITY_SCOPE_NODE)


def test_faults_reach_topology_calls(make_node: Callable[..., Node],
                                     nvml: Callable[[Node], Any],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    node = make_node(*FOUR, topology=PAIRS)
    subprocess.run([sys.executable, "-m", "tessera_sim", "fault", "--fn",
                    "nvmlDeviceGetNvLinkState", "--count", "1", "--code", "999"],
                   env=node.env, check=True)
    nv = nvml(node)
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_Unknown):
        nv.nvmlDeviceGetNvLinkState(h, 0)
    assert nv.nvmlDeviceGetNvLinkState(h, 0) == nv.NVML_FEATURE_ENABLED


@pytest.mark.parametrize(("nvlink", "numa", "why"), [
    ("0-0", "", "not two GPUs"),
    ("0-4", "", "not two GPUs"),
    ("0-1,1-0", "", "given twice"),
    ("0-1:19", "", "at most 18"),
    ("0-1:0", "", "at least one link"),
    ("0:1", "", "bad NVLink"),
    ("", "0,1", "2 NUMA nodes given for 4 GPUs"),
    ("", "0,x,0,0", "bad NUMA nodes"),
])
def test_bad_topology_is_refused(nvlink: str, numa: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Topology.parse(nvlink, numa, 4)


def test_cli_topology(tmp_path: Path) -> None:
    out = tmp_path / "n.conf"
    env = dict(os.environ, PYTHONPATH=f"{SIM_DIR}:{os.environ.get('PYTHONPATH', '')}")
    args = [sys.executable, "-m", "tessera_sim", "node", *(["--gpu", "H100-80GB"] * 4),
            "--out", str(out)]
    r = subprocess.run([*args, "--nvlink", "0-1,2-3:2", "--numa", "0,0,1,1"],
                       capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert text.count("numa_node=1") == 2 and "nvlink=3,3\n" in text
    r = subprocess.run([*args, "--nvlink", "0-7"], capture_output=True, text=True, env=env)
    assert r.returncode == 2 and "not two GPUs of 4" in r.stderr


@pytest.mark.parametrize(("edit", "message"), [
    ("nvlink=1\n", "has 1 nvlinks to gpu 1, which has 0 back"),
    ("nvlink=0\n", "nvlink 0 leads to gpu 0, not another GPU"),
    ("nvlink=5\n", "nvlink 0 leads to gpu 5"),
    ("nvlink=" + ",".join(["1"] * 19) + "\n", "bad value"),
    ("numa_node=-1\n", "bad value '-1' for 'numa_node'"),
])
def test_bad_node_file_topology(make_node: Callable[..., Node], edit: str,
                                message: str) -> None:
    node = make_node("H100-80GB", "H100-80GB")
    text = node.path.read_text()
    first = text.index("[gpu]") + len("[gpu]\n")  # into the first GPU's section
    node.path.write_text(text[:first] + edit + text[first:].replace("nvlink=\n", "", 1))
    r = node.smi("-L")
    assert r.returncode != 0
    assert message in r.stderr
