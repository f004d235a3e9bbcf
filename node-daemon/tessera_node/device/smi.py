"""``nvidia-smi``: the tool every MIG change goes through (the driver's own checks and
messages).  Located once at start; the MIG enactor (next part) runs its commands here."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass

CANDIDATES = ("usr/bin/nvidia-smi", "bin/nvidia-smi")


class SmiError(Exception):
    """nvidia-smi failed; the message has its exit status and output."""


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

    def run(self, *args: str, timeout: float = 120.0) -> str:
        try:
            out = subprocess.run([self.path, *args], capture_output=True, text=True,
                                 timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SmiError(f"{self.path} {' '.join(args)}: {exc}") from exc
        if out.returncode != 0:
            raise SmiError(f"{self.path} {' '.join(args)}: exit {out.returncode}: "
                           f"{(out.stdout + out.stderr).strip()[:500]}")
        return out.stdout
