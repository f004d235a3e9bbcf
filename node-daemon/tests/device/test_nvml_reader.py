"""NvmlReader on the simulated node (in a child process: NVML is process-global state)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tessera_sim import BUILD_DIR
from tessera_sim.node import GPUSpec, write_node

READ = """
import json, sys
from tessera_node.device.nvml import DeviceError, NvmlReader
r = NvmlReader(sys.argv[1])
try:
    s = r.read()
except DeviceError as e:
    print(json.dumps({"error": str(e)})); raise SystemExit
print(json.dumps({"gpus": [[g.index, g.name, g.mig_mode, [[i.profile, i.start, i.gi_id,
    i.uuid[:4], i.memory_total_bytes] for i in g.instances], len(g.profiles)] for g in s.gpus]}))
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
        [0, "NVIDIA A100-SXM4-40GB", "enabled", [["3g.20gb", 4, 2, "MIG-", 20096 << 20]], 7],
        [1, "NVIDIA A30", "disabled", [], 0]]


def test_a_failing_nvml_or_a_missing_library_is_an_error_that_says_so(tmp_path: Path) -> None:
    node = write_node(tmp_path / "n.conf", [GPUSpec.parse("H100-80GB")])
    got = read(node, TESSERA_SIM_FAULTS="nvmlDeviceGetMemoryInfo:1:999")
    assert got == {"error": "NVML: Unknown Error"}
    got = read(node, driver_root=str(tmp_path))
    assert "no libnvidia-ml.so.1 below driver root" in str(got["error"])
