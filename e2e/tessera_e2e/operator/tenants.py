"""A namespace user, as a platform grants one: a ServiceAccount bound to Kubernetes' own
``edit`` ClusterRole in its namespace (pods, workloads, annotations; no quotas, no Nodes),
and a kubeconfig with its token -- what the attack tests act as."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tessera_e2e.operator.replicas import token_kubeconfig


def tenant_kubeconfig(cluster: Any, ns: str, directory: Path, name: str = "tenant") -> Path:
    cluster.wait_for_service_account(ns)
    for body in (
            {"apiVersion": "v1", "kind": "ServiceAccount",
             "metadata": {"name": name, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": f"{name}-edit", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "edit"},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]}):
        out = cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
    token = cluster.kubectl("create", "token", name, "-n", ns, "--duration", "2h")
    if token.returncode != 0:
        raise RuntimeError(token.stderr)
    return token_kubeconfig(cluster.kubeconfig, directory, token.stdout.strip(), f"{ns}-{name}")
