"""Real processes for audit tests and the audit benchmark: ``sim/tests/workload.py`` on a
simulated node, each in a real cgroup laid out as the kubelet's cgroupfs driver lays out a
pod's and a container's (below a root of its own, so nothing of the host's is touched).
Used by the node daemon's audit test, the audit benchmark and the operating test."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tessera_e2e.paths import REPO

WORKLOAD = REPO / "sim" / "tests" / "workload.py"
LIBTESSERA = REPO / "hook" / "build" / "libtessera.so"
CGROUP_ROOT = Path("/sys/fs/cgroup/pids")


def require() -> None:
    """Missing prerequisites fail (this tier does not skip)."""
    assert os.geteuid() == 0, "the audit test needs root (cgroups, SIGKILL of any process)"
    assert (CGROUP_ROOT / "cgroup.procs").exists(), f"no cgroup hierarchy at {CGROUP_ROOT}"
    assert LIBTESSERA.exists(), "libtessera not built (make hook)"


class Cgroups:
    """Pod and container cgroups below a root of their own."""

    def __init__(self) -> None:
        self.root = CGROUP_ROOT / f"tessera-audit-{uuid.uuid4().hex[:8]}"
        self.made: list[Path] = []

    def container(self, pod_uid: str, container_id: str) -> Path:
        d = self.root / "kubepods" / "besteffort" / f"pod{pod_uid}" / container_id
        for p in reversed([d, *d.parents]):
            if p == CGROUP_ROOT or not str(p).startswith(str(self.root)):
                continue
            if not p.exists():
                p.mkdir()
                self.made.append(p)
        return d

    def remove(self) -> None:
        for p in reversed(self.made):
            for _ in range(50):
                try:
                    p.rmdir()
                    break
                except OSError:
                    time.sleep(0.1)


class Workload:
    """``sim/tests/workload.py`` in a cgroup (or none), on the simulated node."""

    def __init__(self, env: dict[str, str], cgroup: Path | None, *args: str,
                 device: str, extra_env: dict[str, str] | None = None) -> None:
        enter = f"echo $$ > {cgroup}/cgroup.procs && " if cgroup else ""
        cmd = f"{enter}exec {sys.executable} {WORKLOAD} {' '.join(args)}"
        self.proc = subprocess.Popen(
            ["sh", "-c", cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env={**env, "CUDA_VISIBLE_DEVICES": device, **(extra_env or {})})
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.startswith(("ready", "alloc 0")), line + self.proc.stdout.read()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def label(self) -> str:
        comm = Path(f"/proc/{self.pid}/comm").read_text().strip()
        return f"pid {self.pid} ({comm})"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
