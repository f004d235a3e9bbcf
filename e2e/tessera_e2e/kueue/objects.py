"""Kueue's objects over tessera's resources, as the recipe (docs/kueue.md) writes them, for the
test bed's tests: ResourceFlavors per GPU model, ClusterQueues over tessera's resources with
the recipe's preemption, LocalQueues, queued Jobs, namespaces the recipe's manager
configuration manages; and what Kueue may admit for a namespace (the GPUQuota ceiling the
recipe asks for). Pure: nothing here talks to a cluster (:mod:`.running` does)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from tessera.api.names import LABEL_GPU_PRODUCT, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.api.quantity import quantity_value

API_VERSION = "kueue.x-k8s.io/v1beta2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
MANAGED_LABEL = {"kueue-managed": "true"}
"""What the recipe's ``managedJobsNamespaceSelector`` selects: its team namespaces."""
RECIPE_PREEMPTION: dict[str, Any] = {
    "reclaimWithinCohort": "Any",
    "borrowWithinCohort": {"policy": "LowerPriority", "maxPriorityThreshold": 100},
    "withinClusterQueue": "LowerPriority",
}
"""Both ClusterQueues of examples/kueue/20-cluster-queues.yaml preempt so."""
GPU_RESOURCES = (VGPU, VGPU_MEMORY, VGPU_CORES)

Doc = dict[str, Any]


@dataclass(frozen=True)
class Slot:
    """What one single-container pod holds and Kueue counts: one share of one GPU, a memory
    budget (MiB) and a core budget (percent of one GPU's SMs)."""

    memory_mib: int
    cores: int

    def limits(self) -> dict[str, str]:
        return {VGPU: "1", VGPU_MEMORY: str(self.memory_mib), VGPU_CORES: str(self.cores)}

    def quotas(self, nominal: int, borrowing: int | None = None,
               lending: int | None = None) -> list[Doc]:
        """A flavor's quotas for ``nominal`` such pods (and a borrowing and lending limit of
        that many pods)."""
        out = []
        for resource, each in ((VGPU, 1), (VGPU_MEMORY, self.memory_mib),
                               (VGPU_CORES, self.cores)):
            quota: Doc = {"name": resource, "nominalQuota": str(nominal * each)}
            if borrowing is not None:
                quota["borrowingLimit"] = str(borrowing * each)
            if lending is not None:
                quota["lendingLimit"] = str(lending * each)
            out.append(quota)
        return out


def flavor(name: str, model: str) -> Doc:
    """A ResourceFlavor for one GPU model: the Nodes tessera's daemon labels with it."""
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": {"nodeLabels": {LABEL_GPU_PRODUCT: model}}}


def cluster_queue(name: str, namespaces: Sequence[str], flavors: Mapping[str, list[Doc]],
                  cohort: str | None = None, fair_sharing: bool = False,
                  preemption: Mapping[str, Any] | None = None) -> Doc:
    """A ClusterQueue for the namespaces, whose one resource group covers tessera's shared
    GPU resources over ``flavors`` (name -> quotas, tried in order); ``fair_sharing``: its
    LocalQueues are ordered by decayed usage (admission fair sharing)."""
    spec: Doc = {
        "namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In",
            "values": list(namespaces)}]},
        "preemption": dict(preemption or RECIPE_PREEMPTION),
        "resourceGroups": [{"coveredResources": list(GPU_RESOURCES),
                            "flavors": [{"name": f, "resources": q}
                                        for f, q in flavors.items()]}],
    }
    if cohort:
        spec["cohortName"] = cohort
    if fair_sharing:
        spec["admissionScope"] = {"admissionMode": "UsageBasedAdmissionFairSharing"}
    return {"apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": spec}


def local_queue(namespace: str, name: str, cluster_queue: str,
                weight: str | None = None) -> Doc:
    spec: Doc = {"clusterQueue": cluster_queue}
    if weight is not None:
        spec["fairSharing"] = {"weight": weight}
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def managed_namespace(name: str) -> Doc:
    """A namespace the recipe's ``managedJobsNamespaceSelector`` selects (as its team ones)."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": dict(MANAGED_LABEL)}}


def queued_job(name: str, queue: str, pod_spec: Mapping[str, Any],
               backoff_limit: int = 6) -> Doc:
    """A one-pod Job in LocalQueue ``queue``: Kueue's webhook creates it suspended."""
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {QUEUE_LABEL: queue}},
            "spec": {"backoffLimit": backoff_limit, "template": {"spec": dict(pod_spec)}}}


def condition(obj: Mapping[str, Any], kind: str) -> str | None:
    """The status (``"True"``, ``"False"``) of the object's condition ``kind``; None if absent."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return str(cond.get("status"))
    return None


def quotas_of(cq: Mapping[str, Any]) -> list[tuple[str, str, Doc]]:
    """(flavor, resource, quota) for every quota of a ClusterQueue."""
    return [(f["name"], r["name"], r) for group in cq["spec"]["resourceGroups"]
            for f in group["flavors"] for r in f["resources"]]


def admissible(cq: Mapping[str, Any]) -> dict[str, Decimal]:
    """What Kueue may admit for one namespace of this ClusterQueue, per tessera resource:
    nominal + borrowing limit, summed over the flavors (the recipe's GPUQuota ``hard``).
    Outside a cohort nothing is borrowed; in one, a quota without ``borrowingLimit`` may
    borrow all the cohort lends, so it has no ceiling to match (ValueError)."""
    in_cohort = bool(cq["spec"].get("cohortName"))
    total: dict[str, Decimal] = defaultdict(Decimal)
    for _, resource, quota in quotas_of(cq):
        if not resource.startswith("tessera.dev/"):
            continue
        if in_cohort and "borrowingLimit" not in quota:
            raise ValueError(f"{cq['metadata']['name']}: {resource} has no borrowingLimit, "
                             "no ceiling to match")
        total[resource] += (quantity_value(str(quota["nominalQuota"]))
                            + quantity_value(str(quota.get("borrowingLimit", 0))))
    return dict(total)
