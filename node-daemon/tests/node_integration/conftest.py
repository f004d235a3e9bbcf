"""Fixtures: the chart (CRDs, RBAC, policies) installed once; node daemons on simulated
nodes, each with its Node object and a pod-bound token, stopped and removed after the test."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.gpubed.daemons import NodeDaemonProcess, remove_sim_daemon, start_sim_daemon
from tessera_e2e.operator.replicas import install
from tessera_sim.node import Topology

StartDaemon = Callable[..., NodeDaemonProcess]


@pytest.fixture(scope="session")
def chart(cluster: Any) -> Any:
    install(cluster.kubectl)
    return cluster


@pytest.fixture
def start_daemon(chart: Any, tmp_path: Path) -> Iterator[StartDaemon]:
    """``start_daemon(["H100-80GB"] * 8, labels={...}, extra=[...], topology=...)`` -> a
    running daemon on a fresh Node named ``nd-<random>`` (``.node``) with its own simulated
    GPUs (``topology``: a ``tessera_sim.node.Topology``, default none)."""
    started: list[NodeDaemonProcess] = []

    def start(gpus: list[str], labels: dict[str, str] | None = None,
              extra: list[str] | None = None, name: str | None = None,
              topology: Topology | None = None) -> NodeDaemonProcess:
        d = start_sim_daemon(chart.kubectl, chart.kubeconfig, tmp_path, gpus, labels, extra,
                             name, topology)
        started.append(d)
        return d

    yield start
    for d in started:
        remove_sim_daemon(chart.kubectl, d)
