"""pytest fixtures for tests against the real local control plane.

- `cluster` (session): one LocalCluster for the whole run; `cluster.kubectl(*args)` returns a
  CompletedProcess, `cluster.kubeconfig` and `cluster.server` say where it is.
- `namespace` (per test): a fresh namespace, deleted afterwards.
- `node_cluster` (session): a second LocalCluster with DEFAULT_NODES real nodes (kubelet,
  containerd, runc, kube-proxy); `node_namespace` (per test) is a fresh namespace in it.
  Started only when a test asks for it.
- `chart_bed` (module): a two-node cluster of the module's own with tessera installed by
  `helm install` of charts/tessera (the operator Deployment, the node DaemonSet, the images the
  test bed builds), as a `gpu_bed.Bed`; `chart_namespace` (per test) is a fresh namespace in it.
- `operators` (session) / `ops` (per test, restarted when a test stopped them): the operator's
  two replicas on `cluster`, behind a loopback proxy, with the chart's RBAC and policies
  (`tessera_e2e.operator.replicas.LocalOperators`).
- `parse_quantity_reference` (session): the path of the built `parse-quantity` program,
  apimachinery's own quantity parser, to test tessera's against.
- `kueue_binary` (session): Kueue's controller-manager, built unless its stamp says it is
  current (`make controlplane` builds it first); start it on a cluster with
  `tessera_e2e.kueue.running.kueue_on`.

The binaries must be built first (`make controlplane`): a missing build fails the tests with
that instruction rather than silently skipping them. Component logs are kept when any test
failed, and their path is printed in the summary.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tessera_e2e.controlplane.build import build_inputs, ensure_kueue
from tessera_e2e.controlplane.cache import BINARIES, default_layout
from tessera_e2e.controlplane.cluster import DEFAULT_NODES, LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError

if TYPE_CHECKING:  # imported when used: they need sim/ and node-daemon/ on the path
    from tessera_e2e.chart.bed import ChartDaemon
    from tessera_e2e.gpubed.bed import Bed
    from tessera_e2e.operator.replicas import LocalOperators

_kept_logs: list[str] = []


BUILT_FIXTURES = ("cluster", "node_cluster", "chart_bed", "parse_quantity_reference")
"""Fixtures that need the control plane build (`make controlplane`)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Anything using the build is an integration test (`-m "not integration"` skips it)."""
    for item in items:
        if set(BUILT_FIXTURES) & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def parse_quantity_reference() -> Path:
    """apimachinery's ParseQuantity as a program (e2e/controlplane/cmd/parse-quantity): one
    quantity per line on stdin, one answer per line on stdout."""
    binary = default_layout().binary(build_inputs().pins, "parse-quantity")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"{binary} is missing: run `make controlplane` first", pytrace=False)
    return binary


@pytest.fixture(scope="session")
def kueue_binary() -> Path:
    try:
        return ensure_kueue()
    except ControlPlaneError as error:
        pytest.fail(f"building Kueue: {error}", pytrace=False)


def _session_cluster(request: pytest.FixtureRequest, nodes: int) -> Iterator[LocalCluster]:
    layout = default_layout()
    bin_dir = layout.bin_dir(build_inputs().pins)
    local = LocalCluster(bin_dir, layout, nodes=nodes,
                         report=lambda line: print(f"[cluster] {line}"))
    try:
        local.start()
    except ControlPlaneError as error:
        pytest.fail(f"local cluster: {error}", pytrace=False)
    yield local
    kept = local.stop(keep_logs=request.session.testsfailed > 0)
    if kept is not None:
        _kept_logs.append(str(kept))


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    """The built binaries, for tests that start clusters of their own."""
    path = default_layout().bin_dir(build_inputs().pins)
    missing = [name for name in BINARIES if not (path / name).exists()]
    if missing:
        pytest.fail(f"{', '.join(missing)} not built in {path}: run `make controlplane`",
                    pytrace=False)
    return path


@pytest.fixture(scope="session")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    yield from _session_cluster(request, nodes=0)


@pytest.fixture(scope="session")
def node_cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    yield from _session_cluster(request, nodes=DEFAULT_NODES)


@pytest.fixture(scope="module")
def chart_bed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory,
              request: pytest.FixtureRequest) -> Iterator[Bed[ChartDaemon]]:
    from tessera_e2e.chart.bed import chart_bed as installed_chart

    try:
        with installed_chart(bin_dir, tmp_path_factory.mktemp("chart-bed"),
                             keep_logs=lambda: request.session.testsfailed > 0) as bed:
            yield bed
    except ControlPlaneError as error:
        pytest.fail(f"chart-installed cluster: {error}", pytrace=False)


@pytest.fixture
def chart_namespace(chart_bed: Bed[ChartDaemon], request: pytest.FixtureRequest
                    ) -> Iterator[str]:
    yield from _namespace(chart_bed.cluster, request)


@pytest.fixture(scope="session")
def operators(cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[LocalOperators]:
    from tessera_e2e.operator.replicas import LocalOperators

    assert cluster.pki is not None
    ops = LocalOperators(cluster.kubectl, cluster.kubeconfig,
                         tmp_path_factory.mktemp("operator-logs"),
                         webhook_client_ca=cluster.pki.webhook_client_ca).setup()
    ops.ensure_running()
    yield ops
    ops.stop_all()
    ops.uninstall_webhooks()


@pytest.fixture
def ops(operators: LocalOperators) -> LocalOperators:
    operators.ensure_running()
    return operators


@pytest.fixture
def namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _namespace(cluster, request)


@pytest.fixture
def node_namespace(node_cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    yield from _namespace(node_cluster, request)


def _namespace(cluster: LocalCluster, request: pytest.FixtureRequest) -> Iterator[str]:
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t-{slug}-{uuid.uuid4().hex[:6]}"
    created = cluster.kubectl("create", "namespace", name)
    if created.returncode != 0:
        pytest.fail(f"cannot create namespace {name}: {created.stderr.strip()}", pytrace=False)
    cluster.wait_for_service_account(name)  # a pod made before it is refused
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for path in _kept_logs:
        terminalreporter.write_line(f"control plane component logs kept in {path}")
