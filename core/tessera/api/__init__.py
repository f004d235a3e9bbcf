"""tessera's API (``tessera.dev/v1alpha1``): the single source of truth for CRDs and clients.

Types live here apart from controllers (kubebuilder style); :mod:`tessera.api.crd`
generates ``crds/`` from them.
"""

from tessera.api.budget import (
    BudgetAnnotation,
    BudgetAnnotationError,
    PerShareBudget,
    parse_budget_annotation,
)
from tessera.api.conditions import (
    DEGRADED,
    PROGRESSING,
    READY,
    Condition,
    get_condition,
    is_true,
    set_condition,
)
from tessera.api.manifest import ManifestError, load_manifest
from tessera.api.meta import ObjectMeta
from tessera.api.names import (
    ANNOTATION_BUDGET,
    API_VERSION,
    GROUP,
    MIG_PREFIX,
    VERSION,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.api.partition import (
    GPUFilter,
    GPUPartition,
    GPUPartitionSpec,
    GPUPartitionStatus,
    Layout,
    NodePartitionStatus,
    ProfileCount,
    layout_summary,
)
from tessera.api.quantity import Quantity, QuantityError, parse_quantity, to_bytes
from tessera.api.quota import (
    GPUQuota,
    GPUQuotaSpec,
    GPUQuotaStatus,
    PodBudgetLimits,
    QuotaHard,
    QuotaUsage,
)
from tessera.api.resources import mig_resource_name, profile_from_resource
from tessera.api.selector import LabelSelector, LabelSelectorRequirement

__all__ = [
    "ANNOTATION_BUDGET",
    "API_VERSION",
    "DEGRADED",
    "GROUP",
    "MIG_PREFIX",
    "PROGRESSING",
    "READY",
    "VERSION",
    "VGPU",
    "VGPU_CORES",
    "VGPU_MEMORY",
    "BudgetAnnotation",
    "BudgetAnnotationError",
    "Condition",
    "GPUFilter",
    "GPUPartition",
    "GPUPartitionSpec",
    "GPUPartitionStatus",
    "GPUQuota",
    "GPUQuotaSpec",
    "GPUQuotaStatus",
    "LabelSelector",
    "LabelSelectorRequirement",
    "Layout",
    "ManifestError",
    "NodePartitionStatus",
    "ObjectMeta",
    "PerShareBudget",
    "PodBudgetLimits",
    "ProfileCount",
    "Quantity",
    "QuantityError",
    "QuotaHard",
    "QuotaUsage",
    "get_condition",
    "is_true",
    "layout_summary",
    "load_manifest",
    "mig_resource_name",
    "parse_budget_annotation",
    "parse_quantity",
    "profile_from_resource",
    "set_condition",
    "to_bytes",
]
