"""Host processes as the audit reads and stops them (``/proc``; needs the host PID namespace,
``hostPID: true`` in a DaemonSet, as NVML reports host PIDs)."""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from pathlib import Path

from tessera_node import procfs
from tessera_node.audit.cgroups import CgroupOwner, ConflictingCgroups, cgroup_owner


@dataclass(frozen=True)
class ProcInfo:
    start_ticks: int | None = None
    inner_pid: int | None = None
    ppid: int | None = None
    owner: CgroupOwner | None = None
    unreadable: str | None = None
    """Why the owner is unknown (no such process here, conflicting cgroups)."""


def read_proc(pid: int, proc: Path = procfs.PROC) -> ProcInfo:
    try:
        ppid, start = procfs.stat(pid, proc)
        inner = procfs.inner_pid(pid, proc)
        text = (proc / str(pid) / "cgroup").read_text()
    except (OSError, ValueError, IndexError) as exc:
        return ProcInfo(unreadable=f"/proc/{pid}: {exc.__class__.__name__}")
    try:
        owner = cgroup_owner(text)
    except ConflictingCgroups as exc:
        return ProcInfo(start, inner, ppid, None, f"conflicting cgroups: {exc}")
    return ProcInfo(start, inner, ppid, owner)


def stop(pid: int, start_ticks: int, proc: Path = procfs.PROC) -> str | None:
    """SIGKILL the host process ``pid`` if it is still the one that started at
    ``start_ticks`` (a pidfd pins it, so a PID reused meanwhile is never hit). None when
    killed, else why not."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        return f"pid {pid}: {exc.strerror}"
    try:
        try:
            if procfs.stat(pid, proc)[1] != start_ticks:
                return f"pid {pid}: another process now"
        except (OSError, ValueError, IndexError):
            return f"pid {pid}: gone"
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return None
    except OSError as exc:
        return f"pid {pid}: {exc.strerror}"
    finally:
        os.close(fd)
