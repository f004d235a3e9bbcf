"""Processes in PID namespaces ("containers"), as the real driver sees them: every process is
known by (PID namespace, PID, start time); NVML and nvidia-smi report host PIDs; the driver
frees exactly a dead process's memory, whatever PID it had inside its namespace."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .conftest import Node

WORKLOAD = str(Path(__file__).with_name("workload.py"))
MIB = 1 << 20


def container(node: Node, *args: str) -> subprocess.Popen[str]:
    """A process as PID 1 of a new PID namespace with its own /proc, like a container's."""
    assert os.geteuid() == 0, "needs root for unshare --pid (PID namespaces)"
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, WORKLOAD, *args],
        env=node.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def host_pid(unshare: subprocess.Popen[str]) -> int:
    """The host PID of the workload: unshare's one child."""
    children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
    assert len(children) == 1, children
    return int(children[0])


def test_equal_pids_in_two_pid_namespaces(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    node = make_node("H100-80GB")
    a, b = container(node, "tenant", "1000", "200"), container(node, "tenant", "500", "100")
    try:
        lines = [p.stdout.readline().strip() for p in (a, b)]  # type: ignore[union-attr]
        assert lines == ["ready 1", "ready 1"], (lines, a.stderr, b.stderr)  # equal PIDs
        ha, hb = host_pid(a), host_pid(b)
        nv = nvml(node)
        dev = nv.nvmlDeviceGetHandleByIndex(0)
        procs = {p.pid: p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(dev)}
        assert procs == {ha: 1000 * MIB, hb: 500 * MIB}  # host PIDs, each its own memory
        time.sleep(0.25)  # let the 100 ms sample periods holding their kernels close
        samples = {s.pid: s.smUtil for s in nv.nvmlDeviceGetProcessUtilization(dev, 0)}
        assert set(samples) == {ha, hb} and all(samples.values()), samples
        out = node.smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader")
        assert sorted(out.stdout.splitlines()) == sorted([f"{ha}, 1000 MiB", f"{hb}, 500 MiB"])
        os.kill(ha, signal.SIGKILL)  # the container's PID 1: its namespace goes with it
        a.wait(timeout=30)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and nv.nvmlDeviceGetMemoryInfo(dev).used != 500 * MIB:
            time.sleep(0.05)
        assert nv.nvmlDeviceGetMemoryInfo(dev).used == 500 * MIB  # exactly a's memory freed
        procs = {p.pid: p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(dev)}
        assert procs == {hb: 500 * MIB}
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_a_container_process_and_a_host_process_with_its_pid(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    """PID 1 inside a container is not the host's PID 1: reaping from the host (whose PID 1
    is alive) or from the container (whose PID 1 is the workload) must tell them apart."""
    node = make_node("H100-80GB")
    a = container(node, "tenant", "300", "10")
    try:
        assert a.stdout.readline().strip() == "ready 1"  # type: ignore[union-attr]
        ha = host_pid(a)
        nv = nvml(node)
        dev = nv.nvmlDeviceGetHandleByIndex(0)
        for _ in range(3):  # every query reaps: the live container process is kept
            assert nv.nvmlDeviceGetMemoryInfo(dev).used == 300 * MIB
        assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(dev)] == [ha]
    finally:
        a.kill()
        a.wait()
