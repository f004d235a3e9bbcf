"""Kueue on the test bed: the pinned build, its manager started against a local cluster with
the module's own CRDs and webhooks, a Job held until Kueue admits it, and tessera's Kueue
recipe (examples/kueue/) accepted by Kueue's and tessera's CRDs and webhooks.

The cluster is the module's own (no nodes): Kueue's pod webhook fails closed for every
namespace but kube-system and kueue-system, which the session's shared cluster must not get.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera_e2e.controlplane.build import KUEUE_VERSION_ARGS, kueue_product, product_up_to_date
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.kueue.manager import LocalKueue
from tessera_e2e.kueue.objects import QUEUE_LABEL, condition, managed_namespace
from tessera_e2e.kueue.running import apply, get_json, kueue_on, wait_active
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.paths import REPO

pytestmark = pytest.mark.integration

EXAMPLES = REPO / "examples" / "kueue"


@pytest.fixture(scope="module")
def kueue_bed(bin_dir: Path, kueue_binary: Path, request: pytest.FixtureRequest
              ) -> Iterator[tuple[LocalCluster, LocalKueue]]:
    cluster = LocalCluster(bin_dir, default_layout(),
                           report=lambda line: print(f"[kueue cluster] {line}"))
    try:
        cluster.start()
        for crd in sorted((REPO / "crds").glob("*.yaml")):  # GPUQuota, for the recipe
            out = cluster.kubectl("apply", "--server-side", "-f", str(crd))
            assert out.returncode == 0, out.stderr
        with kueue_on(cluster, kueue_binary) as kueue:
            yield cluster, kueue
    except (ControlPlaneError, TimeoutError) as error:
        cluster.stop(keep_logs=True)
        pytest.fail(f"Kueue on the test bed: {error}", pytrace=False)
    cluster.stop(keep_logs=request.session.testsfailed > 0)


def test_built_kueue_reports_the_pinned_version(kueue_binary: Path) -> None:
    product = kueue_product(default_layout())
    assert product_up_to_date(product)
    pinned = product.inputs["kueue"]
    assert pinned.startswith("v0.17."), pinned
    out = subprocess.run([str(kueue_binary), *KUEUE_VERSION_ARGS], capture_output=True,
                         text=True, timeout=60, check=False)
    assert f'"gitVersion": "{pinned}"' in out.stderr or f'"gitVersion":"{pinned}"' in out.stderr, \
        out.stderr[-2000:]


def test_manager_runs_with_its_crds_established_and_webhooks_served(
        kueue_bed: tuple[LocalCluster, LocalKueue]) -> None:
    cluster, kueue = kueue_bed
    for name in kueue.rendered.crd_names():
        crd = get_json(cluster, "crd", name)
        assert condition(crd, "Established") == "True", name
    assert kueue.webhook_answers()
    hooks = get_json(cluster, "mutatingwebhookconfiguration",
                     "kueue-mutating-webhook-configuration")
    assert {"mpod.kb.io", "mjob.kb.io"} <= {h["name"] for h in hooks["webhooks"]}
    # v1beta1 is still served: a v1beta2 object read as v1beta1 goes through the conversion
    # webhook the manager serves (v1beta2 `cohortName` is v1beta1 `cohort`)
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
          "metadata": {"name": "conversion-check"},
          "spec": {"cohortName": "checks", "resourceGroups": []}}
    out = apply(cluster, [cq])
    assert out.returncode == 0, out.stderr
    old = get_json(cluster, "clusterqueues.v1beta1.kueue.x-k8s.io", "conversion-check")
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["cohort"] == "checks"
    cluster.kubectl("delete", "clusterqueue", "conversion-check")


def _managed_namespace(cluster: LocalCluster, name: str) -> None:
    out = apply(cluster, [managed_namespace(name)])
    assert out.returncode == 0, out.stderr


def _queue_objects(namespace: str, quota: int) -> list[dict[str, Any]]:
    flavor = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
              "metadata": {"name": "bed-h100"},
              "spec": {"nodeLabels": {"tessera.dev/gpu.product": "H100-80GB"}}}
    resources = [{"name": "cpu", "nominalQuota": "8"}, {"name": "memory", "nominalQuota": "16Gi"},
                 {"name": "tessera.dev/vgpu", "nominalQuota": str(quota)},
                 {"name": "tessera.dev/vgpu-memory", "nominalQuota": str(quota * 20480)},
                 {"name": "tessera.dev/vgpu-cores", "nominalQuota": str(quota * 50)}]
    cq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
          "metadata": {"name": "bed-cq"},
          "spec": {"namespaceSelector": {},
                   "resourceGroups": [{"coveredResources": [r["name"] for r in resources],
                                       "flavors": [{"name": "bed-h100",
                                                    "resources": resources}]}]}}
    lq = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
          "metadata": {"name": "bed-lq", "namespace": namespace},
          "spec": {"clusterQueue": "bed-cq"}}
    return [flavor, cq, lq]


def test_job_waits_suspended_until_admitted_then_runs_on_the_flavors_model(
        kueue_bed: tuple[LocalCluster, LocalKueue]) -> None:
    cluster, _ = kueue_bed
    namespace = "kueue-bed-job"
    _managed_namespace(cluster, namespace)
    queues = _queue_objects(namespace, quota=0)  # no GPU quota yet
    out = apply(cluster, queues)
    assert out.returncode == 0, out.stderr
    wait_active(cluster, queues[1:])
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "small", "namespace": namespace,
                        "labels": {QUEUE_LABEL: "bed-lq"}},
           "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
               "name": "c", "image": "busybox",
               "resources": {"requests": {"cpu": "100m", "memory": "64Mi"},
                             "limits": {"tessera.dev/vgpu": "1",
                                        "tessera.dev/vgpu-memory": "20480",
                                        "tessera.dev/vgpu-cores": "50"}}}]}}}}
    out = apply(cluster, [job])
    assert out.returncode == 0, out.stderr
    stored = get_json(cluster, "job", "small", "-n", namespace)
    assert stored["spec"]["suspend"] is True  # Kueue's webhook suspended it at creation

    def workload() -> dict[str, Any] | None:
        items = get_json(cluster, "workloads", "-n", namespace)["items"]
        return items[0] if items else None

    pending = wait_until("the Job's Workload", workload, 30)
    time.sleep(3)  # several scheduling passes: nothing fits a zero quota
    pending = workload()
    assert pending is not None and condition(pending, "Admitted") != "True"
    assert get_json(cluster, "job", "small", "-n", namespace)["spec"]["suspend"] is True
    out = apply(cluster, _queue_objects(namespace, quota=1))  # room for the Job
    assert out.returncode == 0, out.stderr
    admitted = wait_until("the Workload admitted", lambda: (w := workload()) is not None
                          and condition(w, "Admitted") == "True" and w, 60)
    flavors = admitted["status"]["admission"]["podSetAssignments"][0]["flavors"]
    assert flavors["tessera.dev/vgpu-memory"] == "bed-h100"
    running = wait_until("the Job unsuspended", lambda: (j := get_json(
        cluster, "job", "small", "-n", namespace))["spec"].get("suspend") is False
        and j, 30)
    selector = running["spec"]["template"]["spec"].get("nodeSelector") or {}
    assert selector.get("tessera.dev/gpu.product") == "H100-80GB"


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def test_recipe_examples_are_accepted_and_their_queues_become_active(
        kueue_bed: tuple[LocalCluster, LocalKueue]) -> None:
    """examples/kueue/ against Kueue's CRDs and webhooks and tessera's CRDs: a server-side
    dry run of every object (the Job through Kueue's Job webhook), then the queues for real:
    Kueue finds each ClusterQueue's flavors and activates it."""
    cluster, _ = kueue_bed
    files = sorted(EXAMPLES.glob("*.yaml"))
    assert files[0].name == "00-namespaces.yaml"
    out = cluster.kubectl("apply", "-f", str(files[0]))  # dry-run objects need namespaces
    assert out.returncode == 0, out.stderr
    for path in files[1:]:
        out = cluster.kubectl("apply", "--dry-run=server", "-f", str(path))
        assert out.returncode == 0, f"{path.name}: {out.stderr}"
    for path in files[1:]:
        if all(d["kind"] != "Job" for d in _docs(path)):
            out = cluster.kubectl("apply", "-f", str(path))
            assert out.returncode == 0, f"{path.name}: {out.stderr}"
    queues = [d for path in files for d in _docs(path)
              if d["kind"] in ("ClusterQueue", "LocalQueue")]
    assert len(queues) == 5  # research, inference; team-a, team-b, team-c's LocalQueues
    wait_active(cluster, queues)


def test_kueue_admits_and_tessera_budgets_the_same_pods(
        kueue_bed: tuple[LocalCluster, LocalKueue], tmp_path_factory: pytest.TempPathFactory
        ) -> None:
    """Both on one cluster, as the recipe sets them up: Kueue's webhooks hold a Job (suspend)
    and a plain Pod (scheduling gate) until its quota admits them; tessera's webhook writes
    each pod's budget, filling the GPUQuota's default. The Pod carries tessera's
    ``tessera.dev/pod`` counter, which the recipe's configuration keeps out of Kueue's
    count: without that, no ClusterQueue covering only GPU resources would admit it."""
    from tessera_e2e.operator.quotas import wait_admitting
    from tessera_e2e.operator.replicas import LocalOperators

    cluster, _ = kueue_bed
    assert cluster.pki is not None
    ops = LocalOperators(cluster.kubectl, cluster.kubeconfig,
                         tmp_path_factory.mktemp("kueue-operator-logs"),
                         webhook_client_ca=cluster.pki.webhook_client_ca).setup()
    try:
        ops.ensure_running()
        namespace = "kueue-bed-tessera"
        _managed_namespace(cluster, namespace)
        cluster.wait_for_service_account(namespace)
        quota = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
                 "metadata": {"name": "team", "namespace": namespace},
                 "spec": {"hard": {"memory": "100Gi", "cores": 400},
                          "default": {"memory": "8Gi", "cores": 25}}}
        assert apply(cluster, [quota]).returncode == 0
        wait_admitting(cluster, namespace)
        out = apply(cluster, _queue_objects(namespace, quota=4))
        assert out.returncode == 0, out.stderr
        limits = {"tessera.dev/vgpu": "1", "tessera.dev/vgpu-memory": "20480",
                  "tessera.dev/vgpu-cores": "50"}
        job = {"apiVersion": "batch/v1", "kind": "Job",
               "metadata": {"name": "job", "namespace": namespace,
                            "labels": {QUEUE_LABEL: "bed-lq"}},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{
                   "name": "c", "image": "busybox",
                   "resources": {"requests": {"cpu": "100m"}, "limits": limits}}]}}}}
        plain = {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": "plain", "namespace": namespace,
                              "labels": {QUEUE_LABEL: "bed-lq"}},
                 "spec": {"containers": [{"name": "c", "image": "busybox", "resources": {
                     "requests": {"cpu": "100m"}, "limits": {"tessera.dev/vgpu": "1"}}}]}}
        out = apply(cluster, [job, plain])
        assert out.returncode == 0, out.stderr
        created = get_json(cluster, "pod", "plain", "-n", namespace)
        gates = [g["name"] for g in created["spec"].get("schedulingGates") or []]
        assert "kueue.x-k8s.io/admission" in gates  # Kueue holds it
        plain_limits = created["spec"]["containers"][0]["resources"]["limits"]
        assert plain_limits["tessera.dev/pod"] == "1"  # tessera's counter
        assert plain_limits["tessera.dev/vgpu-memory"] == "8192"  # the GPUQuota's default
        assert "tessera.dev/budget" in created["metadata"]["annotations"]

        def released() -> dict[str, Any] | None:
            pod = get_json(cluster, "pod", "plain", "-n", namespace)
            return None if pod["spec"].get("schedulingGates") else pod

        admitted = wait_until("the plain Pod admitted (gate removed)", released, 60)
        assert admitted["spec"]["nodeSelector"]["tessera.dev/gpu.product"] == "H100-80GB"

        def job_pod() -> dict[str, Any] | None:
            items = get_json(cluster, "pods", "-n", namespace, "-l",
                          "job-name=job")["items"]
            return items[0] if items else None

        pod = wait_until("the admitted Job's pod", job_pod, 60)
        budget = json.loads(pod["metadata"]["annotations"]["tessera.dev/budget"])
        assert budget["containers"]["c"]["memoryBytes"] == 20480 * 2**20
        assert pod["spec"]["nodeSelector"]["tessera.dev/gpu.product"] == "H100-80GB"
        workloads = get_json(cluster, "workloads", "-n", namespace)["items"]
        assert len(workloads) == 2
        for workload in workloads:
            assert condition(workload, "Admitted") == "True"
            usage = workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
            assert "tessera.dev/pod" not in usage
            assert usage["tessera.dev/vgpu"] == "1"
        # the plain Pod's Workload is made from the stored Pod: the GPUQuota's default counts
        plain_workload = next(w for w in workloads if w["metadata"]["name"].startswith("pod-"))
        usage = plain_workload["status"]["admission"]["podSetAssignments"][0]["resourceUsage"]
        assert usage["tessera.dev/vgpu-memory"] == "8192"
        # outside the namespaces the recipe's managedJobsNamespaceSelector selects, Kueue
        # leaves even a queued Pod alone
        assert cluster.kubectl("create", "namespace", "kueue-bed-unmanaged").returncode == 0
        cluster.wait_for_service_account("kueue-bed-unmanaged")
        outside = {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": "outside", "namespace": "kueue-bed-unmanaged",
                                "labels": {QUEUE_LABEL: "bed-lq"}},
                   "spec": {"containers": [{"name": "c", "image": "busybox"}]}}
        out = apply(cluster, [outside])
        assert out.returncode == 0, out.stderr
        left = get_json(cluster, "pod", "outside", "-n", "kueue-bed-unmanaged")
        assert not left["spec"].get("schedulingGates")
    finally:
        ops.stop_all()
        ops.uninstall_webhooks()
