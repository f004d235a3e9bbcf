"""Test helpers over :mod:`tessera_e2e.operator.replicas` (the operator on a local cluster)."""

from __future__ import annotations

from typing import Any

from tessera_e2e.controlplane.cluster import kubectl_json
from tessera_e2e.operator.replicas import (
    OPERATOR_NS,
    LocalOperators,
    OperatorProcess,
    RoundRobinProxy,
    operator_kubeconfig,
    render_chart,
    wait_until,
)
from tessera_e2e.operator.replicas import lease_holder as _lease_holder
from tessera_e2e.paths import REPO

__all__ = ["OPERATOR_NS", "REPO", "LocalOperators", "OperatorProcess", "RoundRobinProxy",
           "kubectl_json", "lease_holder", "operator_kubeconfig", "render_chart", "wait_until"]


def lease_holder(cluster: Any) -> str:
    return _lease_holder(cluster.kubectl)
