"""One parser for what tessera reads of a host process in ``/proc`` (the core controller and
the audit both need it; both run in the host PID namespace, as NVML reports host PIDs).

A process is named the same from every PID namespace by the PID it has in its own, innermost
namespace (the last ``NSpid:`` of ``/proc/<pid>/status``), its start time (field 22 of
``/proc/<pid>/stat``, clock ticks since boot) and that namespace's inode
(``/proc/<pid>/ns/pid``): that is how a host PID from NVML is matched to what a container's
process wrote in its ledger. PID and start time alone are not enough: containers started
together by a Job all run their command as PID 1, often in the same 10 ms tick.
"""

from __future__ import annotations

from pathlib import Path

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
