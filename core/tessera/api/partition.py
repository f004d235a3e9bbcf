"""GPUPartition (cluster-scoped): which nodes and GPUs get which MIG layout.

The operator is the only writer of the status.  Node daemons report on their own Node
objects (:mod:`tessera.api.node_report`) and the operator copies the selected nodes' reports
into ``status.nodes.<node>``: one writer per object, so fifty daemons answering a layout
change at once never conflict.  ``nodes`` is a map keyed by node name.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, Self

from pydantic import ConfigDict, Field, ValidationError, model_validator

from tessera.api.conditions import Condition, Timestamp
from tessera.api.crdtools import LIST_SET, cel, list_map
from tessera.api.meta import ApiModel, FieldPathError, ObjectMeta
from tessera.api.profile import ProfileName
from tessera.api.selector import LabelSelector

log = logging.getLogger("tessera.api")

KIND = "GPUPartition"
PLURAL = "gpupartitions"

ModelID = Literal[
    "A100-40GB", "A100-80GB", "A30-24GB", "H100-80GB", "H100-94GB", "H100-96GB",
    "H200-141GB", "B200-180GB",
]
"""Known GPU model IDs; a test keeps this equal to :func:`tessera.models.model_ids`."""

MigMode = Literal["Enabled", "Disabled", "OnDemand"]
DisruptionPolicy = Literal["WaitForIdle", "Refuse"]
DeletionPolicy = Literal["Retain", "Reset"]
Sharing = Literal["Whole", "Shares"]
NodePhase = Literal["Pending", "Applying", "WaitingForIdle", "Ready", "Failed"]

MAX_GPU_INDEX = 63
GPUIndex = Annotated[int, Field(ge=0, le=MAX_GPU_INDEX)]


class GPUFilter(ApiModel):
    """Narrows the selected nodes' GPUs; a GPU must pass every list that is set."""

    models: list[ModelID] | None = Field(
        default=None, min_length=1, max_length=8, json_schema_extra=LIST_SET
    )
    """Only GPUs of these models (tessera model IDs, e.g. H100-80GB)."""
    indices: list[GPUIndex] | None = Field(
        default=None, min_length=1, max_length=64, json_schema_extra=LIST_SET
    )
    """Only GPUs at these NVML indices on each node."""

    @model_validator(mode="after")
    def _bounded_indices(self) -> Self:
        if self.indices is not None and len(set(self.indices)) != len(self.indices):
            raise FieldPathError("indices", "must not repeat an index")
        if self.models is not None and len(set(self.models)) != len(self.models):
            raise FieldPathError("models", "must not repeat a model")
        return self


class ProfileCount(ApiModel):
    """``count`` instances of one MIG profile on every selected GPU."""

    name: ProfileName
    """MIG profile name as NVIDIA spells it for the GPU model, e.g. 3g.40gb or 1g.10gb+me."""
    count: int = Field(ge=1, le=7)
    """Instances of this profile per GPU."""


_PROFILES_WHEN_DISABLED = cel(
    "!has(self.migMode) || self.migMode != 'Disabled' || !has(self.profiles)"
    " || size(self.profiles) == 0",
    "profiles must be empty when migMode is Disabled",
    ".profiles",
)
_PROFILES_WHEN_ENABLED = cel(
    "(has(self.migMode) && self.migMode != 'Enabled') || (has(self.profiles)"
    " && size(self.profiles) > 0)",
    "profiles must list at least one MIG profile when migMode is Enabled",
    ".profiles",
)
_PROFILES_WHEN_ON_DEMAND = cel(
    "!has(self.migMode) || self.migMode != 'OnDemand' || !has(self.profiles)"
    " || size(self.profiles) == 0",
    "profiles must be empty when migMode is OnDemand: its instances are created for the "
    "claims that ask them (bound them with onDemand)",
    ".profiles",
)
_ON_DEMAND_ONLY_WHEN_ON_DEMAND = cel(
    "!has(self.onDemand) || (has(self.migMode) && self.migMode == 'OnDemand')",
    "onDemand applies only with migMode OnDemand",
    ".onDemand",
)


class OnDemand(ApiModel):
    """Bounds on the instances created on demand (``migMode: OnDemand``)."""

    profiles: list[ProfileName] | None = Field(
        default=None, min_length=1, max_length=16, json_schema_extra=LIST_SET
    )
    """Only these profiles are created (as the GPU model spells them); every profile of
    the model when absent."""
    max_instances: int | None = Field(default=None, ge=1, le=7)
    """At most this many instances per GPU at once; the model's limit when absent."""
    keep_whole: int | None = Field(default=None, ge=1, le=64)
    """On each node, at least this many of the partition's GPUs are kept with no instance
    for whole-GPU work: while no more are empty, an empty GPU takes only an instance of the
    whole GPU (7g.80gb on an H100, 4g.24gb on an A30). None: none kept."""


class Layout(ApiModel):
    """What every selected GPU should look like: MIG instances, or MIG disabled."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [_PROFILES_WHEN_DISABLED, _PROFILES_WHEN_ENABLED,
                                         _PROFILES_WHEN_ON_DEMAND,
                                         _ON_DEMAND_ONLY_WHEN_ON_DEMAND]
        }
    )

    mig_mode: MigMode = "Enabled"
    """Enabled: partition each GPU into profiles; Disabled: whole GPUs, shared by budgets;
    OnDemand: MIG enabled, and an instance is created for each DRA claim that asks one and
    destroyed when it is released (bounded by onDemand)."""
    profiles: list[ProfileCount] | None = Field(
        default=None, max_length=16, json_schema_extra=list_map("name")
    )
    """Profiles and counts per GPU; the set must fit the GPU (checked at admission)."""
    on_demand: OnDemand | None = None
    """With migMode OnDemand: which profiles may be created, and how many at once."""

    @model_validator(mode="after")
    def _profiles_match_mode(self) -> Self:
        if self.mig_mode == "Disabled" and self.profiles:
            raise FieldPathError("profiles", _PROFILES_WHEN_DISABLED["message"])
        if self.mig_mode == "Enabled" and not self.profiles:
            raise FieldPathError("profiles", _PROFILES_WHEN_ENABLED["message"])
        if self.mig_mode == "OnDemand" and self.profiles:
            raise FieldPathError("profiles", _PROFILES_WHEN_ON_DEMAND["message"])
        if self.on_demand is not None and self.mig_mode != "OnDemand":
            raise FieldPathError("onDemand", _ON_DEMAND_ONLY_WHEN_ON_DEMAND["message"])
        names = [p.name for p in self.profiles or []]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise FieldPathError(f"profiles[{i}].name", f"profile {name} is listed twice")
        return self

    def profile_names(self) -> list[str]:
        """The layout as a multiset of profile names, e.g. for the planner."""
        return [p.name for p in self.profiles or [] for _ in range(p.count)]


def _slices(name: str) -> int:
    match = re.search(r"(\d+)g\.", name)
    return int(match.group(1)) if match else 0


def layout_summary(layout: Layout) -> str:
    """Printer-column text: ``1x3g.40gb+4x1g.10gb`` (largest first), or ``MIG disabled``."""
    if layout.mig_mode == "Disabled":
        return "MIG disabled"
    if layout.mig_mode == "OnDemand":
        bounds = layout.on_demand
        only = f" ({','.join(bounds.profiles)})" if bounds and bounds.profiles else ""
        return f"MIG on demand{only}"
    ordered = sorted(layout.profiles or [], key=lambda p: (-_slices(p.name), p.name))
    return "+".join(f"{p.count}x{p.name}" for p in ordered)


class GPUPartitionSpec(ApiModel):
    """Desired MIG layout for the GPUs of the nodes the selector picks."""

    node_selector: LabelSelector
    """Nodes this partition applies to; {} selects every node."""
    gpus: GPUFilter | None = None
    """Optional filter on the selected nodes' GPUs; all GPUs when absent."""
    layout: Layout
    """The layout every selected GPU gets."""
    disruption_policy: DisruptionPolicy = "WaitForIdle"
    """A GPU that must change but runs work: WaitForIdle defers the change until it is idle;
    Refuse leaves it alone and reports the node as Failed."""
    deletion_policy: DeletionPolicy = "Retain"
    """On deletion: Retain leaves the GPUs as they are; Reset destroys the MIG instances and
    disables MIG once the GPUs are idle (disruptionPolicy applies), returning whole GPUs."""
    sharing: Sharing = "Whole"
    """How each MIG instance of this layout is handed out: Whole, one container per instance
    (tessera.dev/mig-<profile>); Shares, shared by budgets (tessera.dev/vgpu shares). Never
    both: the device plugin advertises each instance under one resource only. GPUs with MIG
    disabled are always shared."""


class MigInstanceStatus(ApiModel):
    """One GPU instance (and its compute instance) as the node daemon found it."""

    profile: ProfileName
    """Profile name as this GPU's model spells it."""
    start: int = Field(ge=0, le=7)
    """Placement start slot."""
    size: int | None = Field(default=None, ge=1, le=8)
    """Placement size in slots."""
    gi_id: int | None = Field(default=None, ge=0)
    """GPU instance ID."""
    ci_id: int | None = Field(default=None, ge=0)
    """Compute instance ID."""
    uuid: str | None = None
    """MIG device UUID (MIG-...)."""
    busy: bool = False
    """Whether processes were running on it."""
    claim: str | None = None
    """The ResourceClaim (namespace/name) it was made for (migMode OnDemand, DRA)."""
    pod: str | None = None
    """The pod (namespace/name) it was made for, or that holds it now (migMode OnDemand,
    device plugin)."""


class GPUStatus(ApiModel):
    """One physical GPU of the node."""

    index: int = Field(ge=0)
    """NVML index."""
    uuid: str | None = None
    """GPU UUID (GPU-...)."""
    model: str | None = None
    """tessera model ID, if the model is known."""
    mig_enabled: bool = False
    """Current MIG mode."""
    instances: list[MigInstanceStatus] = Field(default_factory=list)
    """MIG instances present now."""


class NodePartitionStatus(ApiModel):
    """What one node daemon reports for this partition (copied from its Node's report)."""

    phase: NodePhase = "Pending"
    """Pending, Applying, WaitingForIdle, Ready or Failed."""
    observed_generation: int | None = Field(default=None, ge=0)
    """The partition generation this report is about."""
    message: str | None = None
    """Why the node is not Ready, in plain words."""
    reason: str | None = None
    """Why, as one CamelCase word: InUse, LayoutDoesNotFit, CommandFailed, RebootRequired
    (a MIG mode change only a reboot finishes), ResetPending."""
    last_update_time: Timestamp | None = None
    """When the daemon last wrote this entry."""
    gpus: list[GPUStatus] = Field(default_factory=list)
    """The node's GPUs that this partition covers."""


class MigDemand(ApiModel):
    """An instance asked of a node daemon for a pod that no instance could hold (migMode
    OnDemand, device plugin): the operator's placement service writes it, the daemon makes
    it, and the scheduler places the pod on it once the node advertises it."""

    node: str
    """The node whose daemon makes it."""
    gpu: str
    """The GPU's UUID (GPU-...)."""
    gpu_index: int = Field(ge=0)
    """The GPU's NVML index on that node."""
    profile: ProfileName
    """Profile name as the GPU's model spells it."""
    start: int = Field(ge=0, le=7)
    """Placement start slot."""
    pod: str
    """The pending pod (namespace/name) it is made for."""
    pod_uid: str
    """That pod's UID."""


def demand_of(partitions: Iterable[Mapping[str, Any]]) -> list[tuple[str, MigDemand]]:
    """Every ``status.demand`` entry of the partitions (objects as the API returns them),
    with its partition's name; an entry that does not read is left out (it is logged; the
    placement service's next write replaces it)."""
    out = []
    for obj in partitions:
        name = str((obj.get("metadata") or {}).get("name", ""))
        for raw in ((obj.get("status") or {}).get("demand") or []):
            try:
                out.append((name, MigDemand.model_validate(raw)))
            except ValidationError as exc:
                log.warning("status.demand entry not readable; ignored",
                            extra={"partition": name, "error": str(exc)[:300]})
    return out


class GPUPartitionStatus(ApiModel):
    """Observed state, written by the operator alone."""

    observed_generation: int | None = Field(default=None, ge=0)
    """metadata.generation the operator last reconciled."""
    conditions: list[Condition] = Field(default_factory=list, json_schema_extra=list_map("type"))
    """Ready, Progressing, Degraded."""
    selected_nodes: list[str] = Field(default_factory=list)
    """Names of the nodes the selector picks now (operator)."""
    selected_node_count: int = Field(default=0, ge=0)
    """Number of selected nodes (printer column)."""
    ready_node_count: int = Field(default=0, ge=0)
    """Selected nodes whose entry is Ready at the current generation (printer column)."""
    layout: str | None = None
    """Layout summary such as 1x3g.40gb+4x1g.10gb (printer column)."""
    nodes: dict[str, NodePartitionStatus] = Field(default_factory=dict)
    """Per-node reports keyed by node name, copied from the selected nodes' daemons."""
    demand: list[MigDemand] = Field(default_factory=list)
    """migMode OnDemand: the instances asked of the nodes for pending pods, until each pod
    is placed (the operator's placement service)."""


class GPUPartition(ApiModel):
    """A MIG layout for a set of nodes' GPUs."""

    api_version: Literal["tessera.dev/v1alpha1"] = "tessera.dev/v1alpha1"
    kind: Literal["GPUPartition"] = "GPUPartition"
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    spec: GPUPartitionSpec
    status: GPUPartitionStatus | None = None

