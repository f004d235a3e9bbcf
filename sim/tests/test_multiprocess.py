"""Several processes on one simulated node: shared accounting, SIGKILL, utilisation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from .conftest import Node

WORKLOAD = str(Path(__file__).with_name("workload.py"))
MIB = 1 << 20


def start(node: Node, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, WORKLOAD, *args], env=node.env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def wait_line(p: subprocess.Popen[str]) -> str:
    assert p.stdout is not None
    line = p.stdout.readline().strip()
    assert line, p.stderr.read() if p.stderr else ""
    return line


def run(node: Node, *args: str) -> str:
    r = subprocess.run([sys.executable, WORKLOAD, *args], env=node.env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.strip()


def test_two_processes_share_accounting(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    node = make_node("A100-40GB")
    a, b = start(node, "hold", "1000"), start(node, "hold", "500")
    try:
        assert wait_line(a) == "alloc 0" and wait_line(b) == "alloc 0"
        nv = nvml(node)
        dev = nv.nvmlDeviceGetHandleByIndex(0)
        procs = {p.pid: p.usedGpuMemory for p in nv.nvmlDeviceGetComputeRunningProcesses(dev)}
        assert procs == {a.pid: 1000 * MIB, b.pid: 500 * MIB}
        assert nv.nvmlDeviceGetMemoryInfo(dev).used == 1500 * MIB
        _, total, free, _ = run(node, "info").split(" ", 3)
        assert int(total) - int(free) == 1500 * MIB
        # Over capacity: 40960 MiB total, 1500 used.
        c = start(node, "hold", "39461")
        assert wait_line(c) == "alloc 2"  # CUDA_ERROR_OUT_OF_MEMORY
        c.kill()
        c.wait()
        out = node.smi("--query-compute-apps=pid,used_gpu_memory", "--format=csv,noheader")
        expected = [f"{a.pid}, 1000 MiB", f"{b.pid}, 500 MiB"]
        assert sorted(out.stdout.splitlines()) == sorted(expected)
        a.kill()
        a.wait()
        # The driver frees a dead process's memory.
        assert nv.nvmlDeviceGetMemoryInfo(dev).used == 500 * MIB
    finally:
        for p in (a, b):
            p.kill()
            p.wait()


def test_sigkill_mid_allocation_never_deadlocks_or_leaks(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    node = make_node("H100-80GB")
    nv = nvml(node)
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    for i in range(6):
        churners = [start(node, "churn") for _ in range(2)]
        for p in churners:
            assert wait_line(p) == "ready"
        time.sleep(0.05 + 0.03 * i)
        for p in churners:
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
        # Another process still gets the lock and the memory is not counted.
        assert nv.nvmlDeviceGetMemoryInfo(dev).used == 0
        assert nv.nvmlDeviceGetComputeRunningProcesses(dev) == []
        _, total, free, _ = run(node, "info").split(" ", 3)
        assert total == free


def test_utilisation_is_arithmetic(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    node = make_node("H100-80GB")
    nv = nvml(node)
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    before_us = int(time.time() * 1e6)
    # 400 kernels of 1 ms: 0.4 s of device time, then the process idles.
    p = start(node, "busy", "400", "5")
    try:
        assert wait_line(p) == "done"
        done_at = time.time()
        time.sleep(0.15)  # let a sample period close after the last kernel
        util = nv.nvmlDeviceGetUtilizationRates(dev).gpu  # last 1 s
        queried_at = time.time()
        # 0.4 s of busy time ending by done_at; the window is the second before the query.
        # Its overlap is the expected figure; the slack covers the pipe's latency and the
        # 100 ms sampling, so a loaded machine changes the expectation, not the verdict.
        def overlap(end: float) -> float:
            return max(0.0, end - max(end - 0.4, queried_at - 1.0))
        low = 100 * overlap(done_at - 0.2) - 1
        assert low <= util <= 41, (util, low)
        samples = nv.nvmlDeviceGetProcessUtilization(dev, before_us)
        assert [s.pid for s in samples] == [p.pid]
        s = samples[0]
        assert s.timeStamp > before_us
        window_ms = (s.timeStamp - before_us) / 1000
        expected = 100 * 400 / window_ms
        assert abs(s.smUtil - expected) <= 100 * 100 / window_ms + 2, (s.smUtil, expected)
        time.sleep(0.25)
        with pytest.raises(nv.NVMLError_NotFound):
            nv.nvmlDeviceGetProcessUtilization(dev, s.timeStamp)
    finally:
        p.kill()
        p.wait()


def test_a_timestamp_passed_back_returns_only_newer_samples(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    """A monitor polls faster than the 100 ms sampling and passes back the newest timeStamp:
    until the next sample closes it is told NOT_FOUND, never the sample it already counted
    (re-counting it made an idle process look busy)."""
    node = make_node("H100-80GB")
    nv = nvml(node)
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    p = start(node, "busy", "3000")  # busy for 3 s: every sample has it
    time.sleep(0.5)  # its context up and its first kernels sampled
    try:
        deadline = time.monotonic() + 1.5
        repeats = 0
        while time.monotonic() < deadline:
            last = max(s.timeStamp for s in nv.nvmlDeviceGetProcessUtilization(dev, 0))
            try:
                again = nv.nvmlDeviceGetProcessUtilization(dev, last)
            except nv.NVMLError_NotFound:
                repeats += 1
                continue
            gaps = [s.timeStamp - last for s in again]
            assert all(g >= 50_000 for g in gaps), f"a sample already returned came back: {gaps} us"
        assert repeats > 0, "every second call found a new sample: the loop never repeated"
    finally:
        p.kill()
        p.wait()


def test_time_slicing_between_processes(make_node: Callable[..., Node]) -> None:
    node = make_node("H100-80GB")
    t0 = time.monotonic()
    ps = [start(node, "busy", "150") for _ in range(2)]
    for p in ps:
        assert wait_line(p) == "done"
    elapsed = time.monotonic() - t0
    for p in ps:
        p.wait()
    # One kernel at a time: 2 x 150 ms of device work take at least 0.3 s.
    assert elapsed >= 0.3


def test_per_process_memory_inside_mig_instances(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    """As the driver: the GPU's handle lists every process with the GPU instance its memory
    is on (what a privileged node daemon reads); a MIG device's handle lists only its own."""
    node = make_node("A100-40GB:mig")
    assert node.smi("mig", "-i", "0", "-cgi", "1g.5gb,1g.5gb", "-C").returncode == 0
    migs = [w.rstrip(")") for w in node.smi("-L").stdout.split() if w.startswith("MIG-")]
    assert len(migs) == 2
    env = dict(node.env)
    procs = []
    for uuid, mib in zip(migs, ("300", "200"), strict=True):
        node.env["CUDA_VISIBLE_DEVICES"] = uuid
        procs.append(start(node, "hold", mib))
    node.env = env
    try:
        assert [wait_line(p) for p in procs] == ["alloc 0", "alloc 0"]
        nv = nvml(node)
        gpu = nv.nvmlDeviceGetHandleByIndex(0)
        gi = {}
        for j in range(2):
            m = nv.nvmlDeviceGetMigDeviceHandleByIndex(gpu, j)
            u = nv.nvmlDeviceGetUUID(m)
            gi[u.decode() if isinstance(u, bytes) else u] = (
                nv.nvmlDeviceGetGpuInstanceId(m), m)
        listed = {(p.pid, p.gpuInstanceId, p.usedGpuMemory)
                  for p in nv.nvmlDeviceGetComputeRunningProcesses(gpu)}
        assert listed == {(procs[0].pid, gi[migs[0]][0], 300 * MIB),
                          (procs[1].pid, gi[migs[1]][0], 200 * MIB)}
        for uuid, p, mib in zip(migs, procs, (300, 200), strict=True):
            own = nv.nvmlDeviceGetComputeRunningProcesses(gi[uuid][1])
            assert [(r.pid, r.usedGpuMemory) for r in own] == [(p.pid, mib * MIB)]
    finally:
        for p in procs:
            p.kill()
            p.wait()
