"""The node inventory contract: how a node daemon publishes its GPUs on its Node object.

Selection uses labels (cheap, server-side ``labelSelector``); the per-GPU detail the
operator needs to check layouts and claims lives in one annotation, because labels cannot
hold structured values.  The node daemon writes both; the operator only reads them.

Labels::

    tessera.dev/gpu.product = H100-80GB   # model ID from tessera.models (mixed: first GPU's)
    tessera.dev/gpu.count   = 8
    tessera.dev/mig.capable = "true" | "false"

Annotation ``tessera.dev/gpus`` -- a JSON list, one object per GPU::

    [{"index": 0, "uuid": "GPU-…", "model": "H100-80GB", "memoryMiB": 81559,
      "migMode": "enabled" | "disabled" | "unsupported",
      "instances": [{"profile": "3g.40gb", "start": 0, "uuid": "MIG-…"}],
      "numaNode": 0, "pciBusId": "00000000:1B:00.0",
      "nvlinkPeers": ["GPU-…"],
      "units": [{"uuid": "MIG-…", "resource": "tessera.dev/vgpu", "memoryMiB": 40192,
                 "shares": 10, "healthy": true, "profile": "3g.40gb", "start": 0}],
      "onDemand": {"partition": "lab", "profiles": ["3g.40gb"], "maxInstances": 4}}]

``numaNode`` (null when NVML does not say), ``pciBusId`` and ``nvlinkPeers`` (the GPUs this
one reaches over an active NVLink) are the GPU's topology. ``units`` is what the device
plugin advertises on this GPU, exactly: one entry per unit (the whole GPU, or one MIG
instance with a compute instance), under the one resource it is offered as
(``tessera.dev/vgpu`` with ``shares`` shares, or ``tessera.dev/mig-<profile>`` whole, shares
0), its memory and health. The placement service places pods on these units; a daemon that
does not write ``units`` (older than placement) leaves it absent, and its node holds no pod
the placement service places (it says so). ``onDemand`` (absent for other GPUs) marks a
GPU of a partition with ``migMode: OnDemand`` whose instances the daemon makes for pods the
placement service asks them for, within the partition's bounds.

What the daemon did for each GPUPartition travels the same way, in a second annotation on
the same Node (see :mod:`tessera.api.node_report`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tessera.api.names import (
    ANNOTATION_GPUS,
    ANNOTATION_PARTITION_STATUS,
    LABEL_GPU_COUNT,
    LABEL_GPU_PRODUCT,
    LABEL_MIG_CAPABLE,
)
from tessera.api.node_report import ReportError, parse_reports
from tessera.api.partition import NodePartitionStatus
from tessera.models import get_model

MigMode = Literal["enabled", "disabled", "unsupported"]


class InventoryError(ValueError):
    """A Node's inventory annotation or labels cannot be read (message says why)."""


class _Model(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore", frozen=True)


class MigInstance(_Model):
    """One MIG GPU instance as NVML reports it."""

    profile: str
    start: int = Field(ge=0)
    uuid: str = ""


class AdvertisedUnit(_Model):
    """One unit the device plugin advertises: a whole GPU or one MIG instance."""

    uuid: str
    """``GPU-…`` or ``MIG-…``: what a container sees as one CUDA device."""
    resource: str
    """``tessera.dev/vgpu`` (shared) or ``tessera.dev/mig-<profile>`` (whole)."""
    memory_mib: int = Field(alias="memoryMiB", ge=0)
    shares: int = Field(ge=0, default=0)
    """Shares advertised on it (``tessera.dev/vgpu``); 0 for a whole instance."""
    healthy: bool = True
    profile: str | None = None
    """MIG profile; None for a whole GPU."""
    start: int | None = Field(default=None, ge=0)
    """MIG placement start slot; None for a whole GPU."""


class OnDemandOffer(_Model):
    """A GPU of a partition with ``migMode: OnDemand`` on a node whose device plugin makes
    instances for pending pods: which partition, and its bounds."""

    partition: str
    profiles: tuple[str, ...] = ()
    """Only these profiles are made (empty: every profile of the model)."""
    max_instances: int | None = Field(alias="maxInstances", default=None, ge=1)
    keep_whole: int | None = Field(alias="keepWhole", default=None, ge=1)
    """Of the partition's GPUs on this node, how many are kept with no instance."""


class GPUInventory(_Model):
    """One physical GPU of a node."""

    index: int = Field(ge=0)
    uuid: str
    model: str
    memory_mib: int = Field(alias="memoryMiB", ge=0)
    mig_mode: MigMode = Field(alias="migMode", default="disabled")
    instances: tuple[MigInstance, ...] = ()
    numa_node: int | None = Field(alias="numaNode", default=None)
    pci_bus_id: str = Field(alias="pciBusId", default="")
    nvlink_peers: tuple[str, ...] = Field(alias="nvlinkPeers", default=())
    """UUIDs of the GPUs joined to this one by an active NVLink."""
    units: tuple[AdvertisedUnit, ...] | None = None
    """What the device plugin advertises on this GPU; None: the daemon does not say."""
    on_demand: OnDemandOffer | None = Field(alias="onDemand", default=None)
    """Set when the GPU's instances are made for pending pods (MIG on demand, device
    plugin); None: a declared layout, or instances made for DRA claims."""


class NodeInventory(_Model):
    """Everything the operator knows about one node's GPUs."""

    name: str
    labels: dict[str, str] = Field(default_factory=dict)
    """All the node's labels (partition node selectors match any of them)."""
    product: str | None = None
    count: int = 0
    mig_capable: bool = False
    gpus: tuple[GPUInventory, ...] = ()
    error: str | None = None
    """Why the annotation could not be read; the node then offers no GPUs."""
    reports: dict[str, NodePartitionStatus] = Field(default_factory=dict)
    """The daemon's report per GPUPartition name (``tessera.dev/partition-status``)."""
    report_error: str | None = None
    """Why that annotation could not be read; every partition then sees the node Failed."""

    def report(self, partition: str) -> NodePartitionStatus | None:
        """This node's report for ``partition`` (None when the daemon has not written one)."""
        if self.report_error is not None:
            return NodePartitionStatus(phase="Failed", message=self.report_error)
        return self.reports.get(partition)

    def gpu(self, index: int) -> GPUInventory | None:
        for g in self.gpus:
            if g.index == index:
                return g
        return None


def parse_gpus(raw: str) -> tuple[GPUInventory, ...]:
    """Parse the ``tessera.dev/gpus`` annotation value; raise InventoryError on bad input."""
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise InventoryError(f"{ANNOTATION_GPUS} is not JSON: {exc.msg}") from exc
    if not isinstance(data, list):
        raise InventoryError(f"{ANNOTATION_GPUS} must be a JSON list of GPUs")
    try:
        gpus = tuple(GPUInventory.model_validate(item) for item in data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise InventoryError(f"{ANNOTATION_GPUS}: {where}: {first['msg']}") from exc
    seen: set[int] = set()
    for g in gpus:
        if g.index in seen:
            raise InventoryError(f"{ANNOTATION_GPUS}: GPU index {g.index} listed twice")
        seen.add(g.index)
        try:
            get_model(g.model)
        except (KeyError, ValueError) as exc:
            raise InventoryError(f"{ANNOTATION_GPUS}: GPU {g.index}: unknown model {g.model!r}"
                                 ) from exc
    return tuple(sorted(gpus, key=lambda g: g.index))


def from_node(node: Mapping[str, Any]) -> NodeInventory:
    """Read a Node object (a dict as the API returns it) into its inventory.

    Never raises: a node with an unreadable annotation gets ``error`` set and no GPUs, so
    one bad node degrades the partitions selecting it instead of stopping reconciliation.
    """
    meta = node.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    annotations: Mapping[str, str] = meta.get("annotations") or {}
    name = str(meta.get("name", ""))
    try:
        count = int(labels.get(LABEL_GPU_COUNT, "0"))
    except ValueError:
        count = 0
    error: str | None = None
    gpus: tuple[GPUInventory, ...] = ()
    raw = annotations.get(ANNOTATION_GPUS)
    if raw is None:
        error = f"node has no {ANNOTATION_GPUS} annotation"
    else:
        try:
            gpus = parse_gpus(raw)
        except InventoryError as exc:
            error = str(exc)
    reports: dict[str, NodePartitionStatus] = {}
    report_error: str | None = None
    raw_reports = annotations.get(ANNOTATION_PARTITION_STATUS)
    if raw_reports is not None:
        try:
            reports = parse_reports(raw_reports)
        except ReportError as exc:
            report_error = str(exc)
    return NodeInventory(
        name=name,
        labels=dict(labels),
        product=labels.get(LABEL_GPU_PRODUCT),
        count=count,
        mig_capable=labels.get(LABEL_MIG_CAPABLE, "false").lower() == "true",
        gpus=gpus,
        error=error,
        reports=reports,
        report_error=report_error,
    )


def to_annotation(gpus: tuple[GPUInventory, ...] | list[GPUInventory]) -> str:
    """Serialise GPUs as the annotation value (what a node daemon writes); ``onDemand`` only
    where it is set."""
    return json.dumps([g.model_dump(by_alias=True, mode="json",
                                    exclude={"on_demand"} if g.on_demand is None else None)
                       for g in gpus], separators=(",", ":"))


def node_labels(gpus: tuple[GPUInventory, ...] | list[GPUInventory]) -> dict[str, str]:
    """The selection labels that go with an inventory (what a node daemon writes)."""
    capable = bool(gpus) and all(get_model(g.model).mig_capable for g in gpus)
    labels = {LABEL_GPU_COUNT: str(len(gpus)), LABEL_MIG_CAPABLE: "true" if capable else "false"}
    if gpus:
        labels[LABEL_GPU_PRODUCT] = gpus[0].model
    return labels
