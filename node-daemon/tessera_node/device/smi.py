"""``nvidia-smi``: the tool every MIG change goes through (the driver's own checks and
messages).  Each run holds the GPU's host lock (:mod:`.hostlock`), and each command and its
output is logged as one JSON line and counted."""

from __future__ import annotations

import logging
import os
import subprocess
import time
from dataclasses import dataclass

CANDIDATES = ("usr/bin/nvidia-smi", "bin/nvidia-smi")
USAGE_EXIT = 2
"""nvidia-smi's exit status for arguments it does not understand."""
TIMEOUT_EXIT = -1

log = logging.getLogger("tessera_node.nvidia_smi")


@dataclass(frozen=True)
class SmiResult:
    args: tuple[str, ...]
    rc: int
    output: str
    """stdout and stderr together (nvidia-smi prints its errors on stdout)."""
    seconds: float


@dataclass(frozen=True)
class NvidiaSmi:
    path: str

    @classmethod
    def locate(cls, configured: str, driver_root: str) -> NvidiaSmi:
        """``configured`` when set, else the first candidate below the driver root (which
        need not exist yet: a missing tool is an error when it is run, not at start)."""
        if configured:
            return cls(configured)
        for sub in CANDIDATES:
            candidate = os.path.join(driver_root, sub)
            if os.access(candidate, os.X_OK):
                return cls(candidate)
        return cls(os.path.join(driver_root, CANDIDATES[0]))

    def call(self, *args: str, lock_fd: int | None = None, gpu: int | None = None,
             timeout: float = 300.0) -> SmiResult:
        """Run it (never raises): exit status -1 when it could not run or timed out."""
        started = time.monotonic()
        log.info("nvidia-smi start", extra={"gpu": gpu, "argv": list(args)})
        try:
            out = subprocess.run([self.path, *args], capture_output=True, text=True,
                                 timeout=timeout, check=False,
                                 pass_fds=(lock_fd,) if lock_fd is not None else ())
            rc, output = out.returncode, out.stdout + out.stderr
        except (OSError, subprocess.TimeoutExpired) as exc:
            rc, output = TIMEOUT_EXIT, f"{self.path}: {exc}"
        seconds = time.monotonic() - started
        result = SmiResult(tuple(args), rc, output.strip(), seconds)
        (log.info if rc == 0 else log.warning)(
            "nvidia-smi done", extra={"gpu": gpu, "argv": list(args), "rc": rc,
                                      "output": result.output[-2000:],
                                      "seconds": round(seconds, 4)})
        return result
