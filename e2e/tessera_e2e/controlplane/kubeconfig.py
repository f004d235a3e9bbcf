"""Kubeconfigs for the local cluster: cluster-admin (group system:masters) by default, or any
client certificate the cluster's CA signed (a node's kubelet, kube-proxy)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.pki import Pki

CONTEXT = "tessera-local"


def render_kubeconfig(
    server: str, pki: Pki, client: tuple[Path, Path] | None = None
) -> dict[str, Any]:
    """Pure: the kubeconfig document; file paths (not inline data) keep it readable.
    `client` is (certificate, key), the admin's when None."""
    cert, key = client or (pki.admin_cert, pki.admin_key)
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": CONTEXT,
            "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
        }],
        "users": [{
            "name": CONTEXT,
            "user": {
                "client-certificate": str(cert),
                "client-key": str(key),
            },
        }],
        "contexts": [{
            "name": CONTEXT,
            "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"},
        }],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(
    path: Path, server: str, pki: Pki, client: tuple[Path, Path] | None = None
) -> Path:
    path.write_text(yaml.safe_dump(render_kubeconfig(server, pki, client), sort_keys=False))
    path.chmod(0o600)
    return path
