"""Allocation decisions of the device plugin (pure): which devices to prefer, and whether
an Allocate's device IDs make a valid set of units for one container.

The kubelet picks the devices; ``preferred`` only answers GetPreferredAllocation. Shares of
one container must be on different units (each share is a separate GPU or MIG instance to
the container). ``pack`` (the default) fills the units and GPUs already in use first, so
whole GPUs stay free for large requests; ``spread`` puts each container on the least used
units first, for the least contention. "Used" is measured in memory not yet budgeted
(confirmed budgets, allocations not confirmed yet, placements recorded) where the caller
knows it, then in free shares; and ``roomy`` keeps only the units whose free memory holds
the budget of the container being allocated.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from tessera_node.deviceplugin.devices import HEALTHY, PluginDevice, unit_of

Policy = Literal["pack", "spread"]


def preferred(
    available: Sequence[str],
    must_include: Sequence[str],
    size: int,
    gpu_of: Mapping[str, str],
    policy: Policy = "pack",
    free_memory: Mapping[str, int] | None = None,
) -> list[str]:
    """Device IDs to prefer: ``must_include`` first, then at most one share per unit, units
    ordered by policy. ``gpu_of``: unit UUID -> its GPU's UUID; ``free_memory``: unit UUID ->
    bytes not yet budgeted (a GPU's is its units' sum). Fewer than ``size`` IDs when there
    are fewer distinct units (the kubelet fills in; Allocate then refuses the set)."""
    chosen = list(dict.fromkeys(must_include))[:size]
    used_units = {unit_of(d) for d in chosen}
    free_on_unit = Counter(unit_of(d) for d in available)
    free_on_gpu = Counter(gpu_of.get(unit_of(d), unit_of(d)) for d in available)
    first_id: dict[str, str] = {}
    for d in sorted(available, key=_share_order):
        first_id.setdefault(unit_of(d), d)
    sign = 1 if policy == "pack" else -1
    on_gpu = Counter(gpu_of.get(u, u) for u in used_units)
    mem = free_memory or {}
    mem_on_gpu: Counter[str] = Counter()
    for u, m in mem.items():
        mem_on_gpu[gpu_of.get(u, u)] += m

    def key(unit: str) -> tuple[int, int, int, int, int, str]:
        gpu = gpu_of.get(unit, unit)
        # spread: a GPU this container already has comes last
        spread_first = on_gpu[gpu] if policy == "spread" else 0
        return (spread_first, sign * mem_on_gpu[gpu], sign * free_on_gpu[gpu],
                sign * mem.get(unit, 0), sign * free_on_unit[unit], unit)

    left = [u for u in first_id if u not in used_units]
    while left and len(chosen) < size:
        unit = min(left, key=key)
        left.remove(unit)
        chosen.append(first_id[unit])
        on_gpu[gpu_of.get(unit, unit)] += 1
    return chosen


def roomy(available: Sequence[str], must_include: Sequence[str], size: int,
          free_memory: Mapping[str, int], need: int) -> list[str]:
    """The available IDs on units whose free memory holds ``need`` bytes; all of them when
    too few such units are left for ``size`` shares (with ``must_include``'s units): then
    the policy chooses, and the budgets are judged at confirmation."""
    fits = [d for d in available if free_memory.get(unit_of(d), -1) >= need]
    if len({unit_of(d) for d in [*must_include, *fits]}) >= size:
        return fits
    return list(available)


def _share_order(device_id: str) -> tuple[str, int]:
    unit, _, k = device_id.partition("::")
    return (unit, int(k) if k.isdigit() else -1)


@dataclass(frozen=True)
class Decision:
    units: tuple[str, ...] = ()
    """The container's units (GPU/MIG UUIDs), in the order of its device IDs."""
    error: str | None = None


def decide(device_ids: Sequence[str], devices: Sequence[PluginDevice]) -> Decision:
    """Whether one container may have these device IDs of one resource."""
    known = {d.id: d for d in devices}
    if not device_ids:
        return Decision(error="no devices requested")
    units: list[str] = []
    for d in device_ids:
        dev = known.get(d)
        if dev is None:
            return Decision(error=f"unknown device {d}")
        if dev.health != HEALTHY:
            return Decision(error=f"device {d} is unhealthy")
        if dev.unit in units:
            return Decision(error=f"two shares on {dev.unit}: each share must be a different "
                                  "GPU or MIG instance")
        units.append(dev.unit)
    return Decision(units=tuple(units))
