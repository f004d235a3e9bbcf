"""The session cluster is a real one: real versions, controllers and scheduler at work."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.controlplane.build import build_inputs
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.pki import WEBHOOK_CLIENT_NAME, write_pki
from tessera_e2e.operator.webhooks import ReviewServer

pytestmark = pytest.mark.integration


@pytest.mark.oldest_kubernetes
def test_client_and_server_report_the_pinned_version(cluster: LocalCluster) -> None:
    result = cluster.kubectl("version", "-o", "json")
    assert result.returncode == 0, result.stderr
    versions = json.loads(result.stdout)
    pinned = build_inputs().pins.kubernetes
    assert versions["clientVersion"]["gitVersion"] == pinned
    assert versions["serverVersion"]["gitVersion"] == pinned


def test_namespace_gets_a_default_service_account(cluster: LocalCluster, namespace: str) -> None:
    cluster.wait_for_service_account(namespace)
    got = cluster.kubectl("get", "serviceaccount", "default", "-n", namespace)
    assert got.returncode == 0, got.stderr


def test_deleted_namespace_goes_away(cluster: LocalCluster) -> None:
    assert cluster.kubectl("create", "namespace", "t-doomed").returncode == 0
    deleted = cluster.kubectl("delete", "namespace", "t-doomed", "--timeout=60s")
    assert deleted.returncode == 0, deleted.stderr
    assert "NotFound" in cluster.kubectl("get", "namespace", "t-doomed").stderr


def test_scheduler_considers_pods(cluster: LocalCluster, namespace: str) -> None:
    """No nodes exist, so a working scheduler marks the pod Unschedulable."""
    cluster.wait_for_service_account(namespace)
    got = cluster.kubectl("get", "serviceaccount", "default", "-n", namespace)
    assert got.returncode == 0, got.stderr
    pod = cluster.kubectl("run", "p", "-n", namespace, "--image=busybox", "--restart=Never")
    assert pod.returncode == 0, pod.stderr
    jsonpath = '{.status.conditions[?(@.type=="PodScheduled")].reason}'
    deadline = time.monotonic() + 30
    reason = ""
    while time.monotonic() < deadline and reason != "Unschedulable":
        reason = cluster.kubectl("get", "pod", "p", "-n", namespace, "-o",
                                 f"jsonpath={jsonpath}").stdout
        time.sleep(0.2)
    assert reason == "Unschedulable"


def test_the_api_server_shows_webhooks_its_client_certificate(
        cluster: LocalCluster, namespace: str, tmp_path: Path) -> None:
    """The AdmissionConfiguration gives every admission webhook the webhook client
    certificate, and a webhook that requires it (verified against its own CA) is called."""
    assert cluster.pki is not None
    seen: list[Any] = []

    def decide(_: dict[str, Any], peer: Any) -> tuple[bool, str]:
        seen.append(peer)
        return True, ""

    serving = write_pki(tmp_path / "serving")  # its CA and 127.0.0.1 serving certificate
    hook = ReviewServer(decide, serving.serving_cert, serving.serving_key,
                        client_ca=cluster.pki.webhook_client_ca)
    name = f"client-cert-{namespace}"
    config = hook.configuration(name, serving.ca_cert.read_bytes(), ["configmaps"], namespace)
    try:
        assert cluster.kubectl("apply", "-f", "-", input=json.dumps(config)).returncode == 0
        deadline = time.monotonic() + 20
        while not seen and time.monotonic() < deadline:
            cluster.kubectl("create", "configmap", f"c{len(seen)}-{time.monotonic_ns()}",
                            "-n", namespace)
            time.sleep(0.5)
        assert seen, "the webhook was never called with the client certificate"
        subject = dict(rdn[0] for rdn in seen[0]["subject"])
        assert subject["commonName"] == WEBHOOK_CLIENT_NAME
    finally:
        cluster.kubectl("delete", "validatingwebhookconfiguration", name, "--ignore-not-found")
        hook.stop()
