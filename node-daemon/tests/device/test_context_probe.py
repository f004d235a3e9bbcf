"""The context probe measures what one context holds, on a GPU and on a MIG instance of the
simulated node (whose contexts cost ``context_mib``), from NVML's per-process figure."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tessera_node.device.context_probe import ProbeError, context_bytes
from tessera_sim import BIN_DIR, LIB_DIR
from tessera_sim.node import GPUSpec, write_node

MIB = 1 << 20


def node_env(tmp: Path, *gpus: str) -> dict[str, str]:
    assert (LIB_DIR / "libcuda.so.1").exists(), "simulator not built (make sim)"
    path = write_node(tmp / "node.conf", [GPUSpec.parse(g) for g in gpus], context_mib=300)
    env = dict(os.environ)
    env.update(TESSERA_SIM_NODE=str(path), LD_LIBRARY_PATH=str(LIB_DIR))
    return env


def smi(env: dict[str, str], *args: str) -> str:
    r = subprocess.run([str(BIN_DIR / "nvidia-smi"), *args], env=env, capture_output=True,
                       text=True, check=True)
    return r.stdout


def test_context_bytes_of_a_gpu_and_a_mig_instance(tmp_path: Path) -> None:
    env = node_env(tmp_path, "H100-80GB", "A100-40GB:mig")
    smi(env, "mig", "-i", "1", "-cgi", "1g.5gb", "-C")
    listing = smi(env, "-L")
    gpu = re.findall(r"UUID: (GPU-[0-9a-f-]+)", listing)[0]
    (mig,) = re.findall(r"UUID: (MIG-[0-9a-f-]+)", listing)
    assert context_bytes(gpu, env=env) == 300 * MIB
    assert context_bytes(mig, env=env) == 300 * MIB
    # the probe is gone, and its context with it
    assert smi(env, "--query-compute-apps=pid", "--format=csv,noheader").strip() == ""


def test_a_device_that_is_not_there_is_one_clear_error(tmp_path: Path) -> None:
    env = node_env(tmp_path, "H100-80GB")
    with pytest.raises(ProbeError, match=r"context probe on GPU-0000.*cuInit failed") as caught:
        context_bytes("GPU-00000000-0000-0000-0000-000000000000", env=env)
    assert "\n" not in str(caught.value)
