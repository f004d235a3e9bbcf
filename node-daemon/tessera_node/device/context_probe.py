"""What one CUDA context holds on a GPU or MIG instance, measured on the node.

libtessera charges every context a process creates against the container's budget, by the
``context`` figure of the budget entry (bytes). The driver API does not say what a context
costs, but NVML's per-process memory does: a probe process on the host (outside any
container, without libtessera) retains one primary context on the device, reads its own
``usedGpuMemory`` from NVML (host PIDs: its own) and prints it.  On a real H100 that is
hundreds of MiB; the simulator charges ``context_mib``.

    python -m tessera_node.device.context_probe GPU-…|MIG-…      # prints bytes

``context_bytes(device)`` runs the probe in a subprocess, so the daemon itself never
creates a context.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any


class ProbeError(RuntimeError):
    pass


def context_bytes(device: str, env: Mapping[str, str] | None = None, timeout: float = 60) -> int:
    """Device bytes one context takes on ``device`` (a ``GPU-``/``MIG-`` UUID)."""
    e = dict(os.environ if env is None else env)
    e["CUDA_VISIBLE_DEVICES"] = device
    for k in ("LD_PRELOAD", "TESSERA_MEMORY_LIMIT", "TESSERA_CORE_RATE"):
        e.pop(k, None)
    r = subprocess.run(
        [sys.executable, "-m", "tessera_node.device.context_probe", device],
        env=e, capture_output=True, text=True, timeout=timeout, check=False,
    )
    lines = r.stdout.split()
    if r.returncode != 0 or len(lines) != 1 or not lines[0].isdigit():
        raise ProbeError(f"context probe on {device} failed: {r.stderr.strip() or r.stdout}")
    return int(lines[0])


def _probe() -> int:
    cu = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    for what, rc in (
        ("cuInit", cu.cuInit(0)),
        ("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)),
    ):
        if rc != 0:
            raise ProbeError(f"{what} failed: CUDA error {rc}")
    import pynvml

    nv: Any = pynvml
    nv.nvmlInit()
    try:
        me, total, seen = os.getpid(), 0, False
        for i in range(nv.nvmlDeviceGetCount()):
            for p in nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(i)):
                if p.pid == me and p.usedGpuMemory is not None:
                    total += int(p.usedGpuMemory)
                    seen = True
        if not seen:
            raise ProbeError(f"NVML does not list the probe (PID {me}) with a context")
        return total
    finally:
        nv.nvmlShutdown()


if __name__ == "__main__":
    try:
        print(_probe())
    except ProbeError as exc:
        print(exc, file=sys.stderr)
        sys.exit(1)
