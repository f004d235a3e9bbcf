"""`make demo` does what it says: shows the resources and a quota at work, its instructions
work, it stops clean."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tessera_e2e.demo import REPO_ROOT

pytestmark = pytest.mark.integration

ENV = dict(os.environ, PYTHONPATH=f"{REPO_ROOT / 'e2e'}:{REPO_ROOT / 'sim'}")
DEMO = [sys.executable, "-m", "tessera_e2e", "demo"]


def _assert_shows_the_resources(out: str) -> None:
    assert "Control plane ready in" in out
    assert "$ kubectl get tessera -A" in out
    assert "gpupartition.tessera.dev/" in out and "gpuquota.tessera.dev/" in out
    assert "SELECTED" in out and "CORES" in out  # printer columns of both kinds
    # The operator admits within quota (defaults filled in) and refuses beyond it.
    assert "pod small: admitted" in out and '"tessera.dev/vgpu-memory":"2048"' in out
    assert "pod medium: admitted" in out
    assert "pod too-big: refused" in out and 'exceeded GPUQuota "team"' in out
    # Three simulated GPU nodes: their daemons enact the example partitions.
    ready = out.split("# every selected node Ready", 1)[1]
    for name in ("h100-inference", "a100-experiments", "a30-small-jobs"):
        row = next(line.split() for line in ready.splitlines() if line.startswith(name))
        assert row[1:3] == ["1", "1"], row  # selected 1, Ready 1
    lgi = out.split("$ nvidia-smi mig -lgi", 1)[1]
    assert lgi.count("MIG 3g.20gb") == 4 and lgi.count("MIG 2g.10gb") == 8


def _processes_naming(text: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_text():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def test_demo_exit_runs_once_non_interactively() -> None:
    result = subprocess.run([*DEMO, "--exit"], capture_output=True, text=True, timeout=400,
                            env=ENV, check=False)
    assert result.returncode == 0, result.stderr
    _assert_shows_the_resources(result.stdout)
    assert "Stopping the cluster now (--exit)" in result.stdout
    assert "export KUBECONFIG" not in result.stdout  # it would point at a stopped cluster


def test_demo_instructions_work_and_ctrl_c_stops_it() -> None:
    demo = subprocess.Popen(DEMO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            env=ENV)
    assert demo.stdout is not None
    lines: list[str] = []
    try:
        while not lines or not lines[-1].startswith("Stop it with Ctrl-C"):
            line = demo.stdout.readline()
            assert line, f"demo ended early: {''.join(lines)}"
            lines.append(line)
        out = "".join(lines)
        _assert_shows_the_resources(out)
        kubeconfig = out.split("export KUBECONFIG=", 1)[1].split()[0]
        kubectl = out.split("alias kubectl=", 1)[1].split()[0]
        shown = subprocess.run(
            [kubectl, "get", "gpupartitions,gpuquotas", "-A"], capture_output=True, text=True,
            env=dict(os.environ, KUBECONFIG=kubeconfig), check=False,
        )
        assert shown.returncode == 0, shown.stderr
        assert "gpupartition.tessera.dev/" in shown.stdout
    finally:
        demo.send_signal(signal.SIGINT)
        assert demo.wait(30) == 130
    run_dir = Path(kubeconfig).parent
    assert not run_dir.exists()
    assert _processes_naming(str(run_dir)) == []  # the operator went with the cluster
