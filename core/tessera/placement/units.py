"""A node's units: what the device plugin advertises, one entry per GPU or MIG instance.

A unit is what a container sees as one CUDA device: a whole GPU or one MIG instance, offered
either as ``tessera.dev/vgpu`` (``shares`` containers may share it, each held to its own
budget) or as ``tessera.dev/mig-<profile>`` (whole, one container at a time, ``shares`` 0).
Units are read from the node daemon's inventory (``units`` of each GPU in
``tessera.dev/gpus``) and carry their GPU's model and topology, so placement needs nothing
else from the Node.
"""

from __future__ import annotations

from dataclasses import dataclass

from tessera.api.inventory import NodeInventory
from tessera.api.names import VGPU


class NoUnitsError(ValueError):
    """The node's units cannot be known (message says why); it holds no placed pod."""


@dataclass(frozen=True)
class Unit:
    """One advertised unit and the GPU it lives on."""

    node: str
    uuid: str
    """``GPU-…`` (a whole GPU) or ``MIG-…`` (one instance)."""
    gpu_uuid: str
    gpu_index: int
    model: str
    """Model ID of its GPU (:mod:`tessera.models`)."""
    resource: str
    """``tessera.dev/vgpu`` or ``tessera.dev/mig-<profile>``."""
    memory_mib: int
    shares: int
    """Shares offered on it (``tessera.dev/vgpu``); 0 for a whole instance."""
    healthy: bool
    profile: str | None
    """MIG profile; None for a whole GPU."""
    start: int | None
    """MIG start slot; None for a whole GPU."""
    numa_node: int | None
    nvlink_peers: frozenset[str]
    """GPU UUIDs joined to this unit's GPU by an active NVLink."""

    @property
    def shared(self) -> bool:
        """Offered as ``tessera.dev/vgpu`` shares (else whole, one container at a time)."""
        return self.resource == VGPU

    @property
    def capacity_shares(self) -> int:
        """How many containers may hold it at once: its shares, or 1 for a whole instance."""
        return self.shares if self.shared else 1


def node_units(inv: NodeInventory) -> list[Unit]:
    """Every unit of the node, in GPU index order then as advertised.

    Raises :class:`NoUnitsError` when the inventory is unreadable, when a GPU does not say
    its units (a daemon older than placement) or when a unit UUID appears twice.
    """
    if inv.error is not None:
        raise NoUnitsError(f"tessera-node on {inv.name}: GPU inventory unreadable: {inv.error}")
    units: list[Unit] = []
    seen: set[str] = set()
    for gpu in inv.gpus:
        if gpu.units is None:
            raise NoUnitsError(
                f"tessera-node on {inv.name} does not publish its units (older than placement)")
        for adv in gpu.units:
            if adv.uuid in seen:
                raise NoUnitsError(
                    f"tessera-node on {inv.name} advertises unit {adv.uuid} twice")
            seen.add(adv.uuid)
            units.append(Unit(
                node=inv.name, uuid=adv.uuid, gpu_uuid=gpu.uuid, gpu_index=gpu.index,
                model=gpu.model, resource=adv.resource, memory_mib=adv.memory_mib,
                shares=adv.shares, healthy=adv.healthy, profile=adv.profile, start=adv.start,
                numa_node=gpu.numa_node, nvlink_peers=frozenset(gpu.nvlink_peers)))
    return units
