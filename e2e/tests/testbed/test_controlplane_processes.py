"""The sweep kills what a killed run left, and nothing else."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera_e2e.controlplane.processes import RunDirectory, is_running, sweep_killed_runs

SLEEPER = "import time, sys; time.sleep(300)"


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _orphan_run(runs: Path, name: str) -> RunDirectory:
    """A run directory whose owner is dead (pid 0 never matches)."""
    path = runs / name
    (path / "logs").mkdir(parents=True)
    (path / "logs" / "etcd.log").write_text("last words\n")
    (path / "owner.json").write_text(json.dumps({"pid": 999_999_999, "start_time": 1}))
    return RunDirectory(path)


def test_sweep_kills_leftovers_of_dead_runs_and_keeps_their_logs(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    run = _orphan_run(tmp_path / "runs", "dead-run")
    # A leftover component: its command line names the run directory, as real ones do.
    leftover = subprocess.Popen([sys.executable, "-c", SLEEPER, str(run.path)])
    # A stranger that merely reuses a recorded pid: must survive.
    stranger = subprocess.Popen([sys.executable, "-c", SLEEPER])
    sleepers += [leftover, stranger]
    (run.path / "etcd.pid").write_text(str(leftover.pid))
    (run.path / "kube-apiserver.pid").write_text(str(stranger.pid))

    swept = sweep_killed_runs(tmp_path / "runs", tmp_path / "logs")

    assert [s.killed for s in swept] == [[leftover.pid]]
    leftover.wait(5)
    assert is_running(stranger.pid)
    assert not run.path.exists()
    assert (tmp_path / "logs" / "dead-run" / "etcd.log").read_text() == "last words\n"


def test_sweep_leaves_runs_of_live_owners_alone(tmp_path: Path) -> None:
    live = RunDirectory.create(tmp_path / "runs")  # owned by this test process
    assert sweep_killed_runs(tmp_path / "runs", tmp_path / "logs") == []
    assert live.path.is_dir()
