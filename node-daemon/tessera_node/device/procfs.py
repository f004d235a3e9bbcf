"""Host processes as the daemon reads and stops them in ``/proc``: the one parser of what
tessera reads there (the core controllers and the audit both need it; both run in the host
PID namespace, ``hostPID: true`` in a DaemonSet, as NVML reports host PIDs).

A process is named the same from every PID namespace by the PID it has in its own, innermost
namespace (the last ``NSpid:`` of ``/proc/<pid>/status``), its start time (field 22 of
``/proc/<pid>/stat``, clock ticks since boot) and that namespace's inode
(``/proc/<pid>/ns/pid``): that is how a host PID from NVML is matched to what a container's
process wrote in its ledger. PID and start time alone are not enough: containers started
together by a Job all run their command as PID 1, often in the same 10 ms tick.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from tessera_node.device.cgroups import CgroupOwner, ConflictingCgroups, cgroup_owner

PROC = Path("/proc")


def stat(pid: int, proc: Path = PROC) -> tuple[int, int]:
    """(parent PID, start ticks) from /proc/<pid>/stat (the name may hold spaces and
    parentheses, so the fields are counted from the last ')')."""
    fields = (proc / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[1]), int(fields[19])


def inner_pid(pid: int, proc: Path = PROC) -> int:
    """The PID the process sees itself as (innermost namespace); ``pid`` without NSpid."""
    for line in (proc / str(pid) / "status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def pid_namespace(pid: int, proc: Path = PROC) -> int:
    """The inode of the process's PID namespace (what it reads at /proc/self/ns/pid)."""
    return (proc / str(pid) / "ns" / "pid").stat().st_ino


def identity(pid: int, proc: Path = PROC) -> tuple[int, int, int] | None:
    """(PID inside the process's own namespace, start ticks, that namespace's inode) of a
    host PID: one process, however many containers' PID 1 started in the same clock tick.
    None when it cannot be read (gone, or not ours to read)."""
    try:
        return inner_pid(pid, proc), stat(pid, proc)[1], pid_namespace(pid, proc)
    except (OSError, ValueError, IndexError):
        return None


def process_name(pid: int, proc: Path = PROC) -> str:
    """``pid 4242 (python3)``; the name from /proc when this PID namespace shows it."""
    try:
        comm = (proc / str(pid) / "comm").read_text().strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid} ({comm})"


# -- the audit: which pod a process is in, stopping it ----------------------------------------

@dataclass(frozen=True)
class ProcInfo:
    """What the audit reads of a host process: its start, PIDs and the pod (cgroup) it is in."""

    start_ticks: int | None = None
    inner_pid: int | None = None
    ppid: int | None = None
    owner: CgroupOwner | None = None
    unreadable: str | None = None
    """Why the owner is unknown (no such process here, conflicting cgroups)."""


def read_proc(pid: int, proc: Path = PROC) -> ProcInfo:
    try:
        ppid, start = stat(pid, proc)
        inner = inner_pid(pid, proc)
        text = (proc / str(pid) / "cgroup").read_text()
    except (OSError, ValueError, IndexError) as exc:
        return ProcInfo(unreadable=f"/proc/{pid}: {exc.__class__.__name__}")
    try:
        owner = cgroup_owner(text)
    except ConflictingCgroups as exc:
        return ProcInfo(start, inner, ppid, None, f"conflicting cgroups: {exc}")
    return ProcInfo(start, inner, ppid, owner)


def stop(pid: int, start_ticks: int, proc: Path = PROC) -> str | None:
    """SIGKILL the host process ``pid`` if it is still the one that started at
    ``start_ticks`` (a pidfd pins it, so a PID reused meanwhile is never hit). None when
    killed, else why not."""
    try:
        fd = os.pidfd_open(pid)
    except OSError as exc:
        return f"pid {pid}: {exc.strerror}"
    try:
        try:
            if stat(pid, proc)[1] != start_ticks:
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
         proc: Path = PROC) -> tuple[tuple[int, int] | None, ...] | None:
    """What the host process ``pid`` finds at each of ``files`` (absolute paths) in its own
    root and mount namespace, as the kernel resolves them for it (``/proc/<pid>/root``);
    None when that cannot be told (the process went, or is another one now)."""
    try:
        root = os.open(proc / str(pid) / "root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = tuple(_identity_in(root, f.lstrip("/")) for f in files)
        if start_ticks is None or stat(pid, proc)[1] != start_ticks:
            return None
        return found
    except (OSError, ValueError, IndexError):
        return None
    finally:
        os.close(root)
