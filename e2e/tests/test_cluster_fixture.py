"""The session cluster is a real one: real versions, controllers and scheduler at work."""

from __future__ import annotations

import json
import time

import pytest

from tessera_e2e.build import build_inputs
from tessera_e2e.cluster import LocalCluster

pytestmark = pytest.mark.integration


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
