"""GPUQuota for DRA claims, against the real API server and two operator replicas: a
ResourceClaim or ResourceClaimTemplate asking tessera's DeviceClasses in a namespace with a
GPUQuota gets its capacity stated from the GPUQuota's default, is refused with tessera's
message when it cannot be counted or is over ``max`` or ``hard``, and -- where the API server
drops capacity requests (DRAConsumableCapacity off: 1.34 and 1.35) -- is refused rather than
stored as a claim of whole devices nobody counted.  Other drivers' claims, and namespaces
without a GPUQuota, are not tessera's."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tessera.api.names import DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG
from tessera_e2e.operator.quotas import wait_admitting

from .conftest import Operators
from .harness import kubectl_json
from .test_quota_admission import quota

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]


def server_minor(cluster: Any) -> int:
    out = cluster.kubectl("version", "-o", "json")
    assert out.returncode == 0, out.stderr
    return int(re.match(r"\d+", json.loads(out.stdout)["serverVersion"]["minor"]).group())


def claim(ns: str, name: str, *requests: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                       "metadata": {"name": name, "namespace": ns},
                       "spec": {"devices": {"requests": list(requests)}}})


def request(cls: str = DRA_DEVICE_CLASS, name: str = "gpu", **kw: Any) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, **kw}}


def create(cluster: Any, body: str) -> Any:
    return cluster.kubectl("create", "-f", "-", input=body)


def test_a_claim_for_tessera_devices_is_stated_counted_and_refused_with_tessera_s_messages(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "10Gi", "cores": 1000, "pods": 10},
        default={"memory": "2Gi", "cores": 25}, max_={"memory": "16Gi"}))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    capacity_kept = server_minor(cluster) >= 36

    # a claim that states nothing gets the GPUQuota's default
    out = create(cluster, claim(ns, "plain", request()))
    if capacity_kept:
        assert out.returncode == 0, out.stderr
        got = kubectl_json(cluster, "get", "resourceclaim", "plain", "-n", ns)
        assert got["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"] == {
            "memory": "2Gi", "cores": "25"}
    else:  # the API server dropped what admission stated: refused, never stored uncounted
        assert out.returncode != 0
        assert "capacity.requests: memory and cores not stated" in out.stderr, out.stderr
        assert "DRAConsumableCapacity feature gate is off" in out.stderr, out.stderr
        gone = cluster.kubectl("get", "resourceclaim", "plain", "-n", ns)
        assert gone.returncode != 0 and "NotFound" in gone.stderr

    # what cannot be counted, or is over max or hard, is refused naming the field and quota
    refusals = [
        (claim(ns, "all", request(allocationMode="All")),
         "spec.devices.requests[0].exactly.allocationMode: All takes every matching tessera "
         "device, which a GPUQuota cannot count"),
        (claim(ns, "admin", request(adminAccess=True)),
         "spec.devices.requests[0].exactly.adminAccess: admin access reaches tessera devices"),
        (claim(ns, "big", request(capacity={"requests": {"memory": "20Gi"}})),
         'the claim asks for 20480Mi of GPU memory in all, more than GPUQuota "team" allows '
         "one pod (max.memory 16384Mi)"),
        (claim(ns, "many", request(count=3, capacity={"requests": {"memory": "4Gi"}})),
         'exceeded GPUQuota "team": tessera.dev/vgpu-memory requested 12Gi'),
        (claim(ns, "wide", request(count=2, capacity={"requests": {"memory": "4Gi"}}),
               request(DRA_DEVICE_CLASS_MIG, "mig", capacity={"requests": {"memory": "3Gi"}})),
         'exceeded GPUQuota "team": tessera.dev/vgpu-memory requested 11Gi'),
    ]
    for body, says in refusals:
        out = create(cluster, body)
        assert out.returncode != 0, f"admitted: {body}"
        assert says in out.stderr, out.stderr

    # a template is stated at its own path; another driver's request is not touched
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": "t", "namespace": ns},
                "spec": {"spec": {"devices": {"requests": [
                    request(name="gpu", capacity={"requests": {"cores": "50"}}),
                    request("nic.example.com", name="nic")]}}}}
    out = create(cluster, json.dumps(template))
    if capacity_kept:
        assert out.returncode == 0, out.stderr
        got = kubectl_json(cluster, "get", "resourceclaimtemplate", "t", "-n", ns)
        reqs = got["spec"]["spec"]["devices"]["requests"]
        assert reqs[0]["exactly"]["capacity"]["requests"] == {"memory": "2Gi", "cores": "50"}
        assert "capacity" not in reqs[1]["exactly"]
    else:
        assert out.returncode != 0 and "DRAConsumableCapacity" in out.stderr, out.stderr


def test_claims_not_for_tessera_devices_and_namespaces_without_a_gpuquota_pass_untouched(
        cluster: Any, namespace: str, ops: Operators) -> None:
    ns = namespace
    cluster.wait_for_service_account(ns)
    # no GPUQuota: nothing is counted, nothing stated (as for pods)
    out = create(cluster, claim(ns, "free", request()))
    assert out.returncode == 0, out.stderr
    got = kubectl_json(cluster, "get", "resourceclaim", "free", "-n", ns)
    assert "capacity" not in got["spec"]["devices"]["requests"][0]["exactly"]
    # with a GPUQuota, another driver's claim is not tessera's to review
    out = cluster.kubectl("apply", "-f", "-", input=quota(ns))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    out = create(cluster, claim(ns, "nic", request("nic.example.com", allocationMode="All")))
    assert out.returncode == 0, out.stderr
