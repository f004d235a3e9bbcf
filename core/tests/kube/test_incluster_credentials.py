"""In a pod, credentials come from the mounted ServiceAccount token (no kubeconfig)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kubernetes.config import incluster_config

from tessera.kube.client import load_credentials
from tessera_operator.webhooks.certs import make_serving_cert


@pytest.fixture
def token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A pod's service account mount (token and CA) and its API server's environment."""
    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    ca.write_bytes(make_serving_cert(["10.0.0.1"], days=1).ca_pem)
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    return token


def test_the_pod_token_is_sent_as_one_bearer_token(token: Path) -> None:
    token.write_text("eyJhbGciOi.payload.sig")
    creds = load_credentials(None)
    # the in-cluster loader says "bearer <token>"; the API server wants one "Bearer <token>"
    assert creds.headers["Authorization"] == "Bearer eyJhbGciOi.payload.sig"
    assert creds.token == "eyJhbGciOi.payload.sig"
    assert creds.server == "https://10.0.0.1:443"


def test_the_pod_token_is_read_again_once_a_minute_old(token: Path) -> None:
    """The kubelet renews the projected token in place; the client follows within a minute
    (and at once after a 401: operator/tests/operator_integration/test_token_renewal.py)."""
    token.write_text("first")
    creds = load_credentials(None)
    assert creds.token_file == str(token) and creds.current_token() == "first"
    token.write_text("renewed\n")
    assert creds.current_token() == "first"  # read less than a minute ago
    assert creds.current_token(max_age_s=0) == "renewed"
    token.unlink()  # unreadable: the last token read stays (the API server judges it)
    assert creds.current_token(max_age_s=0) == "renewed"
