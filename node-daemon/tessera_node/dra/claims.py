"""What a ResourceClaim allocated on this node, and the budget it becomes (pure).

The kubelet sends only a claim's identity; the plugin reads the ResourceClaim and takes, from
``status.allocation.devices.results``, the results whose ``driver`` is tessera's. Each names a
device of a pool: tessera publishes one pool per node, named after it, so a result of
another pool is a device of another node and fails the claim (the node never guesses). A
device name is mapped back to its unit (a GPU's or MIG instance's UUID) through the node's
inventory, by the names :func:`tessera.dra.devices.device_name` gives.

The budget of each unit:

* a **shared** device (``allowMultipleAllocations``): what the scheduler recorded in the
  result's ``consumedCapacity`` — ``memory`` bytes and ``cores`` percent, rounded as the
  device's request policies say. Both must be there and readable, never more than the unit
  has: a value that cannot be read fails the claim, it is never "no limit". A result with no
  ``consumedCapacity`` at all is one an API server with ``DRAConsumableCapacity`` off
  allocated (1.34: it drops ``allowMultipleAllocations``, so the device was allocated
  exclusively): the whole unit, its memory as the limit and no core limit;
* an **exclusive** device (a whole MIG instance): no memory or core limit, the instance is
  the claim's alone, as the device plugin gives a whole instance -- unless its request
  states capacity (``capacity.requests``; under a GPUQuota every request does, the claims
  webhook fills it from the quota's default): then what it states (memory at most the
  unit's), which is what the GPUQuota counted.

Only requests that ask through tessera's DeviceClasses
(:data:`tessera.api.names.DRA_DEVICE_CLASSES`) are prepared: those are the ones the claims
webhooks state and count.  A device of tessera's allocated through another class (an
administrator's class selecting every driver's devices) fails the claim, naming both.

A claim that takes one shared device twice (two requests on one GPU) gets the sum on one
budget entry: a budget file names each unit once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api.inventory import AdvertisedUnit, GPUInventory
from tessera.api.names import (
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DEVICE_CLASSES,
    DRA_DRIVER,
)
from tessera.api.quantity import QuantityError, quantity_value, to_bytes
from tessera.dra.devices import CORES, device_name, shared
from tessera.dra.partitions import placement_of
from tessera.dra.requests import request_body, stated_capacity
from tessera_node.budget.formats import MAX_DEV, BudgetEntry
from tessera_node.container.entries import shared_entry, whole_entry
from tessera_node.layout.on_demand import MadeInstance


class ClaimError(ValueError):
    """The claim cannot be honoured on this node; the message says what to change (the
    kubelet shows it in the pod's events)."""


@dataclass(frozen=True)
class Result:
    """One allocation result of tessera's: which device served which request."""

    request: str
    pool: str
    device: str
    share_id: str | None = None
    consumed: Mapping[str, Any] | None = field(default=None, compare=False)
    """``consumedCapacity`` as the scheduler recorded it (None: not recorded)."""
    stated: Mapping[str, Any] | None = field(default=None, compare=False)
    """The capacity its request states (None: states none)."""


@dataclass(frozen=True)
class UnitBudget:
    """What the claim may use of one unit."""

    uuid: str
    memory: int | None
    """Bytes; None: no limit (a whole MIG instance)."""
    cores: int | None
    """Percent of the unit's SM time; None: no core limit."""


@dataclass(frozen=True)
class Allocation:
    """tessera's part of a claim's allocation on this node: its results, in the claim's
    order, and the budget of each unit they name, in the order the container sees them."""

    results: tuple[Result, ...]
    units: tuple[UnitBudget, ...]


def node_units(gpus: Iterable[GPUInventory]) -> dict[str, AdvertisedUnit]:
    """The node's devices by DRA device name (the names its ResourceSlice publishes)."""
    return {device_name(g, u): u for g in gpus for u in (g.units or ())}


def results(claim: Mapping[str, Any]) -> list[Result]:
    """tessera's allocation results of a ResourceClaim object."""
    name = _claim_name(claim)
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"ResourceClaim {name} is not allocated")
    out = []
    for r in ((allocation.get("devices") or {}).get("results") or []):
        if r.get("driver") != DRA_DRIVER:
            continue
        if r.get("adminAccess"):
            raise ClaimError(f"ResourceClaim {name}: {DRA_DRIVER} grants no admin access "
                             f"(request {r.get('request')}); ask without adminAccess")
        body = request_body(claim, str(r.get("request", "")))
        cls = body.get("deviceClassName")
        if cls not in DRA_DEVICE_CLASSES:
            raise ClaimError(
                f"ResourceClaim {name}: request {r.get('request')} asks through DeviceClass "
                f"{cls!r}; {DRA_DRIVER} prepares its devices only for requests through "
                f"{' or '.join(DRA_DEVICE_CLASSES)} (the classes a GPUQuota counts): ask "
                f"through one of them")
        out.append(Result(str(r.get("request", "")), str(r.get("pool", "")),
                          str(r.get("device", "")), r.get("shareID") or None,
                          r.get("consumedCapacity"), stated_capacity(body) or None))
    if not out:
        raise ClaimError(f"ResourceClaim {name} has no device of {DRA_DRIVER} allocated")
    return out


def allocation(claim: Mapping[str, Any], node: str, gpus: Sequence[GPUInventory]
               ) -> Allocation:
    """tessera's results of ``claim`` and the budget of each unit; ClaimError when the claim
    cannot be honoured on ``node`` (a device of another node, a device the node does not
    have or has withdrawn, capacity that cannot be read)."""
    name = _claim_name(claim)
    mine = results(claim)
    by_name = node_units(gpus)
    budgets: dict[str, UnitBudget] = {}
    for res in mine:
        if res.pool != node:
            raise ClaimError(f"ResourceClaim {name}: device {res.device} is in pool "
                             f"{res.pool!r}, not this node's ({node}): the claim was "
                             "allocated for another node")
        unit = by_name.get(res.device)
        if unit is None:
            raise ClaimError(f"ResourceClaim {name}: node {node} has no device {res.device} "
                             "(its GPUs or MIG layout changed since the claim was allocated); "
                             "delete the claim so that it is allocated again")
        if not unit.healthy:
            raise ClaimError(f"ResourceClaim {name}: device {res.device} on {node} is "
                             "unhealthy; delete the claim so that it is allocated again")
        got = unit_budget(name, res.device, unit, res.consumed, res.stated)
        if unit.uuid in budgets:
            got = _sum(budgets[unit.uuid], got)
            if got.memory is not None and got.memory > unit.memory_mib << 20:
                raise ClaimError(f"ResourceClaim {name}: its shares of {res.device} take "
                                 f"{got.memory} bytes, more than the device has")
        budgets[unit.uuid] = got
    if len(budgets) > MAX_DEV:
        raise ClaimError(f"ResourceClaim {name} takes {len(budgets)} devices; a container "
                         f"sees at most {MAX_DEV}")
    return Allocation(tuple(mine), tuple(budgets.values()))


def unit_budget(claim: str, device: str, unit: AdvertisedUnit,
                consumed: Mapping[str, Any] | None,
                stated: Mapping[str, Any] | None = None) -> UnitBudget:
    """The budget one result gives on its unit (see the module's docstring)."""
    total = unit.memory_mib << 20
    where = f"ResourceClaim {claim}: device {device}"
    if not shared(unit):
        if not stated:
            return UnitBudget(unit.uuid, None, None)
        memory = _memory(where, "stated", stated.get(DRA_CAPACITY_MEMORY, total), total)
        cores = stated.get(DRA_CAPACITY_CORES)
        return UnitBudget(unit.uuid, memory,
                          None if cores is None else _cores(where, "stated", cores))
    if consumed is None:
        return UnitBudget(unit.uuid, total, None)  # allocated exclusively (gate off)
    for key in (DRA_CAPACITY_MEMORY, DRA_CAPACITY_CORES):
        if key not in consumed:
            raise ClaimError(f"{where}: the allocation records no consumed {key}; "
                             "recreate the claim")
    return UnitBudget(unit.uuid, _memory(where, "consumed", consumed[DRA_CAPACITY_MEMORY], total),
                      _cores(where, "consumed", consumed[DRA_CAPACITY_CORES]))


def _memory(where: str, what: str, value: Any, total: int) -> int:
    """Bytes; a stated value over the unit's memory is the unit's (the scheduler chose a
    device that is big enough for what the request asks, or none)."""
    try:
        memory = to_bytes(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise ClaimError(f"{where}: {what} capacity not readable: {exc}") from None
    if what == "stated":
        memory = min(memory, total)
    if not 0 < memory <= total:
        raise ClaimError(f"{where}: {what} memory {memory} bytes is outside 1..{total}")
    return memory


def _cores(where: str, what: str, value: Any) -> int:
    try:
        cores_value = quantity_value(value)
    except (QuantityError, ValueError, TypeError) as exc:
        raise ClaimError(f"{where}: {what} capacity not readable: {exc}") from None
    if cores_value != cores_value.to_integral_value():
        raise ClaimError(f"{where}: {what} cores {cores_value} is not a whole percent")
    cores = int(cores_value)
    if not 0 < cores <= CORES:
        raise ClaimError(f"{where}: {what} cores {cores} is outside 1..{CORES}")
    return cores


def _sum(a: UnitBudget, b: UnitBudget) -> UnitBudget:
    memory = None if a.memory is None or b.memory is None else a.memory + b.memory
    cores = None if a.cores is None or b.cores is None else min(CORES, a.cores + b.cores)
    return UnitBudget(a.uuid, memory, cores)


def entries(units: Sequence[UnitBudget], context_bytes: Mapping[str, int] | None = None
            ) -> list[BudgetEntry]:
    """The claim's budget file entries, one per unit, indexed in order."""
    ctx = context_bytes or {}
    return [whole_entry(i, u.uuid, ctx.get(u.uuid, 0)) if u.memory is None
            else shared_entry(i, u.uuid, u.memory, u.cores, ctx.get(u.uuid, 0))
            for i, u in enumerate(units)]


def _claim_name(claim: Mapping[str, Any]) -> str:
    meta = claim.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def allocated_units(claims: Iterable[Mapping[str, Any]], node: str,
                    gpus: Sequence[GPUInventory]) -> dict[str, list[str]]:
    """Unit UUID -> the claims (``namespace/name (ResourceClaim)``) the scheduler allocated a
    device of this node's pool on, prepared or not: what a MIG change must wait for. A device
    name the node does not know (a layout gone already) holds nothing."""
    by_name = node_units(gpus)
    out: dict[str, list[str]] = {}
    for who, device in _allocated_here(claims, node):
        unit = by_name.get(device)
        if unit is not None and who not in out.setdefault(unit.uuid, []):
            out[unit.uuid].append(who)
    return out


def allocated_placements(claims: Iterable[Mapping[str, Any]], node: str,
                         gpus: Mapping[int, tuple[str, str]]
                         ) -> dict[tuple[str, str, int], list[str]]:
    """(GPU UUID, profile, start) -> the claims the scheduler allocated that placement of an
    on-demand GPU of this node's pool (``gpus``: :data:`OnDemandGPUs`), prepared or not:
    the instance is theirs, made at prepare or about to be."""
    out: dict[tuple[str, str, int], list[str]] = {}
    for who, device in _allocated_here(claims, node):
        for index, (uuid, model) in gpus.items():
            placed = placement_of(device, index, model)
            if placed is not None and who not in out.setdefault((uuid, *placed), []):
                out[(uuid, *placed)].append(who)
    return out


def _allocated_here(claims: Iterable[Mapping[str, Any]], node: str
                    ) -> Iterable[tuple[str, str]]:
    """(``namespace/name (ResourceClaim)``, device name) of every result of tessera's driver
    on this node's pool."""
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in ((allocation.get("devices") or {}).get("results") or []):
            if r.get("driver") == DRA_DRIVER and r.get("pool") == node:
                yield f"{_claim_name(claim)} (ResourceClaim)", str(r.get("device", ""))


OnDemandGPUs = Callable[[], Mapping[int, tuple[str, str]]]
"""NVML index -> (GPU UUID, model ID) of the node's GPUs in migMode OnDemand with MIG on."""


def wanted_instances(results: Sequence[Result], node: str,
                     gpus: Mapping[int, tuple[str, str]]) -> list[MadeInstance]:
    """The instances a claim's results ask to be made (pure): each result on this node's
    pool that names a placement of an on-demand GPU."""
    out = []
    for r in results:
        if r.pool != node:
            continue
        for index, (uuid, model) in sorted(gpus.items()):
            placed = placement_of(r.device, index, model)
            if placed is not None:
                out.append(MadeInstance(index, uuid, *placed))
    return out
