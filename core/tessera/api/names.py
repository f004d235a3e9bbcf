"""Every name tessera puts on the wire, defined once: API group and version, the kinds'
plural names, labels, annotations, extended resources and finalizers.

The operator, the node daemon, the webhooks, the chart's policies and the tests import these;
nothing else spells them out.  What each one means and who writes it is in
``docs/operator.md``.
"""

from __future__ import annotations

# -- API group and kinds ---------------------------------------------------------------------

GROUP = "tessera.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "tessera"
GPUPARTITIONS = "gpupartitions"
GPUQUOTAS = "gpuquotas"
PREFIX = f"{GROUP}/"
"""What every tessera label, annotation and resource name starts with."""

# -- extended resources a container asks for (totals per container) --------------------------

VGPU = f"{GROUP}/vgpu"
"""N shares, each on a different GPU or MIG instance (advertised by the device plugin)."""
VGPU_MEMORY = f"{GROUP}/vgpu-memory"
"""GPU memory in MiB, in total for the container."""
VGPU_CORES = f"{GROUP}/vgpu-cores"
"""Percent of one GPU's SMs, in total for the container (150 = one and a half GPUs)."""
MIG_PREFIX = f"{GROUP}/mig-"
"""Prefix of whole-MIG-instance resources, e.g. ``tessera.dev/mig-1g.10gb.me``."""
GPU_POD = f"{GROUP}/pod"
"""1 on one container of every GPU pod (the webhook writes it): what the managed
ResourceQuota counts GPU pods by (a ResourceQuota's ``pods`` counts every pod). Each GPU
node advertises as many as it may run pods."""

# -- pods ------------------------------------------------------------------------------------

ANNOTATION_BUDGET = f"{GROUP}/budget"
"""JSON, per container: the budget admission granted; the node daemon reads only this."""
LABEL_BUDGETED = f"{GROUP}/budgeted"
"""Set by the webhook on every admitted GPU pod (value ``true``), and by the operator's leader
on every pod a claim of tessera's is reserved for (value :data:`BUDGETED_CLAIMS`): the
operator's pod watch selects on it (the placement service only on ``true``)."""
BUDGETED_CLAIMS = "claims"
"""The :data:`LABEL_BUDGETED` value of a pod whose budgets are DRA claims."""
ANNOTATION_CLAIM_BUDGET = f"{GROUP}/claim-budget"
"""JSON, written by the operator on a pod using DRA claims once a live resize changed one: per
claim UID, its budget now and what its allocation took (:mod:`tessera.api.claim_budget`)."""
ANNOTATION_BUDGET_REQUEST = f"{GROUP}/budget-request"
"""JSON, set by the pod's user: a live resize (new memory/cores totals per container)."""
ANNOTATION_BUDGET_RESIZE = f"{GROUP}/budget-resize"
"""JSON, written by tessera: the outcome of the last budget request (Approved by the operator,
then Applied or Refused by the node daemon, or Refused by the operator); what the operator
acts on in it carries its seal."""
LABEL_GROWTH_OF = f"{GROUP}/growth-of"
"""On a growth holder (a pod tessera creates, never scheduled): the UID of the pod whose
live-resize growth it holds in the namespace's ResourceQuotas."""
LABEL_CLAIM_OF = f"{GROUP}/claim-of"
"""On a growth holder that holds a DRA claim's capacity (a *claim holder*): the claim's UID
(its ``growth-of`` label carries the same UID, so every protection of holders covers it)."""
GROWTH_HOLDER_PREFIX = "tessera-growth-"
"""Every growth holder's name starts so (users cannot create or evict pods named so)."""
SCHEDULING_GATE_GROWTH = f"{GROUP}/growth"
"""The scheduling gate that keeps a growth holder from ever being scheduled."""
REASON_RESIZED = "BudgetResized"
"""Event reason on a pod whose resize was applied."""
REASON_RESIZE_REFUSED = "BudgetResizeRefused"
"""Event reason on a pod whose resize was refused (the message says why)."""

# -- placement (the device-plugin path: tessera's scheduler extender) --------------------------

ANNOTATION_PLACEMENT = f"{GROUP}/placement"
"""JSON, written by the operator's placement service in the pod's Binding (so at the moment
it is bound, in the same write): which GPU or MIG instance each container of the pod uses
(:mod:`tessera.placement.record`). The node daemon's device plugin gives a container only
those units."""
ANNOTATION_NODE_POLICY = f"{GROUP}/node-policy"
"""Set by the pod's user: ``binpack`` (fill the busiest node that holds the pod) or
``spread`` (the emptiest); the chart sets the cluster default."""
ANNOTATION_GPU_POLICY = f"{GROUP}/gpu-policy"
"""Set by the pod's user: ``binpack`` (the fullest GPU or MIG instance that holds each
container) or ``spread`` (the emptiest)."""
ANNOTATION_GPU_MODELS = f"{GROUP}/gpu-models"
"""Set by the pod's user: comma-separated model IDs (``H100-80GB,A100-40GB``) the pod may use."""
ANNOTATION_GPU_MODELS_EXCLUDE = f"{GROUP}/gpu-models-exclude"
"""Set by the pod's user: comma-separated model IDs the pod must not use."""
ANNOTATION_GPU_UUIDS_EXCLUDE = f"{GROUP}/gpu-uuids-exclude"
"""Set by the pod's user: comma-separated GPU UUIDs (``GPU-…``) the pod must not use."""
ANNOTATION_GPU_TOPOLOGY = f"{GROUP}/gpu-topology"
"""Set by the pod's user, for containers of several GPUs: ``prefer`` (default: GPUs joined by
NVLink first, then on one NUMA node), ``nvlink`` (only GPUs all joined by NVLink), ``none``."""
ANNOTATION_PLACEMENT_URL = f"{GROUP}/placement-url"
"""On the operator's leader Lease: where the holder answers extender calls (the other
replicas forward there)."""
SCHEDULER_NAME = "tessera-scheduler"
"""The kube-scheduler profile (the chart's second scheduler) that calls tessera's extender;
the pod webhook sets it on GPU pods when the chart says so."""
PLACEMENT_PATH_PREFIX = "/placement"
"""The extender's URL path prefix on the operator's HTTPS port (``/placement/filter``, …)."""

# -- Dynamic Resource Allocation (the DRA path: tessera's kubelet plugin) ---------------------

DRA_DRIVER = "gpu.tessera.dev"
"""The DRA driver's name: ResourceSlices' ``spec.driver``, DeviceClass selectors, CDI vendor."""
DRA_CAPACITY_MEMORY = "memory"
"""Device capacity: bytes of device memory a claim consumes (a C identifier, as DRA wants)."""
DRA_CAPACITY_CORES = "cores"
"""Device capacity: percent of the unit's SM time a claim consumes."""
DRA_ATTRIBUTE_MIG_PROFILE = "migProfile"
"""Device attribute (under the driver's domain): a MIG instance's profile, the string a claim
pins in CEL, ``device.attributes["gpu.tessera.dev"].migProfile == "3g.40gb"``."""
DRA_DEVICE_CLASS = "gpu.tessera.dev"
"""The DeviceClass of any tessera device (a whole or shared GPU, a MIG instance): the chart's."""
DRA_DEVICE_CLASS_MIG = "mig.gpu.tessera.dev"
"""The DeviceClass of tessera's MIG instances only: the chart's."""
DRA_DEVICE_CLASSES = (DRA_DEVICE_CLASS, DRA_DEVICE_CLASS_MIG)
"""The DeviceClasses a claim asks tessera's devices through: the claims webhooks review
requests naming them, and the kubelet plugin prepares tessera's devices only for them."""

# -- Nodes (written by each node's daemon on its own Node) -----------------------------------

LABEL_GPU_PRODUCT = f"{GROUP}/gpu.product"
LABEL_GPU_COUNT = f"{GROUP}/gpu.count"
LABEL_MIG_CAPABLE = f"{GROUP}/mig.capable"
ANNOTATION_GPUS = f"{GROUP}/gpus"
"""JSON list, one object per GPU (the inventory contract)."""
ANNOTATION_PARTITION_STATUS = f"{GROUP}/partition-status"
"""JSON object keyed by GPUPartition: what the daemon did for each (the report contract)."""
ANNOTATION_NODE_FINDINGS = f"{GROUP}/node-findings"
"""JSON list of what the daemon found wrong or foreign on its node (another GPU device plugin
or MIG manager, a model table that disagrees with NVML, a GPU of unknown model)."""
ANNOTATION_GPU_COMMITMENTS = f"{GROUP}/gpu-commitments"
"""JSON object keyed by GPU/MIG UUID: the memory budgets committed there and the memory it
has (written by the daemon; what it decides resizes against)."""
NODE_DAEMON = "tessera-node"
"""The node daemon's name: its User-Agent (so its field manager) and its Events' component."""

# -- other GPU stacks a node daemon recognises on its node (it never touches them) -----------

NVIDIA_GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource NVIDIA's device plugin advertises."""
NVIDIA_MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
"""Extended resources of NVIDIA's device plugin in its mixed MIG strategy."""
NVIDIA_DEVICE_PLUGIN_SOCKET = "nvidia-gpu.sock"
"""Socket NVIDIA's device plugin registers in the kubelet's device-plugins directory."""
NVIDIA_MIG_CONFIG_LABEL = "nvidia.com/mig.config"
"""Label NVIDIA's MIG manager enacts (and ``nvidia.com/mig.config.state`` reports)."""
NVIDIA_MIG_MANAGER_DEPLOY_LABEL = "nvidia.com/gpu.deploy.mig-manager"
"""Label by which NVIDIA's GPU Operator schedules its MIG manager on a node."""
NVIDIA_DEVICE_PLUGIN_DEPLOY_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""Label by which NVIDIA's GPU Operator schedules its device plugin on a node."""

# -- the operator's own bookkeeping ----------------------------------------------------------

FINALIZER_RESET = f"{GROUP}/reset"
"""Held on ``deletionPolicy: Reset`` partitions until their GPUs are reset."""

# -- the ResourceQuota each GPUQuota manages (the race-free count at admission) --------------

MANAGED_QUOTA_PREFIX = "gpuquota-"
"""A GPUQuota ``team`` manages the ResourceQuota ``gpuquota-team`` in its namespace (so the
API server's refusal, ``exceeded quota: gpuquota-team``, names the GPUQuota)."""
LABEL_GPUQUOTA = f"{GROUP}/gpuquota"
"""On a managed ResourceQuota: the GPUQuota that owns it (its name, or, past 63 characters,
a cut of it ending in a digest: :func:`tessera_operator.quota.managed.label_value`)."""
ANNOTATION_GPUQUOTA_NAME = f"{GROUP}/gpuquota-name"
"""On a managed ResourceQuota: the owning GPUQuota's full name (for people; tessera matches
by the owner reference's UID)."""
FINALIZER_MANAGED_QUOTA = f"{GROUP}/managed-quota"
"""On a managed ResourceQuota: held while its GPUQuota exists. A delete then leaves it in
place, terminating, and the API server keeps counting with it: the count never lapses."""
QUOTA_REQUESTS_PREFIX = "requests."
"""What a ResourceQuota calls an extended resource it counts (``requests.tessera.dev/…``)."""
ANNOTATION_CERT_STEP_AT = f"{GROUP}/certificate-step-at"
"""On the webhook serving Secret: when the leader wrote the last step of a certificate
renewal (seconds since the epoch)."""
SEAL_KEY_SECRET = "tessera-seal-key"
"""The Secret (operator namespace) holding the key the leader seals resize records with."""
SEAL_KEY_FIELD = "key"
"""Its data field."""
