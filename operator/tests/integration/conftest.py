"""Fixtures: CRDs + RBAC installed once, the operator (two replicas) behind a proxy."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tessera_e2e.operator.replicas import LocalOperators

Operators = LocalOperators


@pytest.fixture(scope="session")
def operators(cluster: Any, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[LocalOperators]:
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
