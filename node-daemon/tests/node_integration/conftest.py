"""Fixtures: the chart (CRDs, RBAC, policies) installed once; node daemons on simulated
nodes, each with its Node object and a pod-bound token, stopped and removed after the test."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.node_daemons import (
    NodeDaemonProcess,
    SimNode,
    create_node,
    daemon_kubeconfig,
)
from tessera_e2e.operators import OPERATOR_NS, install

StartDaemon = Callable[..., NodeDaemonProcess]


@pytest.fixture(scope="session")
def chart(cluster: Any) -> Any:
    install(cluster.kubectl)
    return cluster


@pytest.fixture
def start_daemon(chart: Any, tmp_path: Path) -> Iterator[StartDaemon]:
    """``start_daemon(["H100-80GB"] * 8, labels={...}, extra=[...])`` -> a running daemon
    on a fresh Node named ``nd-<random>`` (``.node``) with its own simulated GPUs."""
    started: list[NodeDaemonProcess] = []

    def start(gpus: list[str], labels: dict[str, str] | None = None,
              extra: list[str] | None = None, name: str | None = None) -> NodeDaemonProcess:
        node = name or f"nd-{uuid.uuid4().hex[:8]}"
        create_node(chart.kubectl, node, labels)
        kubeconfig = daemon_kubeconfig(chart.kubectl, chart.kubeconfig, tmp_path, node)
        d = NodeDaemonProcess(node, SimNode(tmp_path / "sim", node, gpus), kubeconfig,
                              tmp_path, extra)
        started.append(d)
        return d.start()

    yield start
    for d in started:
        d.stop()
        chart.kubectl("delete", "pod", f"tessera-node-{d.node}", "-n", OPERATOR_NS,
                      "--wait=false")
        chart.kubectl("delete", "node", d.node, "--wait=false")
