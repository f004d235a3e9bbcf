"""nvidia-smi in C (tools/smi/, the installed ``bin/nvidia-smi``) against the Python
reference (tessera_sim/smi.py, ``bin/nvidia-smi-py``): the same commands on two identical
simulated nodes, byte for byte, exit status included."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest

from tessera_sim import BIN_DIR

from .conftest import Node

GPUS = ("H100-80GB:mig", "A100-40GB", "A30-24GB:mig")

# Each step runs on both nodes, in order: listings, then changes, then listings again.
STEPS: list[tuple[str, ...]] = [
    ("-L",),
    ("--query-gpu=index,name,uuid,pci.bus_id,pci.device_id,driver_version,memory.total,"
     "memory.used,memory.free,utilization.gpu,mig.mode.current,mig.mode.pending,compute_cap,"
     "count", "--format=csv"),
    ("-i", "1", "--query-gpu=memory.total,pci.bus_id", "--format=csv,noheader,nounits"),
    ("--query-gpu=bogus", "--format=csv"),
    ("--query-gpu=index",),
    ("--query-gpu=index", "--format=csv,"),
    ("mig", "-lgip"),
    ("mig", "-lgipp"),
    ("mig", "-lgi"),
    ("mig", "-lci"),
    ("mig", "-i", "0", "-cgi", "9,19:6", "-C"),
    ("mig", "-i", "2", "-cgi", "1g.6gb,14"),
    ("mig", "-i", "2", "-gi", "1,2", "-cci"),
    ("mig", "-i", "0", "-cgi", "0"),
    ("mig", "-i", "0", "-cgi", "nonsense"),
    ("-L",),
    ("mig", "-lgi"),
    ("mig", "-lci"),
    ("mig", "-lcip"),
    ("mig", "-lgip"),
    ("mig", "-i", "0", "-gi", "1", "-dci"),
    ("mig", "-i", "0", "-gi", "1", "-dgi"),
    ("mig", "-i", "0", "-gi", "42", "-dgi"),
    ("mig", "-i", "2", "-gi", "2", "-ci", "0", "-lci"),
    ("mig", "-lgi"),
    ("-i", "1", "-mig", "1"),
    ("-i", "1", "--query-gpu=mig.mode.current,mig.mode.pending", "--format=csv"),
    ("-i", "7", "-L"),
    ("-i", "GPU-nothing", "--query-gpu=index", "--format=csv"),
    ("mig",),
    ("bogus",),
    ("--query-compute-apps=pid,used_gpu_memory", "--format=csv"),
]


def run(tool: str, node: Node, args: tuple[str, ...]) -> tuple[int, str]:
    r = subprocess.run([str(BIN_DIR / tool), *args], env=node.env, capture_output=True,
                       text=True, timeout=60, check=False)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("gpus", [GPUS, ("H100-80GB",)])
def test_same_output(make_node: Callable[..., Node], gpus: tuple[str, ...]) -> None:
    py, c = make_node(*gpus), make_node(*gpus)
    for args in STEPS:
        assert run("nvidia-smi", c, args) == run("nvidia-smi-py", py, args), args


def test_default_table(make_node: Callable[..., Node]) -> None:
    node = make_node(*GPUS)
    assert run("nvidia-smi", node, ("mig", "-i", "0", "-cgi", "19", "-C"))[0] == 0
    rc, out = run("nvidia-smi", node, ())
    lines = out.splitlines()
    assert rc == 0
    assert "Driver Version:" in lines[2] and "CUDA Version:" in lines[2]
    assert all(len(ln) == 89 for ln in lines[1:] if ln.startswith(("|", "+"))), out
    assert sum("  NVIDIA " in ln for ln in lines) == 3  # one block per GPU
    assert " MIG devices:" in out and "No running processes found" in out
    assert "0MiB / 81559MiB" in out  # the H100's block: memory used / total
