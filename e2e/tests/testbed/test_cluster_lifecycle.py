"""The local cluster starts, stops cleanly, and explains its failures in one line.

These start their own small clusters (etcd + kube-apiserver) in a private cache directory, so
they do not disturb the session's `cluster` fixture.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.processes import is_running

pytestmark = pytest.mark.integration


def _quiet(line: str) -> None:
    pass


def _wait_gone(pids: list[int], timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_running(p) for p in pids):
        time.sleep(0.05)
    return [p for p in pids if is_running(p)]


RUNNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from tessera_e2e.controlplane.cache import Layout
    from tessera_e2e.controlplane.cluster import LocalCluster
    cluster = LocalCluster(Path(sys.argv[1]), Layout(Path(sys.argv[2])), controllers=True,
                           report=lambda line: None).start()
    pids = [c.process.pid for c in cluster.components]
    print(json.dumps({"pids": pids, "run": str(cluster.run.path)}), flush=True)
    time.sleep(600)
""")


def test_sigkill_of_the_runner_kills_components_and_next_start_sweeps(
    bin_dir: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))  # tessera_e2e, tessera_sim
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(bin_dir), str(tmp_path)],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert runner.stdout is not None
        started = json.loads(runner.stdout.readline())
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    pids, run = started["pids"], Path(started["run"])
    assert len(pids) == 4  # etcd, kube-apiserver, kube-controller-manager, kube-scheduler

    assert _wait_gone(pids) == [], "components outlived the SIGKILLed runner"
    assert run.is_dir()  # SIGKILL ran no cleanup: the next start must sweep it

    lines: list[str] = []
    with LocalCluster(bin_dir, Layout(tmp_path), controllers=False, report=lines.append):
        assert not run.exists()
        assert any(f"swept a killed run {run.name}" in line for line in lines)
        assert (tmp_path / "logs" / run.name / "kube-apiserver.log").is_file()
    assert list((tmp_path / "runs").iterdir()) == []


def test_clean_stop_leaves_no_process_and_no_directory(bin_dir: Path, tmp_path: Path) -> None:
    cluster = LocalCluster(bin_dir, Layout(tmp_path), controllers=False, report=_quiet).start()
    pids = [c.process.pid for c in cluster.components]
    assert cluster.kubectl("get", "--raw", "/readyz").stdout == "ok"
    assert cluster.stop() is None
    assert _wait_gone(pids, 0.1) == []
    assert list((tmp_path / "runs").iterdir()) == []
    assert not (tmp_path / "logs").exists()


def test_a_component_that_exits_is_one_line_with_its_log(bin_dir: Path, tmp_path: Path) -> None:
    cluster = LocalCluster(
        bin_dir, Layout(tmp_path), controllers=False, report=_quiet,
        extra_args={"kube-apiserver": ["--no-such-flag"]},
    )
    with pytest.raises(ControlPlaneError) as caught:
        cluster.start()
    message = str(caught.value)
    assert message.startswith("kube-apiserver exited with code 1")
    assert "unknown flag: --no-such-flag" in message and "\n" not in message
    log = Path(message.rsplit(": ", 1)[1])
    assert log.is_file() and log.parent.parent == tmp_path / "logs"
    assert list((tmp_path / "runs").iterdir()) == []  # etcd was stopped too


def test_a_requested_port_in_use_is_refused_before_starting(
    bin_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cluster = LocalCluster(bin_dir, Layout(tmp_path), apiserver_port=port, report=_quiet)
        with pytest.raises(ControlPlaneError, match=f"port {port} on 127.0.0.1 is already in use"):
            cluster.start()


def test_a_port_taken_after_the_check_names_the_bind_error(
    bin_dir: Path, tmp_path: Path
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        lines: list[str] = []
        cluster = LocalCluster(
            bin_dir, Layout(tmp_path), controllers=False, report=lines.append,
            extra_args={"kube-apiserver": [f"--secure-port={port}"]},  # last flag wins
        )
        with pytest.raises(ControlPlaneError) as caught:
            cluster.start()
    message = str(caught.value)
    assert message.startswith("kube-apiserver could not bind its port (address already in use)")
    assert str(tmp_path / "logs") in message and "\n" not in message
    # auto-chosen ports are retried (here in vain: the extra flag pins the taken port)
    assert sum("retrying with new ports" in line for line in lines) == 2
    assert list((tmp_path / "runs").iterdir()) == []


@pytest.mark.parametrize(("stop_signal", "nodes"), [(signal.SIGINT, []), (signal.SIGTERM, ["0"])])
def test_make_cluster_prints_kubeconfig_and_stops_cleanly(
    bin_dir: Path, stop_signal: signal.Signals, nodes: list[str]
) -> None:
    """`make cluster` (by default with nodes) and `--nodes 0` (the control plane alone)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))  # tessera_e2e, tessera_sim
    cli = subprocess.Popen(
        [sys.executable, "-m", "tessera_e2e", "cluster", *(["--nodes", *nodes] if nodes else [])],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    assert cli.stdout is not None
    lines: list[str] = []
    while not lines or not lines[-1].startswith("Stop it with Ctrl-C"):
        line = cli.stdout.readline()
        assert line, f"cluster command ended early: {lines}"
        lines.append(line)
    kubeconfig = Path(next(li for li in lines if "export KUBECONFIG=" in li).split("=", 1)[1]
                      .strip())
    kubectl = next(li for li in lines if "alias kubectl=" in li).split("=", 1)[1].strip()
    namespaces = subprocess.run([kubectl, "--kubeconfig", str(kubeconfig), "get", "ns"],
                                capture_output=True, text=True, check=False)
    assert "kube-system" in namespaces.stdout, namespaces.stderr
    ready = [li for li in lines if li.startswith("Cluster ready")]
    assert ready and ready[0].rstrip().endswith("with 0 nodes" if nodes else "with 2 nodes")
    run = kubeconfig.parent
    pids = [int(p.read_text()) for p in run.glob("*.pid")]

    cli.send_signal(stop_signal)
    assert cli.wait(30) == 130
    assert _wait_gone(pids, 1) == []
    assert not run.exists()
