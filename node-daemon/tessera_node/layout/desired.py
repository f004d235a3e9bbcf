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
from tessera.api.partition import GPUPartitionSpec, Layout
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

    def summary(self) -> str:
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


def targets(partitions: Iterable[PartitionView], node: NodeInventory
            ) -> dict[str, dict[int, GPUTarget]]:
    """Partition name -> GPU index -> target, for the GPUs of ``node`` each partition owns.
    Partitions that own none of its GPUs are absent."""
    views = list(partitions)
    by_name = {v.name: v for v in views}
    out: dict[str, dict[int, GPUTarget]] = {}
    for name, res in resolve(views, [node]).items():
        v = by_name[name]
        layout = v.spec.layout
        enabled = layout.mig_mode == "Enabled"
        wanted = tuple(sorted(layout.profile_names())) if enabled else ()
        for claim in res.claims:
            out.setdefault(name, {})[claim.index] = GPUTarget(name, v.generation, enabled,
                                                              wanted)
    return out
