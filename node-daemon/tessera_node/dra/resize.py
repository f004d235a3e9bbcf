"""Live resize of a prepared claim's budget, the node's decisions (pure).

The operator approves a resize against the quota and writes each claim's new budget into the
pod's ``tessera.dev/claim-budget`` (:mod:`tessera.api.claim_budget`, status ``Approved``).
The node alone knows what the device holds: every claim the scheduler allocated on it (what
their allocations took) and what earlier resizes took beyond theirs.  So for each claim of a
pod (:func:`pod_targets`):

* a budget that **grows** is first *reserved*: the device's published capacity is lowered by
  the growth (:func:`reserved`; :func:`tessera.dra.devices.capacity`) and the daemon waits
  until the API server holds the slice, so the scheduler, which subtracts allocated claims
  from the published capacity, places no new claim into it.  Then every claim allocated on
  the device, prepared or not, is counted (:func:`device_use`): the growth is applied when
  the device holds them all (:func:`overcommitted`), else the reservation is dropped and the
  resize refused;
* a budget that takes no more beyond its allocation than before (a shrink, or a budget
  going back to its allocation: a node's refusal rolled back, a growth taken back) is
  applied at once.

Applying rewrites the claim's budget file in place (:func:`resized_entries`: the core
controller's ``rate``/``burst`` kept) after the checkpoint, so a restarted daemon keeps the
budget, and the capacity it took stays unpublished.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tessera.api.claim_budget import MIB, ClaimBudgetError, parse_claim_budgets
from tessera.api.inventory import GPUInventory
from tessera.api.names import (
    ANNOTATION_CLAIM_BUDGET,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DRIVER,
)
from tessera.api.quantity import QuantityError, quantity_value, to_bytes
from tessera.dra.devices import CORES, shared
from tessera_node.budget.formats import BudgetEntry, canonical_uuid
from tessera_node.dra.checkpoint import PreparedClaim
from tessera_node.dra.claims import UnitBudget, entries, node_units
from tessera_node.dra.containers import users_by_claim

Use = tuple[int, int]
"""(bytes, cores) taken of one device."""


@dataclass(frozen=True)
class ClaimTarget:
    """A prepared claim of the pod whose budget is to change."""

    claim: PreparedClaim
    units: tuple[UnitBudget, ...]
    """Its budget after the change."""

    @property
    def grows(self) -> bool:
        """Whether it takes more of any device than it has now."""
        now = {u.uuid: u for u in self.claim.units}
        return any(_more(u, now.get(u.uuid)) for u in self.units)

    @property
    def reserves_more(self) -> bool:
        """Whether it takes more of a device beyond the claim's allocation than it does now:
        what needs capacity withheld from the scheduler, and an approval (a budget growing
        back up to its allocation takes nothing the allocation does not hold already)."""
        before = reserved([self.claim])
        after = reserved([self.claim], {self.claim.uid: self.units})
        return any(m > before.get(u, (0, 0))[0] or k > before.get(u, (0, 0))[1]
                   for u, (m, k) in after.items())


def _more(new: UnitBudget, old: UnitBudget | None) -> bool:
    if old is None:
        return True
    return ((new.memory or 0) > (old.memory or 0)) or ((new.cores or 0) > (old.cores or 0))


def pod_targets(pod: Mapping[str, Any], prepared: Iterable[PreparedClaim]) -> list[ClaimTarget]:
    """The pod's prepared claims whose budget differs from what ``tessera.dev/claim-budget``
    says (a claim it does not list: its allocation).  ClaimBudgetError when the annotation
    cannot be read or does not fit the claim as prepared here."""
    meta = pod.get("metadata") or {}
    budgets = parse_claim_budgets((meta.get("annotations") or {}).get(ANNOTATION_CLAIM_BUDGET))
    uses = set(users_by_claim([pod]))
    out = []
    for c in prepared:
        if (c.namespace, c.name) not in uses:
            continue
        alloc = c.allocation
        b = budgets.get(c.uid)
        if b is None:
            want = alloc
        else:
            a = alloc[0] if len(alloc) == 1 else None
            a_mem = a.memory if a is not None else None
            if a is None or a_mem is None or a.cores is None:
                raise ClaimBudgetError(f"claim {c.name}: prepared here as {len(alloc)} "
                                       f"device(s) without a budget of one share to resize")
            if (math.ceil(a_mem / MIB), a.cores) != (b.allocated_memory_mib, b.allocated_cores):
                raise ClaimBudgetError(
                    f"claim {c.name}: its allocation here is {a_mem // MIB} MiB and "
                    f"{a.cores}% cores, not the {b.allocated_memory_mib} MiB and "
                    f"{b.allocated_cores}% the resize was approved on")
            want = (UnitBudget(a.uuid, b.memory_mib * MIB, b.cores),)
        if want != c.units:
            out.append(ClaimTarget(c, want))
    return out


def reserved(claims: Iterable[PreparedClaim],
             pending: Mapping[str, Sequence[UnitBudget]] | None = None) -> dict[str, Use]:
    """Per device: what the claims' budgets take beyond their allocations (``pending``:
    claim UID -> budget being decided, in place of its current one)."""
    out: dict[str, Use] = {}
    for c in claims:
        units = (pending or {}).get(c.uid, c.units)
        alloc = {u.uuid: u for u in c.allocation}
        for u in units:
            a = alloc.get(u.uuid)
            if a is None or u.memory is None or a.memory is None:
                continue
            mem = max(0, u.memory - a.memory)
            cores = max(0, (u.cores or 0) - (a.cores or 0))
            if mem or cores:
                m, k = out.get(u.uuid, (0, 0))
                out[u.uuid] = (m + mem, k + cores)
    return out


def device_use(claims: Iterable[Mapping[str, Any]], node: str, gpus: Sequence[GPUInventory],
               prepared: Sequence[PreparedClaim],
               pending: Mapping[str, Sequence[UnitBudget]]) -> dict[str, Use]:
    """Per device of this node: what every claim allocated on it takes (its
    ``consumedCapacity``; a device allocated whole, all of it) plus what resizes took beyond
    the prepared claims' allocations, ``pending`` ones included.  A prepared claim the list
    no longer shows (deleted while its pod runs) counts its allocation as prepared."""
    by_name = node_units(gpus)
    out: dict[str, Use] = {}

    def add(unit: str, mem: int, cores: int) -> None:
        m, k = out.get(unit, (0, 0))
        out[unit] = (m + mem, k + cores)

    listed = set()
    for claim in claims:
        meta = claim.get("metadata") or {}
        listed.add(str(meta.get("uid")))
        alloc = (claim.get("status") or {}).get("allocation") or {}
        for r in (alloc.get("devices") or {}).get("results") or []:
            if r.get("driver") != DRA_DRIVER or r.get("pool") != node:
                continue
            unit = by_name.get(str(r.get("device", "")))
            if unit is None:
                continue
            mem, cores = _consumed(r.get("consumedCapacity"), unit.memory_mib * MIB)
            add(unit.uuid, mem, cores)
    for c in prepared:
        if c.uid not in listed:
            for a in c.allocation:
                add(a.uuid, a.memory if a.memory is not None else 1 << 62,
                    a.cores if a.cores is not None else CORES)
    for uuid, (mem, cores) in reserved(prepared, pending).items():
        add(uuid, mem, cores)
    return out


def _consumed(consumed: Any, total: int) -> Use:
    """What one allocation result takes: its consumed capacity, or (none recorded, or not
    readable) the whole device."""
    if not isinstance(consumed, Mapping):
        return total, CORES
    try:
        return (to_bytes(consumed[DRA_CAPACITY_MEMORY]),
                int(quantity_value(consumed[DRA_CAPACITY_CORES])))
    except (KeyError, QuantityError, ValueError, TypeError):
        return total, CORES


def overcommitted(gpus: Sequence[GPUInventory], use: Mapping[str, Use],
                  units: Iterable[str]) -> str | None:
    """Why ``use`` does not fit on one of ``units`` (None: it fits on each)."""
    by_uuid = {u.uuid: (g, u) for g in gpus for u in (g.units or ())}
    for uuid in units:
        found = by_uuid.get(uuid)
        if found is None:
            return f"device {uuid} is not on this node any more"
        _, unit = found
        mem, cores = use.get(uuid, (0, 0))
        total = unit.memory_mib * MIB
        if not shared(unit):
            return f"{uuid} is a whole device here: it has no share to grow into"
        if mem > total:
            return (f"on this node: claims allocated on {uuid} and their resizes would take "
                    f"{mem // MIB} MiB of its {unit.memory_mib} MiB")
        if cores > CORES:
            return (f"on this node: claims allocated on {uuid} and their resizes would take "
                    f"{cores}% of its cores")
    return None


def beside_prepared(gpus: Sequence[GPUInventory], units: Sequence[UnitBudget],
                    prepared: Iterable[PreparedClaim]) -> str | None:
    """Why a claim about to be prepared does not fit beside the claims prepared here (their
    memory budgets, live resizes included), None when it does.  The scheduler allocates
    only into capacity the node publishes, so this holds whenever the reservation of a
    growth was published before the growth was applied; it is the node's own check that GPU
    memory is never overcommitted, whatever the scheduler saw."""
    by_uuid = {u.uuid: u for g in gpus for u in (g.units or ())}
    held: dict[str, int] = {}
    for c in prepared:
        for u in c.units:
            unit = by_uuid.get(u.uuid)
            total = unit.memory_mib * MIB if unit is not None else 0
            held[u.uuid] = held.get(u.uuid, 0) + (u.memory if u.memory is not None else total)
    for u in units:
        unit = by_uuid.get(u.uuid)
        if unit is None or u.memory is None:
            continue
        total = unit.memory_mib * MIB
        if held.get(u.uuid, 0) + u.memory > total:
            return (f"device {u.uuid} has {held.get(u.uuid, 0) // MIB} MiB of its "
                    f"{unit.memory_mib} MiB held by the claims prepared on it (live resizes "
                    f"included): {u.memory // MIB} MiB more does not fit")
    return None


def resized_entries(units: Sequence[UnitBudget], current: Sequence[BudgetEntry]
                    ) -> list[BudgetEntry]:
    """The claim's budget file entries for ``units``, keeping each context charge and, where
    a core budget stays, the core controller's ``rate``/``burst``."""
    by_uuid = {e.uuid: e for e in current if e.uuid is not None}
    new = entries(units, {u.uuid: by_uuid[canonical_uuid(u.uuid)].context for u in units
                          if canonical_uuid(u.uuid) in by_uuid})
    out = []
    for e in new:
        old = by_uuid.get(e.uuid) if e.uuid is not None else None
        if old is not None and old.cores is not None and e.cores is not None:
            e = replace(e, rate=old.rate, burst=old.burst)
        out.append(e)
    return out


def resized_message(targets: Sequence[ClaimTarget]) -> str:
    """The ``BudgetResized`` Event's message: each claim's budget now."""
    parts = []
    for t in targets:
        for u in t.units:
            mem = "no memory limit" if u.memory is None else f"{u.memory // MIB} MiB"
            cores = "no core limit" if u.cores is None else f"{u.cores}% cores"
            parts.append(f"claim {t.claim.name}: {mem}, {cores} of {u.uuid}")
    return "budget resized, obeyed from the containers' next GPU call: " + "; ".join(parts)
