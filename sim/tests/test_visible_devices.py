"""CUDA_VISIBLE_DEVICES as the real driver reads it, and CUDA on a MIG instance."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from .conftest import Node

WORKLOAD = str(Path(__file__).with_name("workload.py"))


def info(node: Node, cvd: str | None) -> tuple[int, int, str] | str:
    env = dict(node.env)
    if cvd is not None:
        env["CUDA_VISIBLE_DEVICES"] = cvd
    r = subprocess.run([sys.executable, WORKLOAD, "info"], env=env, capture_output=True,
                       text=True, timeout=60)
    if r.returncode != 0:
        return r.stdout.strip()
    n, total, _free, name = r.stdout.strip().split(" ", 3)
    return int(n), int(total) >> 20, name


def test_indices_and_uuids(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    uuids = node.smi("--query-gpu=uuid", "--format=csv,noheader").stdout.split()
    assert info(node, None) == (2, 81559, "NVIDIA H100 80GB HBM3")
    assert info(node, "1") == (1, 40960, "NVIDIA A100-SXM4-40GB")
    assert info(node, "1,0") == (2, 40960, "NVIDIA A100-SXM4-40GB")
    assert info(node, "1,7,0")[:2] == (1, 40960)  # stops at the first invalid entry
    assert info(node, uuids[1][:12]) == (1, 40960, "NVIDIA A100-SXM4-40GB")  # unique prefix
    assert info(node, "") == "cuInit failed: 100"  # CUDA_ERROR_NO_DEVICE
    assert info(node, "GPU-nope") == "cuInit failed: 100"


def test_cuda_on_a_mig_instance(make_node: Callable[..., Node]) -> None:
    node = make_node("A100-40GB:mig")
    assert node.smi("mig", "-cgi", "3g.20gb,1g.5gb", "-C").returncode == 0
    lines = node.smi("-L").stdout.splitlines()
    mig_uuids = [line.split("UUID: ")[1].rstrip(")") for line in lines[1:]]
    assert len(mig_uuids) == 2
    # A MIG device is its GPU instance: memory and SMs of the profile.
    n, mib, name = info(node, mig_uuids[1])  # type: ignore[misc]
    assert (n, name) == (1, "NVIDIA A100-SXM4-40GB MIG 1g.5gb")
    assert mib == 4864
    # Without CUDA_VISIBLE_DEVICES one MIG device is enumerated, the first.
    assert info(node, None)[2] == "NVIDIA A100-SXM4-40GB MIG 3g.20gb"  # type: ignore[index]
