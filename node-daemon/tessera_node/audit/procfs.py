"""Host processes as the audit reads and stops them (``/proc``; needs the host PID namespace,
``hostPID: true`` in a DaemonSet, as NVML reports host PIDs)."""

from __future__ import annotations

import ctypes
import errno
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


# -- what a process sees at /run/tessera -----------------------------------------------------

class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64),
                ("resolve", ctypes.c_uint64)]


SYS_OPENAT2 = 437  # the same on x86_64 and arm64 (asm-generic)
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_IN_ROOT = 0x10
_libc = ctypes.CDLL(None, use_errno=True)


def _identity_in(root: int, path: str) -> tuple[int, int] | None:
    """(device, inode) of ``path`` resolved inside the directory ``root`` as if it were the
    root (symlinks, absolute ones too, and ``..`` stay inside it: the kernel's
    RESOLVE_IN_ROOT); None when there is nothing there."""
    how = _OpenHow(os.O_PATH | os.O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)
    fd = _libc.syscall(SYS_OPENAT2, root, path.encode(), ctypes.byref(how),
                       ctypes.sizeof(how))
    if fd < 0:
        err = ctypes.get_errno()
        if err in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            return None
        raise OSError(err, os.strerror(err), path)
    try:
        st = os.fstat(fd)
        return st.st_dev, st.st_ino
    finally:
        os.close(fd)


def sees(pid: int, start_ticks: int | None, files: tuple[str, ...],
         proc: Path = procfs.PROC) -> tuple[tuple[int, int] | None, ...] | None:
    """What the host process ``pid`` finds at each of ``files`` (absolute paths) in its own
    root and mount namespace, as the kernel resolves them for it (``/proc/<pid>/root``);
    None when that cannot be told (the process went, or is another one now)."""
    try:
        root = os.open(proc / str(pid) / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = tuple(_identity_in(root, f.lstrip("/")) for f in files)
        if start_ticks is None or procfs.stat(pid, proc)[1] != start_ticks:
            return None
        return found
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(root)
