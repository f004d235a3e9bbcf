"""Component processes that cannot outlive their cluster, and the sweep of killed runs.

Two independent guarantees, because neither alone covers everything:
- every component is started with PR_SET_PDEATHSIG=SIGKILL, so the kernel kills it when the
  thread that started it dies (including SIGKILL of the test runner, which runs no cleanup);
- every run records itself in a run directory (owner pid + start time, one pid file per
  component); the next start sweeps run directories whose owner is gone, killing any recorded
  process whose /proc/<pid>/cmdline still names that run directory (so a reused pid is never
  killed), keeping the logs and deleting the rest.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0
KEPT_LOG_DIRS = 20


def die_with_parent(cgroup_procs: Path | None = None) -> Callable[[], None]:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent thread exits; with
    `cgroup_procs`, move the child into that cgroup first (what it starts inherits it)."""
    libc = ctypes.CDLL(None, use_errno=True)  # resolved before fork: preexec must stay minimal
    parent = os.getpid()
    procs = str(cgroup_procs) if cgroup_procs is not None else None

    def preexec() -> None:
        if procs is not None:
            with open(procs, "w") as cgroup:
                cgroup.write(str(os.getpid()))
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died between fork and prctl
            os._exit(1)

    return preexec


def terminate(proc: subprocess.Popen[bytes] | None, grace_s: float = 10.0) -> None:
    """SIGTERM a child we started, SIGKILL it after ``grace_s``; reaped either way."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(grace_s)


def process_start_time(pid: int) -> int | None:
    """Start time in clock ticks since boot (field 22 of /proc/<pid>/stat); None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def is_running(pid: int) -> bool:
    """Alive and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@dataclass
class Component:
    """One started component: its process and where its output goes."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def exited(self) -> int | None:
        return self.process.poll()

    def log_tail(self, count: int = 20) -> list[str]:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return []
        return [line.strip() for line in lines if line.strip()][-count:]

    def last_log_line(self) -> str:
        """The last meaningful log line, which is usually why a component exited."""
        tail = self.log_tail(1)
        return tail[0][:300] if tail else "empty log"

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class RunDirectory:
    """runs/<id>/: owner.json, <component>.pid, logs/, and the run's data (pki, etcd)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @classmethod
    def create(cls, runs: Path) -> RunDirectory:
        runs.mkdir(parents=True, exist_ok=True)
        prefix = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-"
        path = Path(tempfile.mkdtemp(prefix=prefix, dir=runs))  # unique, mode 0700
        (path / "logs").mkdir()
        owner = {"pid": os.getpid(), "start_time": process_start_time(os.getpid())}
        (path / "owner.json").write_text(json.dumps(owner))
        return cls(path)

    def start(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cgroup_procs: Path | None = None,
    ) -> Component:
        """Start a component in its own session (a terminal's Ctrl-C reaches only us, and we
        stop components in order), dying with us, output to logs/<name>.log; optionally in
        the cgroup whose `cgroup.procs` file is given."""
        log_path = self.logs / f"{name}.log"
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                list(argv), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=dict(env) if env is not None else None, start_new_session=True,
                preexec_fn=die_with_parent(cgroup_procs),
            )
        (self.path / f"{name}.pid").write_text(str(process.pid))
        return Component(name=name, process=process, log_path=log_path)

    def owner_alive(self) -> bool:
        try:
            owner = json.loads((self.path / "owner.json").read_text())
            pid, start_time = int(owner["pid"]), owner["start_time"]
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return is_running(pid) and process_start_time(pid) == start_time

    def kill_recorded(self) -> list[int]:
        """SIGKILL recorded processes that still belong to this run; returns their pids."""
        killed = []
        for pid_file in self.path.glob("*.pid"):
            try:
                pid = int(pid_file.read_text())
            except (OSError, ValueError):
                continue
            if is_running(pid) and str(self.path) in cmdline(pid):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        deadline = time.monotonic() + 5
        while any(is_running(pid) for pid in killed) and time.monotonic() < deadline:
            time.sleep(0.05)
        return killed

    def remove(self, kept_logs: Path | None) -> Path | None:
        """Delete the run directory; with kept_logs, move logs there first and return where."""
        kept: Path | None = None
        if kept_logs is not None and self.logs.is_dir():
            kept_logs.mkdir(parents=True, exist_ok=True)
            kept = kept_logs / self.path.name
            shutil.rmtree(kept, ignore_errors=True)
            shutil.move(str(self.logs), kept)
            _prune_old(kept_logs, KEPT_LOG_DIRS)
        shutil.rmtree(self.path, ignore_errors=True)
        return kept


def _prune_old(directory: Path, keep: int) -> None:
    entries = sorted(directory.iterdir(), key=lambda p: p.stat().st_mtime)
    for old in entries[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


@dataclass(frozen=True)
class SweptRun:
    run: Path
    killed: list[int]
    logs: Path | None


def sweep_killed_runs(
    runs: Path, kept_logs: Path, before_remove: Callable[[Path], None] | None = None
) -> list[SweptRun]:
    """Clean up after runs whose owner died without stopping them (SIGKILL, power loss);
    `before_remove(run)` cleans up what is not a recorded process (e.g. a node's cgroups)."""
    swept: list[SweptRun] = []
    if not runs.is_dir():
        return swept
    for path in sorted(runs.iterdir()):
        run = RunDirectory(path)
        if not path.is_dir() or run.owner_alive():
            continue
        killed = run.kill_recorded()
        if before_remove is not None:
            before_remove(path)
        swept.append(SweptRun(run=path, killed=killed, logs=run.remove(kept_logs)))
    return swept
