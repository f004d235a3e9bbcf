"""tessera's Kueue recipe (examples/kueue/) against tessera's own API, with no cluster: the
flavors select Nodes by the label the node daemons write and name real models, every GPU
quota is one of tessera's resources with a MIG profile the flavor's model has, each
namespace's GPUQuota ceiling holds all that Kueue may admit for it, and the manager
configuration leaves tessera's pod counter out and weighs every GPU resource. And the
renderer of Kueue's manifests, on the pinned module's own config/."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import yaml

from tessera.api.names import GPU_POD, LABEL_GPU_PRODUCT, MIG_PREFIX, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.api.quota import GPUQuota
from tessera.api.resources import profile_from_resource
from tessera.mig.catalog import profile as mig_profile
from tessera.models import get_model
from tessera_e2e.kueue.manager import RECIPE_CONFIG
from tessera_e2e.kueue.manifests import merge, module_source, render, serve_at
from tessera_e2e.kueue.objects import admissible, quotas_of
from tessera_e2e.paths import REPO

EXAMPLES = REPO / "examples" / "kueue"
MIB = 2**20


def _objects() -> dict[str, list[dict[str, Any]]]:
    by_kind: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for path in sorted(EXAMPLES.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if isinstance(doc, dict):
                by_kind[doc["kind"]].append(doc)
    return by_kind


OBJECTS = _objects()
FLAVORS = {f["metadata"]["name"]: f for f in OBJECTS["ResourceFlavor"]}
QUEUES = {q["metadata"]["name"]: q for q in OBJECTS["ClusterQueue"]}


def test_the_recipe_has_every_part() -> None:
    assert {"Namespace", "ResourceFlavor", "ClusterQueue", "LocalQueue", "GPUQuota",
            "Job"} <= set(OBJECTS)
    cohorts = {q["spec"].get("cohortName") for q in QUEUES.values()}
    assert cohorts == {"gpus"}, "both ClusterQueues lend and borrow in one cohort"
    for cq in QUEUES.values():
        preemption = cq["spec"]["preemption"]
        assert preemption["reclaimWithinCohort"] != "Never"
        assert preemption["borrowWithinCohort"]["policy"] != "Never"
    assert any(q["spec"].get("admissionScope", {}).get("admissionMode")
               == "UsageBasedAdmissionFairSharing" for q in QUEUES.values())
    limits = {k for cq in QUEUES.values() for _, _, r in quotas_of(cq) for k in r}
    assert {"borrowingLimit", "lendingLimit"} <= limits


def test_flavors_select_nodes_by_the_model_label_tessera_writes() -> None:
    gpu_flavors = [f for f in FLAVORS.values() if (f.get("spec") or {}).get("nodeLabels")]
    assert len(gpu_flavors) >= 2
    for flavor in gpu_flavors:
        labels = flavor["spec"]["nodeLabels"]
        assert set(labels) == {LABEL_GPU_PRODUCT}, flavor["metadata"]["name"]
        get_model(labels[LABEL_GPU_PRODUCT])  # a model ID tessera knows


def test_gpu_quotas_are_tesseras_resources_on_models_that_have_them() -> None:
    tessera = {VGPU, VGPU_MEMORY, VGPU_CORES}
    for cq in QUEUES.values():
        covered = set()
        for flavor, resource, _ in quotas_of(cq):
            if not resource.startswith("tessera.dev/"):
                assert resource in ("cpu", "memory"), resource
                continue
            covered.add(resource)
            assert resource in tessera or resource.startswith(MIG_PREFIX), resource
            if resource.startswith(MIG_PREFIX):
                name = profile_from_resource(resource)
                assert name is not None, resource
                model = FLAVORS[flavor]["spec"]["nodeLabels"][LABEL_GPU_PRODUCT]
                mig_profile(model, name)  # the flavor's model has this profile
        assert tessera <= covered, cq["metadata"]["name"]


def test_each_namespaces_gpuquota_ceiling_holds_what_kueue_may_admit() -> None:
    queue_of = {q["metadata"]["namespace"]: q["spec"]["clusterQueue"]
                for q in OBJECTS["LocalQueue"]}
    quotas = {q["metadata"]["namespace"]: GPUQuota.model_validate(q)
              for q in OBJECTS["GPUQuota"]}
    assert set(queue_of) == set(quotas)
    for namespace, quota in quotas.items():
        may_admit = admissible(QUEUES[queue_of[namespace]])
        hard = quota.spec.hard
        assert hard is not None and hard.cores is not None and hard.memory is not None
        assert hard.cores >= may_admit[VGPU_CORES], namespace
        assert hard.memory.value >= may_admit[VGPU_MEMORY] * MIB, namespace
        for resource, count in may_admit.items():
            profile = profile_from_resource(resource)
            if profile is not None:
                assert (hard.mig_instances or {}).get(profile, 0) >= count, (namespace,
                                                                              resource)


def test_manager_configuration_leaves_out_the_pod_counter_and_weighs_gpu_resources() -> None:
    config = yaml.safe_load(Path(RECIPE_CONFIG).read_text())
    selector = config["managedJobsNamespaceSelector"]["matchLabels"]
    labels = {n["metadata"]["name"]: n["metadata"].get("labels") or {}
              for n in OBJECTS["Namespace"]}
    for queue in OBJECTS["LocalQueue"]:
        namespace = queue["metadata"]["namespace"]
        assert selector.items() <= labels[namespace].items(), namespace
    assert {"batch/job", "pod"} <= set(config["integrations"]["frameworks"])
    assert config["resources"]["excludeResourcePrefixes"] == [GPU_POD]
    fair = config["admissionFairSharing"]
    assert fair["usageHalfLifeTime"]
    weights = fair["resourceWeights"]
    for cq in QUEUES.values():
        for _, resource, _ in quotas_of(cq):
            assert resource in weights, f"{resource} has no admission fair sharing weight"


def test_renderer_places_kueues_objects_as_kustomize_would() -> None:
    rendered = render(module_source())
    assert rendered.namespace == "kueue-system" and rendered.prefix == "kueue-"
    conversions = {d["metadata"]["name"] for d in rendered.crds
                   if d["spec"].get("conversion", {}).get("strategy") == "Webhook"}
    assert {"clusterqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io"} <= conversions
    for crd in rendered.crds:
        service = ((crd["spec"].get("conversion") or {}).get("webhook") or {}).get(
            "clientConfig", {}).get("service")
        if service:
            assert service == {"name": "kueue-webhook-service", "namespace": "kueue-system",
                               "path": "/convert"}
    hooks = {h["name"]: h for d in rendered.webhooks for h in d["webhooks"]}
    assert hooks["mpod.kb.io"]["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", "kueue-system"]
    assert hooks["mjob.kb.io"]["clientConfig"]["service"]["name"] == "kueue-webhook-service"
    binding = next(d for d in rendered.rbac if d["metadata"]["name"]
                   == "kueue-manager-rolebinding")
    assert binding["roleRef"]["name"] == "kueue-manager-role"
    assert binding["subjects"] == [{"kind": "ServiceAccount",
                                    "name": "kueue-controller-manager",
                                    "namespace": "kueue-system"}]
    served = serve_at(rendered.webhooks, "https://127.0.0.1:1234", b"CA")
    for doc in served:
        for hook in doc["webhooks"]:
            assert "service" not in hook["clientConfig"]
            assert hook["clientConfig"]["url"].startswith("https://127.0.0.1:1234/")


def test_merge_is_strategic_on_webhooks_only() -> None:
    base = {"webhooks": [{"name": "a", "x": 1}, {"name": "b", "x": 2}], "l": [1, 2]}
    patch = {"webhooks": [{"name": "b", "y": 3}], "l": [3]}
    assert merge(base, patch) == {"webhooks": [{"name": "a", "x": 1},
                                               {"name": "b", "x": 2, "y": 3}], "l": [3]}
