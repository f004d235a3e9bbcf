"""Fault injection: env var (this process) and shared table (every process of the node)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from .conftest import Node

WORKLOAD = str(Path(__file__).with_name("workload.py"))


def test_env_faults_fail_the_next_calls(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB")
    env = dict(node.env, TESSERA_SIM_FAULTS="cuMemGetInfo_v2:1:999")
    r = subprocess.run([sys.executable, WORKLOAD, "info"], env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "meminfo failed: 999"
    env = dict(node.env, TESSERA_SIM_FAULTS="cuInit:1:3")
    r = subprocess.run([sys.executable, WORKLOAD, "info"], env=env, capture_output=True, text=True)
    assert r.stdout.strip() == "cuInit failed: 3"


def test_shared_faults_reach_other_processes(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB")
    set_fault = [sys.executable, "-m", "tessera_sim", "fault"]
    fault = ["--fn", "nvmlDeviceGetCount_v2", "--count", "1", "--code", "19"]
    r = subprocess.run([*set_fault, *fault],
                       env=node.env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = node.smi("-L")
    assert (r.returncode, r.stdout.strip()) == (19, "In use by another client")
    assert node.smi("-L").returncode == 0  # only the next call
    # Slow calls: delay without failing.
    subprocess.run([*set_fault, "--fn", "nvmlDeviceGetCount_v2", "--count", "1", "--delay-us",
                    "300000"], env=node.env, check=True)
    t0 = time.monotonic()
    assert node.smi("-L").returncode == 0
    assert time.monotonic() - t0 >= 0.3
