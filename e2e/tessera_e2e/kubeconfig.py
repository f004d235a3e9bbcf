"""A cluster-admin kubeconfig for the local cluster (client certificate, group system:masters)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.pki import Pki

CONTEXT = "tessera-local"


def render_kubeconfig(server: str, pki: Pki) -> dict[str, Any]:
    """Pure: the kubeconfig document; file paths (not inline data) keep it readable."""
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
                "client-certificate": str(pki.admin_cert),
                "client-key": str(pki.admin_key),
            },
        }],
        "contexts": [{
            "name": CONTEXT,
            "context": {"cluster": CONTEXT, "user": CONTEXT, "namespace": "default"},
        }],
        "current-context": CONTEXT,
        "preferences": {},
    }


def write_kubeconfig(path: Path, server: str, pki: Pki) -> Path:
    path.write_text(yaml.safe_dump(render_kubeconfig(server, pki), sort_keys=False))
    path.chmod(0o600)
    return path
