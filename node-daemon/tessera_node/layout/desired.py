"""Which GPUPartition each of this node's GPUs follows, and the layout it wants (pure).

Claims are decided exactly as the operator decides them (:func:`tessera.partition.logic
.resolve`: oldest partition first), from the partitions and this node's own inventory, so
the daemon never waits for the operator to tell it which GPUs are its partition's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from tessera.api.inventory import NodeInventory
from tessera.api.partition import DisruptionPolicy, GPUPartitionSpec, Layout
from tessera.dra.partitions import Bounds
from tessera.partition.logic import PartitionView, resolve

log = logging.getLogger("tessera_node.layout")

DISABLED = Layout(mig_mode="Disabled")


@dataclass(frozen=True)
class GPUTarget:
    """What one GPU should look like, for which partition at which generation."""

    partition: str
    generation: int
    mig_enabled: bool
    profiles: tuple[str, ...] = ()
    """The wanted instances as a sorted multiset of profile names."""
    policy: DisruptionPolicy = "WaitForIdle"
    """What to do when busy instances stand in the way (``spec.disruptionPolicy``)."""
    deleting: bool = False
    """The partition is being deleted with ``deletionPolicy: Reset``: a change that cannot
    finish fails instead of waiting for ever."""
    on_demand: Bounds | None = None
    """``migMode: OnDemand`` (its bounds): MIG enabled, no declared instances; those present
    stay as they are (the DRA kubelet plugin makes, completes and destroys them for claims).
    None: a declared layout."""

    def summary(self) -> str:
        if self.on_demand is not None:
            return "MIG on demand"
        return summary(self.mig_enabled, self.profiles)


def summary(mig_enabled: bool, profiles: Iterable[str]) -> str:
    """``1x3g.40gb+2x1g.10gb``, ``MIG disabled`` or ``MIG enabled, no instances``."""
    if not mig_enabled:
        return "MIG disabled"
    names = list(profiles)
    if not names:
        return "MIG enabled, no instances"
    counts: dict[str, int] = {}
    for n in names:
        counts[n] = counts.get(n, 0) + 1
    return "+".join(f"{c}x{n}" for n, c in sorted(counts.items(), key=lambda kv: (
        -int(kv[0].split("g.", 1)[0]) if kv[0].split("g.", 1)[0].isdigit() else 0, kv[0])))


def partition_views(objects: Iterable[Mapping[str, Any]]) -> list[PartitionView]:
    """The partitions that want something from GPUs now.

    A partition being deleted with ``deletionPolicy: Reset`` wants MIG disabled on its GPUs
    (its finalizer waits for that); one being deleted with ``Retain`` wants nothing.  A spec
    that does not validate is logged and left out (admission should have refused it).
    """
    out = []
    for obj in objects:
        meta = obj.get("metadata") or {}
        name = str(meta.get("name", ""))
        try:
            spec = GPUPartitionSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            log.warning("GPUPartition spec not readable; ignored",
                        extra={"partition": name, "error": str(exc)[:300]})
            continue
        if meta.get("deletionTimestamp"):
            if spec.deletion_policy != "Reset":
                continue
            spec = spec.model_copy(update={"layout": DISABLED})
        out.append(PartitionView(name, spec, int(meta.get("generation") or 1),
                                 str(meta.get("creationTimestamp") or "")))
    return out


def being_reset(objects: Iterable[Mapping[str, Any]]) -> frozenset[str]:
    """Partitions being deleted with ``deletionPolicy: Reset`` (their GPUs go back to MIG
    disabled, and the operator's finalizer waits for that)."""
    return frozenset(str((o.get("metadata") or {}).get("name", "")) for o in objects
                     if (o.get("metadata") or {}).get("deletionTimestamp"))


@dataclass(frozen=True)
class Misfit:
    """GPUs of this node a partition selects but whose model cannot hold its layout."""

    generation: int
    reasons: tuple[str, ...]
    """The planner's reason per GPU (``GPU 0 (A30-24GB): …``)."""


def targets(partitions: Iterable[PartitionView], node: NodeInventory,
            deleting: frozenset[str] = frozenset()) -> dict[str, dict[int, GPUTarget]]:
    """Partition name -> GPU index -> target, for the GPUs of ``node`` each partition owns.
    Partitions that own none of its GPUs are absent."""
    views = list(partitions)
    by_name = {v.name: v for v in views}
    out: dict[str, dict[int, GPUTarget]] = {}
    for name, res in resolve(views, [node]).items():
        v = by_name[name]
        layout = v.spec.layout
        enabled = layout.mig_mode != "Disabled"
        wanted = tuple(sorted(layout.profile_names())) if enabled else ()
        bounds = Bounds.of(layout.on_demand, name) if layout.mig_mode == "OnDemand" else None
        for claim in res.claims:
            out.setdefault(name, {})[claim.index] = GPUTarget(
                name, v.generation, enabled, wanted, v.spec.disruption_policy,
                name in deleting, bounds)
    return out


def misfits(partitions: Iterable[PartitionView], node: NodeInventory) -> dict[str, Misfit]:
    """Partitions whose layout does not fit a GPU of ``node`` they select (by model), with
    the planner's reason: the node reports them Failed instead of saying nothing."""
    views = list(partitions)
    by_name = {v.name: v for v in views}
    out: dict[str, Misfit] = {}
    for name, res in resolve(views, [node]).items():
        why = tuple(p.message for p in res.problems
                    if p.node == node.name and p.reason == "LayoutDoesNotFit")
        if why:
            out[name] = Misfit(by_name[name].generation, why)
    return out
