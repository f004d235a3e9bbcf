"""A node's own cgroup subtree: its kubelet's --cgroup-root, and how everything in it is killed.

Two kubelets on one host would fight over the same `kubepods` cgroups, so each node's kubelet
gets `--cgroup-root=/tessera-<run>-<node>`, created here in every mounted cgroup hierarchy
(v1 controllers, the named systemd one and the v2 `unified` one of a hybrid host). The node's
own processes (namespace holder, containerd, kubelet, kube-proxy) are put in
`<root>/daemons` of the pids hierarchy; containerd's shims inherit that, and runc puts every
container under `<root>/kubepods`. So the pids hierarchy's `<root>` holds every process of a
node: teardown kills them all there, even the shims and containers that outlive a SIGKILLed
test run, then removes the subtree bottom-up in every hierarchy.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

CGROUP_MOUNTS = Path("/sys/fs/cgroup")
PIDS = "pids"
DAEMONS = "daemons"


def hierarchies(mounts: Path = CGROUP_MOUNTS) -> list[Path]:
    """The mounted hierarchies' directories (cgroup v1 with a hybrid v2; or one v2 root)."""
    if (mounts / "cgroup.controllers").exists():
        return [mounts]  # pure cgroup v2
    return sorted(path for path in mounts.iterdir()
                  if path.is_dir() and not path.is_symlink() and (path / "cgroup.procs").exists())


class NodeCgroup:
    """`/<name>` in every hierarchy; `procs_file` is where the node's daemons go."""

    def __init__(self, name: str, mounts: Path = CGROUP_MOUNTS) -> None:
        self.name = name.strip("/")
        self.mounts = mounts

    @property
    def root(self) -> str:
        """The kubelet's --cgroup-root."""
        return f"/{self.name}"

    @property
    def pids_root(self) -> Path:
        pids = self.mounts / PIDS
        return (pids if pids.is_dir() else self.mounts) / self.name

    @property
    def procs_file(self) -> Path:
        return self.pids_root / DAEMONS / "cgroup.procs"

    def create(self) -> None:
        for hierarchy in hierarchies(self.mounts):
            path = hierarchy / self.name
            path.mkdir(exist_ok=True)
            if (hierarchy / "cpuset.cpus").exists() and (path / "cpuset.cpus").exists():
                # A v1 cpuset cgroup takes no process until it has CPUs and memory nodes.
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    (path / knob).write_text((hierarchy / knob).read_text())
        self.procs_file.parent.mkdir(exist_ok=True)

    def _subtree(self, top: Path) -> Iterator[Path]:
        """Cgroup directories under `top`, children before parents."""
        for directory, _, _ in os.walk(top, topdown=False):
            yield Path(directory)

    def pids(self) -> list[int]:
        found: list[int] = []
        if not self.pids_root.is_dir():
            return found
        for directory in self._subtree(self.pids_root):
            try:
                found += [int(pid) for pid in (directory / "cgroup.procs").read_text().split()]
            except (OSError, ValueError):
                continue
        return found

    def kill_all(self, timeout_s: float = 15.0) -> list[int]:
        """SIGKILL every process in the node until none is left; returns those killed."""
        killed: set[int] = set()
        deadline = time.monotonic() + timeout_s
        while (alive := self.pids()) and time.monotonic() < deadline:
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.05)
        return sorted(killed)

    def remove(self, timeout_s: float = 10.0) -> list[Path]:
        """rmdir the subtree in every hierarchy; returns what could not be removed."""
        deadline = time.monotonic() + timeout_s
        left: list[Path] = []
        for hierarchy in hierarchies(self.mounts):
            top = hierarchy / self.name
            if not top.is_dir():
                continue
            for directory in self._subtree(top):
                while True:
                    try:
                        directory.rmdir()
                        break
                    except FileNotFoundError:
                        break
                    except OSError:  # EBUSY while a dying process is still being reaped
                        if time.monotonic() > deadline:
                            left.append(directory)
                            break
                        time.sleep(0.05)
        return left

    def exists(self) -> bool:
        return any((hierarchy / self.name).exists() for hierarchy in hierarchies(self.mounts))
