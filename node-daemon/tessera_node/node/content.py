"""What the daemon wants its own Node to say, from everything it knows (pure): one
reconcile pass's content.

Inputs: the Node as last seen, the GPUPartitions, the last NVML snapshot (or why it could
not be read), the device-plugin sockets, and what the enactor said about each plan.
Output: the owned labels and annotations (:mod:`tessera_node.node.patch` turns them into
the one write), the reports before and after (for Events), new findings, the plans of
the GPUs partitions own here and how they share them (for the device plugin).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from tessera.api import node_report
from tessera.api.inventory import (
    GPUInventory,
    NodeInventory,
    from_node,
    node_labels,
    to_annotation,
)
from tessera.api.names import ANNOTATION_GPUS, ANNOTATION_NODE_FINDINGS, ANNOTATION_PARTITION_STATUS
from tessera.api.partition import NodePartitionStatus, Sharing
from tessera.dra.partitions import Bounds
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.devices import offered_units, offers
from tessera_node.layout.desired import (
    GPUTarget,
    being_reset,
    misfits,
    partition_views,
    targets,
)
from tessera_node.layout.holders import Holders
from tessera_node.layout.plan import GPUPlan, Outcome
from tessera_node.node import findings as findings_
from tessera_node.node import reports
from tessera_node.node.coexistence import detect
from tessera_node.node.findings import Finding
from tessera_node.node.inventory import (
    node_gpus,
    on_demand_profiles,
    unhealthy_units,
    with_on_demand,
    with_units,
)
from tessera_node.node.patch import OWNED_LABELS


@dataclass(frozen=True)
class NodeContent:
    labels: dict[str, str]
    annotations: dict[str, str]
    old_reports: dict[str, NodePartitionStatus]
    reports: dict[str, NodePartitionStatus]
    findings: tuple[Finding, ...]
    new_findings: tuple[Finding, ...]
    plans: tuple[GPUPlan, ...]
    sharing: dict[str, Sharing]
    """GPU UUID -> how its partition hands out its MIG instances (Whole or Shares): what the
    device plugin is given, and what the inventory's ``units`` were computed with."""
    profiles: frozenset[str]
    """The MIG profiles the node's partitions want (each has a device plugin resource)."""
    on_demand_targets: dict[str, GPUTarget] = field(default_factory=dict)
    """GPU UUID -> its target, for the GPUs in migMode OnDemand (the device plugin's node
    makes their instances for pods)."""

    @property
    def on_demand(self) -> dict[str, Bounds]:
        """GPU UUID -> its partition's bounds, for the same GPUs (the DRA publisher offers
        their placements)."""
        return {u: t.on_demand for u, t in self.on_demand_targets.items()
                if t.on_demand is not None}


def old_reports(node: Mapping[str, Any]) -> dict[str, NodePartitionStatus]:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_PARTITION_STATUS)
    if raw is None:
        return {}
    try:
        return node_report.parse_reports(raw)
    except node_report.ReportError:
        return {}  # rewritten whole from what the daemon knows


@dataclass(frozen=True)
class Advertising:
    """What the node's device plugin advertises besides the GPUs and their sharing."""

    shares_per_unit: int
    withdrawn: Mapping[str, Collection[str]] = field(default_factory=dict)
    """GPU UUID -> devices the MIG enactor withdrew (``NodeDevices.withdrawn``)."""


def node_content(node: Mapping[str, Any], partitions: Iterable[Mapping[str, Any]],
           snapshot: DeviceSnapshot | None, read_error: str | None,
           sockets: Iterable[str], socket_dir: str,
           outcome: Callable[[GPUPlan], Outcome | None], now: datetime,
           holders: Holders | None = None, allow_reset: bool = True,
           advertising: Advertising | None = None,
           extra_findings: Iterable[Finding] = (),
           made_for: Mapping[str, str] | None = None,
           made_for_pods: Mapping[str, str] | None = None) -> NodeContent:
    """``advertising``: None when the daemon runs no device plugin (every GPU's ``units``
    is then empty: nothing is advertised). ``extra_findings``: what other parts of the
    daemon found (the DRA publisher: fields the API server drops). ``made_for``: MIG device
    UUID -> the claim it was made for (the DRA plugin's, migMode OnDemand);
    ``made_for_pods``: MIG device UUID -> the pod it was made for (the device plugin's)."""
    meta = node.get("metadata") or {}
    have_labels: Mapping[str, str] = meta.get("labels") or {}
    have_annotations: Mapping[str, str] = meta.get("annotations") or {}
    labels: dict[str, str]
    annotations: dict[str, str] = {}
    gpus: tuple[GPUInventory, ...]
    found: list[Finding] = []
    if snapshot is not None:
        inventory = node_gpus(snapshot)
        gpus, found = inventory.gpus, list(inventory.findings)
        labels = node_labels(gpus)
    else:  # NVML unreadable: what was published stays (never an empty inventory by error),
        # its units unhealthy as the device plugin advertises them meanwhile
        gpus = from_node(node).gpus
        labels = {k: v for k, v in have_labels.items() if k in OWNED_LABELS}
        if any(u.healthy for g in gpus for u in g.units or ()):
            annotations[ANNOTATION_GPUS] = to_annotation(unhealthy_units(gpus))
        elif ANNOTATION_GPUS in have_annotations:
            annotations[ANNOTATION_GPUS] = have_annotations[ANNOTATION_GPUS]
    found += detect(node, sockets, socket_dir)
    found += extra_findings
    inv = NodeInventory(name=str(meta.get("name", "")), labels={**have_labels, **labels},
                        gpus=gpus)
    objects = list(partitions)
    views = partition_views(objects)
    owned = targets(views, inv, being_reset(objects))
    plans = (tuple(reports.plans(owned, snapshot, holders, allow_reset))
             if snapshot is not None else ())
    outcomes = {p.index: o for p in plans if (o := outcome(p)) is not None}
    situation = reports.Situation(snapshot, read_error, tuple(found), outcomes,
                                  holders or {}, allow_reset, made_for or {},
                                  made_for_pods or {})
    before = old_reports(node)
    after = reports.merge(before, reports.build(owned, situation, misfits(views, inv)), now)
    if after:
        annotations[ANNOTATION_PARTITION_STATUS] = node_report.to_annotation(after)
    if found:
        annotations[ANNOTATION_NODE_FINDINGS] = findings_.to_annotation(found)
    fresh = findings_.new_findings(have_annotations.get(ANNOTATION_NODE_FINDINGS), found)
    spec_of = {v.name: v.spec for v in views}
    uuid_of = {g.index: g.uuid for g in snapshot.gpus} if snapshot is not None else {}
    sharing = {uuid_of[i]: spec_of[p].sharing for p, on in owned.items() for i in on
               if i in uuid_of}
    on_demand = {uuid_of[i]: t for on in owned.values() for i, t in on.items()
                 if t.on_demand is not None and i in uuid_of}
    if snapshot is not None:
        offered = (offers(offered_units(snapshot, advertising.withdrawn),
                          advertising.shares_per_unit, sharing)
                   if advertising is not None else [])
        # the device plugin's node makes on-demand instances for pods (the DRA one for
        # claims, which its slices say): only its inventory marks those GPUs
        for_pods = on_demand if advertising is not None else {}
        annotations = {ANNOTATION_GPUS: to_annotation(with_on_demand(
            with_units(gpus, offered), for_pods)), **annotations}
    profiles = frozenset(n for gpus in owned.values() for t in gpus.values()
                         for n in t.profiles)
    if advertising is not None:  # every profile an on-demand GPU may get is a resource
        model_of = {g.uuid: g.model for g in gpus}
        profiles |= {n for uuid, t in on_demand.items() if uuid in model_of
                     if t.on_demand is not None
                     for n in on_demand_profiles(model_of[uuid], t.on_demand)}
    return NodeContent(labels, annotations, before, after, tuple(sorted(found)), tuple(fresh),
                  plans, sharing, profiles, on_demand)
