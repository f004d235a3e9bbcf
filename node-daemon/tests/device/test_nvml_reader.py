"""NvmlReader on the simulated node (in a child process: NVML is process-global state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tessera_sim import BUILD_DIR
from tessera_sim.node import GPUSpec, Topology, write_node

READ = """
import json, sys
from tessera_node.device.nvml import DeviceError, NvmlReader
r = NvmlReader(sys.argv[1])
try:
    s = r.read()
except DeviceError as e:
    print(json.dumps({"error": str(e)})); raise SystemExit
print(json.dumps({"gpus": [[g.index, g.minor, g.name, g.mig_mode, [[i.profile, i.start,
    i.gi_id, i.ci_id, i.uuid[:4], i.memory_total_bytes] for i in g.instances],
    len(g.profiles)] for g in s.gpus]}))
"""


def read(node: Path, driver_root: str = str(BUILD_DIR), **env: str) -> dict[str, object]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", READ, driver_root], capture_output=True, text=True, timeout=60,
        env={**os.environ, "TESSERA_SIM_NODE": str(node), **env,
             "PYTHONPATH": os.pathsep.join([str(root / "operator"), str(root / "node-daemon"),
                                            str(root / "sim")])})
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_reads_gpus_and_mig_instances_from_the_driver_root(tmp_path: Path) -> None:
    node = write_node(tmp_path / "n.conf", [GPUSpec.parse("A100-40GB:mig"),
                                            GPUSpec.parse("A30-24GB")])
    smi = subprocess.run([str(BUILD_DIR / "bin/nvidia-smi"), "mig", "-i", "0", "-cgi",
                          "3g.20gb", "-C"], env={**os.environ, "TESSERA_SIM_NODE": str(node)},
                         capture_output=True, text=True)
    assert smi.returncode == 0, smi.stdout
    got = read(node)
    assert got["gpus"] == [
        [0, 0, "NVIDIA A100-SXM4-40GB", "enabled", [["3g.20gb", 4, 2, 0, "MIG-", 20096 << 20]],
         7],
        [1, 1, "NVIDIA A30", "disabled", [], 0]]


def test_a_failing_nvml_or_a_missing_library_is_an_error_that_says_so(tmp_path: Path) -> None:
    node = write_node(tmp_path / "n.conf", [GPUSpec.parse("H100-80GB")])
    got = read(node, TESSERA_SIM_FAULTS="nvmlDeviceGetMemoryInfo:1:999")
    assert got == {"error": "NVML: Unknown Error"}
    got = read(node, driver_root=str(tmp_path))
    assert "no libnvidia-ml.so.1 below driver root" in str(got["error"])


TOPOLOGY = """
import json, logging, sys
from tessera_node.device.nvml import NvmlReader
logging.basicConfig(level=logging.WARNING, format="LOG %(message)s %(field)s")
r = NvmlReader(sys.argv[1])
for _ in range(2):  # a failing read is said once
    s = r.read()
print(json.dumps([[g.uuid, g.pci_bus_id, g.numa_node, list(g.nvlink_peers)] for g in s.gpus]))
"""


def read_topology(node: Path, **env: str) -> tuple[list[list[object]], str]:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", TOPOLOGY, str(BUILD_DIR)], capture_output=True, text=True,
        timeout=60, env={**os.environ, "TESSERA_SIM_NODE": str(node), **env,
                         "PYTHONPATH": os.pathsep.join([str(root / "node-daemon"),
                                                        str(root / "sim")])})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


def test_reads_numa_nodes_bus_ids_and_nvlink_peers(tmp_path: Path) -> None:
    node = write_node(tmp_path / "n.conf", [GPUSpec.parse("H100-80GB")] * 4 +
                      [GPUSpec.parse("A100-40GB")],
                      Topology.parse("0-1,2-3:4", "0,0,1,1,1", 5))
    got, log = read_topology(node)
    uuids = [g[0] for g in got]
    assert [g[1:] for g in got] == [
        ["00000000:17:00.0", 0, [uuids[1]]], ["00000000:27:00.0", 0, [uuids[0]]],
        ["00000000:37:00.0", 1, [uuids[3]]], ["00000000:47:00.0", 1, [uuids[2]]],
        ["00000000:57:00.0", 1, []]]
    assert "LOG" not in log


def test_a_failing_topology_read_leaves_the_field_unknown_and_is_said_once(
        tmp_path: Path) -> None:
    node = write_node(tmp_path / "n.conf", [GPUSpec.parse("H100-80GB")] * 2,
                      Topology.parse("0-1", "1,1", 2))
    got, log = read_topology(node, TESSERA_SIM_FAULTS="nvmlDeviceGetMemoryAffinity:-1:999,"
                             "nvmlDeviceGetNvLinkRemotePciInfo_v2:1:999")
    assert [g[2] for g in got] == [None, None]  # NUMA unknown on every read
    # GPU 0's links failed on the first read only (printed: the second); each (GPU, field)
    # said once over the two reads, and nothing else was lost
    assert [g[3] for g in got] == [[got[1][0]], [got[0][0]]]
    assert [g[1] for g in got] == ["00000000:17:00.0", "00000000:27:00.0"]
    assert log.count("GPU topology unknown numaNode") == 2
    assert log.count("GPU topology unknown nvlinkPeers") == 1
