"""What is placed on a node's units: per unit the memory, cores and shares pods hold.

A pod's use of one unit follows the kubelet (which hands an init container's devices on to
the app containers) and Kubernetes' effective-request rule, for memory, cores and shares
separately: app containers and sidecars add up; a regular init container runs alone,
together with the sidecars declared before it; the pod holds the larger of the two.
Each container on a unit takes one share; on a whole MIG instance (``tessera.dev/mig-*``)
that share is the whole instance. Units a pod's record names that are not among the node's
units are ignored (the node no longer advertises them).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tessera.placement.demand import Demand
from tessera.placement.record import PlacementRecord
from tessera.placement.units import Unit

Assignment = tuple[Demand, tuple[str, ...]]
"""A demand and the unit UUIDs it got."""


@dataclass(frozen=True)
class Placed:
    """A pod holding units: bound or running, or assumed by the placement service."""

    key: str
    """``namespace/name``."""
    uid: str
    priority: int
    node: str
    record: PlacementRecord
    demands: tuple[Demand, ...]
    """The pod's demands in declaration order (:func:`tessera.placement.demand.pod_demands`)."""

    def assignments(self) -> list[Assignment]:
        """Each demand with its units, in declaration order; units the record gives a
        container without a matching demand count as an app container's share (0 MiB)."""
        out: list[Assignment] = [(d, self.record.of(d.container, d.resource))
                                 for d in self.demands]
        known = {(d.container, d.resource) for d in self.demands}
        for container, by_res in sorted(self.record.containers.items()):
            for resource, uuids in sorted(by_res.items()):
                if (container, resource) not in known:
                    out.append((Demand(container=container, init=False, resource=resource,
                                       count=len(uuids), memory_mib=0, cores=0.0),
                                tuple(uuids)))
        return out


@dataclass(frozen=True)
class UnitUsage:
    """What the pods on one unit hold together."""

    memory_mib: int = 0
    cores: float = 0
    shares: int = 0
    whole: bool = False
    """Held as a whole MIG instance."""
    holders: tuple[str, ...] = ()
    """Keys of the pods holding it, sorted."""

    @property
    def free(self) -> bool:
        return not self.holders and self.shares == 0


EMPTY = UnitUsage()


def pod_usage(unit: Unit, assignments: Sequence[Assignment]) -> UnitUsage:
    """One pod's use of ``unit`` (no holders filled in); assignments in declaration order."""
    app = (0, 0.0, 0)
    sidecars = (0, 0.0, 0)
    init_peak = (0, 0.0, 0)
    for demand, uuids in assignments:
        if unit.uuid not in uuids:
            continue
        mine = (demand.memory_mib, demand.cores, 1)
        if demand.init:
            alone = (sidecars[0] + mine[0], sidecars[1] + mine[1], sidecars[2] + mine[2])
            init_peak = (max(init_peak[0], alone[0]), max(init_peak[1], alone[1]),
                         max(init_peak[2], alone[2]))
        else:
            app = (app[0] + mine[0], app[1] + mine[1], app[2] + mine[2])
            if demand.sidecar:
                sidecars = (sidecars[0] + mine[0], sidecars[1] + mine[1], sidecars[2] + mine[2])
    shares = max(app[2], init_peak[2])
    return UnitUsage(memory_mib=max(app[0], init_peak[0]), cores=max(app[1], init_peak[1]),
                     shares=shares, whole=shares > 0 and not unit.shared)


def add(a: UnitUsage, b: UnitUsage, holder: str | None = None) -> UnitUsage:
    """Both together; ``holder`` joins the holders when ``b`` holds anything."""
    holders = set(a.holders) | set(b.holders)
    if holder is not None and b.shares > 0:
        holders.add(holder)
    return UnitUsage(memory_mib=a.memory_mib + b.memory_mib, cores=a.cores + b.cores,
                     shares=a.shares + b.shares, whole=a.whole or b.whole,
                     holders=tuple(sorted(holders)))


def usage(units: Sequence[Unit], placed: Iterable[Placed]) -> dict[str, UnitUsage]:
    """Per unit UUID (every unit of ``units``) what the ``placed`` pods hold on it."""
    out = {u.uuid: EMPTY for u in units}
    by_uuid = {u.uuid: u for u in units}
    for pod in placed:
        assignments = pod.assignments()
        named = {uuid for _, uuids in assignments for uuid in uuids}
        for uuid in sorted(named & by_uuid.keys()):
            out[uuid] = add(out[uuid], pod_usage(by_uuid[uuid], assignments), pod.key)
    return out
