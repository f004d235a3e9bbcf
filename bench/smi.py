"""The simulator's nvidia-smi: the C tool (``sim/build/bin/nvidia-smi``, what the node daemon
runs) against the Python reference (``bin/nvidia-smi-py``), in the same run.

Two identical simulated nodes of 8 H100-80GB; on each, the node daemon's commands for a MIG
change to seven 1g.10gb per GPU and back (per GPU: ``-mig 1``, one ``-cgi`` with seven
placements, one ``-cci`` for the seven GIs, ``-dci``, ``-dgi``: 40 calls), one tool per node,
the two interleaved command by command so that both see the same machine load. Every call's
output and exit status must be the same on both; prints wall time per call (median, p90,
mean) and the total.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "sim"), str(REPO / "core")]

from tessera_sim import BIN_DIR, LIB_DIR, SIM_DIR  # noqa: E402
from tessera_sim.node import GPUSpec, write_node  # noqa: E402

GPUS = 8
SLOTS = range(7)  # 1g.10gb at each of the H100's seven memory slots
GI_IDS = ",".join(str(7 + s) for s in SLOTS)  # a 1g at slot s has GPU instance ID 7 + s


def commands() -> list[list[str]]:
    cmds: list[list[str]] = []
    for i in range(GPUS):
        cmds.append(["-i", str(i), "-mig", "1"])
    for i in range(GPUS):
        cmds.append(["mig", "-i", str(i), "-cgi", ",".join(f"1g.10gb:{s}" for s in SLOTS)])
        cmds.append(["mig", "-i", str(i), "-gi", GI_IDS, "-cci"])
    for i in range(GPUS):
        cmds.append(["mig", "-i", str(i), "-gi", GI_IDS, "-dci"])
        cmds.append(["mig", "-i", str(i), "-gi", GI_IDS, "-dgi"])
    return cmds


def node_env(path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TESSERA_SIM_NODE"] = str(path)
    env["LD_LIBRARY_PATH"] = str(LIB_DIR)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def timed(tool: str, args: list[str], env: dict[str, str]) -> tuple[float, int, str]:
    started = time.perf_counter()
    r = subprocess.run([str(BIN_DIR / tool), *args], env=env, capture_output=True, text=True,
                       check=False)
    return time.perf_counter() - started, r.returncode, r.stdout + r.stderr


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    subprocess.run(["make", "-s", "-C", str(SIM_DIR), f"PYTHON={sys.executable}"], check=True,
                   stdout=subprocess.DEVNULL)
    spent: dict[str, list[float]] = {"nvidia-smi": [], "nvidia-smi-py": []}
    with tempfile.TemporaryDirectory(prefix="tessera-bench-smi-") as scratch:
        envs = {}
        for tool in spent:
            path = Path(scratch) / f"{tool}.conf"
            write_node(path, [GPUSpec.parse("H100-80GB")] * GPUS, seed="bench")
            envs[tool] = node_env(path)
        for args in commands():
            results = {tool: timed(tool, args, envs[tool]) for tool in spent}
            (c_s, *c_out), (py_s, *py_out) = results["nvidia-smi"], results["nvidia-smi-py"]
            if c_out != py_out or c_out[0] != 0:
                print(f"bench smi: {args}: C {c_out} vs Python {py_out}", file=sys.stderr)
                return 1
            spent["nvidia-smi"].append(c_s)
            spent["nvidia-smi-py"].append(py_s)
    for tool, label in (("nvidia-smi-py", "Python"), ("nvidia-smi", "C")):
        s = [x * 1000 for x in spent[tool]]
        print(f"{label:>6} nvidia-smi, {len(s)} calls: median {statistics.median(s):.1f} ms, "
              f"p90 {pct(s, .9):.1f} ms, mean {statistics.mean(s):.1f} ms, "
              f"total {sum(s) / 1000:.2f} s")
    ratio = statistics.median(spent["nvidia-smi-py"]) / statistics.median(spent["nvidia-smi"])
    print(f"median per call: C is {ratio:.0f}x faster (same run, same load)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
