"""GPUQuota for DRA claims, against the real API server and two operator replicas: a
ResourceClaim or ResourceClaimTemplate asking tessera's DeviceClasses in a namespace with a
GPUQuota gets its capacity stated from the GPUQuota's default, is refused with tessera's
message when it cannot be counted or is over ``max`` or ``hard``, and -- where the API server
drops capacity requests (DRAConsumableCapacity off: 1.34 and 1.35) -- is refused rather than
stored as a claim of whole devices nobody counted.  Other drivers' claims, and namespaces
without a GPUQuota, are not tessera's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG, LABEL_CLAIM_OF
from tessera.kube.client import ApiError, Kube, load_credentials, path
from tessera_e2e.controlplane.cluster import server_minor as cluster_server_minor
from tessera_e2e.operator.quotas import managed_rq, wait_admitting
from tessera_e2e.operator.tenants import tenant_kubeconfig

from .conftest import Operators
from .harness import kubectl_json, wait_until
from .test_quota_admission import quota, used

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]


def server_minor(cluster: Any) -> int:
    return cluster_server_minor(cluster.kubectl)


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
        default={"memory": "2Gi", "cores": 25}, max_={"memory": "10Gi"}))
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
        (claim(ns, "big", request(capacity={"requests": {"memory": "12Gi"}})),
         'the claim asks for 12288Mi of GPU memory in all, more than GPUQuota "team" allows '
         "one pod (max.memory 10240Mi)"),
        (claim(ns, "many", request(count=3, capacity={"requests": {"memory": "4Gi"}})),
         'the claim asks for 12288Mi of GPU memory in all'),
        # 9Gi, within max; with "plain" (2Gi) held, over hard (tessera's count or the API
        # server's, whichever sees it first); where capacity is dropped, refused for that
        (claim(ns, "wide", request(count=2, capacity={"requests": {"memory": "4Gi"}}),
               request(DRA_DEVICE_CLASS_MIG, "mig", capacity={"requests": {"memory": "1Gi"}})),
         "exceeded" if capacity_kept else "DRAConsumableCapacity feature gate is off"),
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


async def _create_claims(kubeconfig: Path, ns: str, bodies: list[str]
                         ) -> tuple[list[str], list[str]]:
    """Create the claims at once; the names admitted, and the refusals' messages."""
    kube = Kube(load_credentials(str(kubeconfig)))
    refusals: list[str] = []
    try:
        async def one(body: str) -> str | None:
            obj = json.loads(body)
            try:
                await kube.create(path("resource.k8s.io", "v1", "resourceclaims", ns), obj)
            except ApiError as exc:
                refusals.append(exc.message)
                return None
            return str(obj["metadata"]["name"])
        made = [n for n in await asyncio.gather(*(one(b) for b in bodies)) if n]
        return made, refusals
    finally:
        await kube.close()


def claim_holders(cluster: Any, ns: str) -> list[dict[str, Any]]:
    return list(kubectl_json(cluster, "get", "pods", "-n", ns, "-l", LABEL_CLAIM_OF)["items"])


def test_a_burst_of_claims_is_held_race_free_and_a_deleted_claim_frees_its_room(
        cluster: Any, namespace: str, ops: Operators, tmp_path: Path) -> None:
    """Eight claims of 2 GiB at once under hard 10Gi: exactly five are admitted, each held in
    the API server's count by a claim holder; a tenant cannot delete a holder; a dry run
    holds nothing; a deleted claim's holder goes and its room takes a new claim."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "10Gi", "cores": 1000, "pods": 10}))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    two_gib = request(capacity={"requests": {"memory": "2Gi", "cores": "10"}})
    bodies = [claim(ns, f"c{i}", two_gib) for i in range(8)]
    admitted, refusals = asyncio.run(_create_claims(cluster.kubeconfig, ns, bodies))
    if server_minor(cluster) < 36:  # capacity dropped: every claim refused, nothing held
        assert admitted == [] and claim_holders(cluster, ns) == []
        assert all("DRAConsumableCapacity" in r for r in refusals), refusals
        return
    assert len(admitted) == 5, (admitted, refusals)
    for r in refusals:  # the API server's count refused them (the burst outran tessera's)
        assert "no room for the claim in the namespace's GPUQuota count now" in r or \
            'exceeded GPUQuota "team"' in r, r
    holders = claim_holders(cluster, ns)
    uids = {kubectl_json(cluster, "get", "resourceclaim", n, "-n", ns)["metadata"]["uid"]
            for n in admitted}
    assert {h["metadata"]["labels"][LABEL_CLAIM_OF] for h in holders} == uids
    rq = managed_rq(cluster, ns) or {}
    assert rq["status"]["used"]["requests.tessera.dev/vgpu-memory"] == "10240"
    wait_until("the claims in GPUQuota status.used", lambda: (used(cluster, ns).get(
        "memory"), used(cluster, ns).get("cores")) == ("10Gi", 50), 20, 0.5)
    out = create(cluster, claim(ns, "one-more", two_gib))
    assert out.returncode != 0 and ('exceeded GPUQuota "team": tessera.dev/vgpu-memory '
                                    'requested 2Gi, used 10Gi, hard 10Gi') in out.stderr, \
        out.stderr

    tenant = tenant_kubeconfig(cluster, ns, tmp_path)
    name = holders[0]["metadata"]["name"]
    out = cluster.kubectl("--kubeconfig", str(tenant), "delete", "pod", name, "-n", ns)
    assert out.returncode != 0, f"a tenant deleted claim holder {name}"

    gone = admitted[0]
    out = cluster.kubectl("delete", "resourceclaim", gone, "-n", ns)
    assert out.returncode == 0, out.stderr
    wait_until("the deleted claim's holder gone", lambda: len(claim_holders(cluster, ns)) == 4,
               40, 0.5)
    # tessera's own check reads GPUQuota status.used, which follows the API server's count
    # a moment later (and the answering replica's watch a moment after that): the dry run,
    # which only that check answers, waits for it
    wait_until("the deleted claim out of GPUQuota status.used", lambda: used(cluster, ns).get(
        "memory") == "8Gi", 30, 0.5)
    refusals: list[str] = []

    def dry_run_admitted() -> bool:
        out = cluster.kubectl("create", "--dry-run=server", "-f", "-",
                              input=claim(ns, "dry", two_gib))
        if out.returncode != 0:
            refusals.append(out.stderr)
        return out.returncode == 0
    try:
        wait_until("a dry run of a claim in the freed room admitted", dry_run_admitted, 10, 0.5)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {refusals[-1]}") from None
    assert len(claim_holders(cluster, ns)) == 4  # a dry run holds nothing
    wait_until("room for a new claim", lambda: create(
        cluster, claim(ns, "again", two_gib)).returncode == 0, 30, 1)
    assert len(claim_holders(cluster, ns)) == 5


def refused_where_capacity_is_dropped(cluster: Any, ns: str, body: str) -> bool:
    """On an API server that drops a claim's capacity (1.34, 1.35: DRAConsumableCapacity
    off), a claim for a share of a tessera device under a GPUQuota is refused, saying why,
    and holds nothing: True there, False where capacity is kept."""
    if server_minor(cluster) >= 36:
        return False
    before = len(claim_holders(cluster, ns))
    out = create(cluster, body)
    assert out.returncode != 0 and "DRAConsumableCapacity" in out.stderr, out.stderr
    assert len(claim_holders(cluster, ns)) == before
    return True


def _holder_limits(cluster: Any, ns: str, claim_name: str) -> dict[str, str]:
    uid = kubectl_json(cluster, "get", "resourceclaim", claim_name, "-n", ns)["metadata"]["uid"]
    [holder] = [h for h in claim_holders(cluster, ns)
                if h["metadata"]["labels"][LABEL_CLAIM_OF] == uid]
    return dict(holder["spec"]["containers"][0]["resources"]["limits"])


def test_each_claim_is_one_gpu_pod_in_hard_pods_and_a_pod_using_claims_is_not_another(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """hard.pods 2: two claims are admitted, the third is refused saying a claim counts as
    a GPU pod; a pod that only uses a claim adds no GPU pod (it is admitted at hard.pods)."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "10Gi", "cores": 1000, "pods": 2},
        default={"memory": "1Gi", "cores": 10}))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    if refused_where_capacity_is_dropped(cluster, ns, claim(ns, "c0", request())):
        return
    for name in ("c0", "c1"):
        out = create(cluster, claim(ns, name, request(), request(name="two", count=2)))
        assert out.returncode == 0, out.stderr
    assert _holder_limits(cluster, ns, "c0") == {
        "tessera.dev/vgpu-memory": "3072", "tessera.dev/vgpu-cores": "30",
        "tessera.dev/pod": "1"}
    out = create(cluster, claim(ns, "c2", request()))
    assert out.returncode != 0, "a third claim admitted under hard.pods 2"
    # tessera's count refuses it, or the API server's when the leader's status lags
    assert ('exceeded GPUQuota "team": pods requested 1, used 2, hard 2' in out.stderr
            or "requests.tessera.dev/pod=2" in out.stderr), out.stderr
    assert "(a claim for tessera devices counts as one GPU pod in hard.pods)" in out.stderr, \
        out.stderr
    rq = managed_rq(cluster, ns) or {}
    assert rq["status"]["used"]["requests.tessera.dev/pod"] == "2"
    wait_until("the claims' pods in GPUQuota status.used", lambda: (
        used(cluster, ns).get("pods"), used(cluster, ns).get("memory")) == (2, "6Gi"), 20, 0.5)
    out = create(cluster, claim(ns, "c3", request()))  # now tessera's count sees them first
    assert out.returncode != 0 and ('exceeded GPUQuota "team": pods requested 1, used 2, hard 2 '
                                    "(a claim for tessera devices counts as one GPU pod in "
                                    "hard.pods)") in out.stderr, out.stderr
    # a pod that uses a claim is counted through its claim, not again as a GPU pod
    user = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "user", "namespace": ns},
            "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c0"}],
                     "containers": [{"name": "main", "image": "busybox",
                                     "resources": {"claims": [{"name": "gpu"}]}}]}}
    out = create(cluster, json.dumps(user))
    assert out.returncode == 0, out.stderr
    got = kubectl_json(cluster, "get", "pod", "user", "-n", ns)
    assert "tessera.dev/pod" not in json.dumps(got["spec"]["containers"])
    assert (managed_rq(cluster, ns) or {})["status"]["used"]["requests.tessera.dev/pod"] == "2"


def test_a_mig_class_claim_counts_the_instances_of_the_profile_it_pins(
        cluster: Any, namespace: str, ops: Operators) -> None:
    """migInstances {1g.10gb: 1} (an H100's): one MIG-class claim pinning 1g.10gb and
    stating no capacity (a whole instance, as a pod's tessera.dev/mig-1g.10gb) is admitted
    with nothing filled in, a second is refused, and one that pins no profile is refused
    with what to write; status.used shows the claim's pod and instance. Whole instances
    need no consumable capacity: this holds on 1.34 too."""
    ns = namespace
    cluster.wait_for_service_account(ns)
    out = cluster.kubectl("apply", "-f", "-", input=quota(
        ns, hard={"memory": "100Gi", "cores": 1000, "pods": 10,
                  "migInstances": {"1g.10gb": 1}},
        default={"memory": "9984Mi", "cores": 100}))
    assert out.returncode == 0, out.stderr
    wait_admitting(cluster, ns)
    pin = [{"cel": {"expression":
                    "device.attributes['gpu.tessera.dev'].migProfile  ==  '1g.10gb'"}}]
    out = create(cluster, claim(ns, "m0", request(DRA_DEVICE_CLASS_MIG, selectors=pin)))
    assert out.returncode == 0, out.stderr
    stored = kubectl_json(cluster, "get", "resourceclaim", "m0", "-n", ns)
    assert "capacity" not in stored["spec"]["devices"]["requests"][0]["exactly"], stored
    assert _holder_limits(cluster, ns, "m0") == {
        "tessera.dev/pod": "1", "tessera.dev/mig-1g.10gb": "1"}
    out = create(cluster, claim(ns, "m1", request(DRA_DEVICE_CLASS_MIG, selectors=pin)))
    assert out.returncode != 0, "a second 1g.10gb claim admitted under migInstances 1"
    assert ('exceeded GPUQuota "team": tessera.dev/mig-1g.10gb requested 1, used 1, hard 1'
            in out.stderr or "requests.tessera.dev/mig-1g.10gb=1" in out.stderr), out.stderr
    assert ("(each device a request through mig.gpu.tessera.dev takes counts as one instance "
            "of the profile it pins in hard.migInstances)") in out.stderr, out.stderr
    out = create(cluster, claim(ns, "any", request(DRA_DEVICE_CLASS_MIG)))
    assert out.returncode != 0, "a MIG-class claim that pins no profile admitted"
    assert ('spec.devices.requests[0].exactly.selectors: GPUQuota "team" limits MIG instances '
            "(hard.migInstances: 1g.10gb)") in out.stderr, out.stderr
    assert ("it pins none. Pin one profile, e.g. selectors: [{cel: {expression: "
            "'device.attributes[\"gpu.tessera.dev\"].migProfile == \"1g.10gb\"'}}]"
            ) in out.stderr, out.stderr
    # the class of any device is counted by memory and cores, as before (a share of a
    # device: refused where the API server drops capacity)
    shared = claim(ns, "shared", request(capacity={"requests": {"memory": "1Gi",
                                                                "cores": "10"}}))
    instances = {"1g.10gb": 1}
    if refused_where_capacity_is_dropped(cluster, ns, shared):
        # another whole instance instead (a profile the GPUQuota does not list: not limited,
        # as for pods), so that two pods count below
        out = create(cluster, claim(ns, "shared", request(DRA_DEVICE_CLASS_MIG, selectors=[
            {"cel": {"expression": pin[0]["cel"]["expression"].replace("1g.10gb", "2g.20gb")}}
        ])))
        instances["2g.20gb"] = 1
    else:
        out = create(cluster, shared)
    assert out.returncode == 0, out.stderr
    rq = managed_rq(cluster, ns) or {}
    assert rq["status"]["used"]["requests.tessera.dev/mig-1g.10gb"] == "1"
    assert rq["status"]["used"]["requests.tessera.dev/pod"] == "2"
    wait_until("the claims' pods and instances in GPUQuota status.used", lambda: (
        used(cluster, ns).get("pods"), used(cluster, ns).get("migInstances")) == (
            2, instances), 20, 0.5)
    out = create(cluster, claim(ns, "m2", request(DRA_DEVICE_CLASS_MIG, selectors=pin)))
    assert out.returncode != 0 and (
        'exceeded GPUQuota "team": tessera.dev/mig-1g.10gb requested 1, used 1, hard 1 (each '
        "device a request through mig.gpu.tessera.dev takes counts as one instance of the "
        "profile it pins in hard.migInstances)") in out.stderr, out.stderr
