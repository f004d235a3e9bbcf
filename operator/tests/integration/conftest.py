"""Fixtures: CRDs + RBAC installed once, an operator (two replicas) behind a proxy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import (
    OPERATOR_NS,
    REPO,
    OperatorProcess,
    RoundRobinProxy,
    lease_holder,
    operator_kubeconfig,
    render_rbac,
    wait_until,
)


class Operators:
    """The replicas of this test session and the proxy in front of them."""

    def __init__(self, cluster: Any, kubeconfig: Path, logdir: Path) -> None:
        self.cluster = cluster
        self.kubeconfig = kubeconfig
        self.logdir = logdir
        self.proxy = RoundRobinProxy().start()
        self.replicas: dict[str, OperatorProcess] = {}

    def start(self, name: str) -> OperatorProcess:
        old = self.replicas.get(name)
        if old is not None:
            old.stop()
        rep = OperatorProcess(self.kubeconfig, self.proxy, self.logdir, name).start()
        self.replicas[name] = rep
        return rep

    def leader(self) -> OperatorProcess:
        name = wait_until("a leader", lambda: lease_holder(self.cluster) in self.replicas
                          and lease_holder(self.cluster), 30)
        return self.replicas[name]

    def ensure_running(self) -> None:
        for name in ("op-a", "op-b"):
            rep = self.replicas.get(name)
            if rep is None or rep.proc is None or rep.proc.poll() is not None:
                self.start(name)
        self.leader()
        wait_until("webhook configuration", lambda: self.cluster.kubectl(
            "get", "mutatingwebhookconfiguration", "tessera-pods").returncode == 0, 30)

    def stop_all(self) -> None:
        for rep in self.replicas.values():
            rep.stop()


@pytest.fixture(scope="session")
def operators(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operators]:
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        out = cluster.kubectl("apply", "--server-side", "-f", str(crd))
        assert out.returncode == 0, out.stderr
    for crd in ("gpupartitions.tessera.dev", "gpuquotas.tessera.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s")
    cluster.kubectl("create", "namespace", OPERATOR_NS)
    out = cluster.kubectl("apply", "-f", "-", input=render_rbac())
    assert out.returncode == 0, out.stderr
    logdir = tmp_path_factory.mktemp("operator-logs")
    ops = Operators(cluster, operator_kubeconfig(cluster, logdir), logdir)
    ops.ensure_running()
    yield ops
    ops.stop_all()
    for name in ("tessera-pods",):
        cluster.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
    cluster.kubectl("delete", "validatingwebhookconfiguration", "tessera-resources",
                    "--ignore-not-found")


@pytest.fixture
def ops(operators: Operators) -> Operators:
    operators.ensure_running()
    return operators
