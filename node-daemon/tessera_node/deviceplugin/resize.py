"""Live resize, the node daemon's part: the final decision for the node and the new budget
file (pure, but :func:`apply`).

The operator approved the request against the quota and wrote the new ``tessera.dev/budget``
(status ``Approved``, :mod:`tessera.api.resize`). Only the daemon knows what else is
committed on the container's GPUs and MIG instances: the memory budgets of every other
container there (its *commitments*, published on its Node as ``tessera.dev/gpu-commitments``).
It applies the resize when the new memory fits beside them on every unit, else refuses it
(the operator then restores the previous budget and gives back the growth it held).

Applying rewrites the container's budget file in place: libtessera re-reads it at the next
allocation or launch of every process, so the container obeys at once. The core controller
owns ``rate``/``burst``; they are kept, and the new core budget is its target from its next
period. Shrinking memory below what the container holds keeps its allocations (the hook
never frees memory) and refuses new ones until it is under.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from tessera.api.budget import BudgetAnnotation, BudgetAnnotationError, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET_RESIZE
from tessera.api.resize import ResizeStatus
from tessera_node.budget.formats import BudgetEntry
from tessera_node.deviceplugin.budgets import budget_for, container_budget, entries, pod_budget
from tessera_node.deviceplugin.fit import MIB, overcommit


@dataclass(frozen=True)
class Decided:
    """The node's answer, as the pod's ``tessera.dev/budget-resize`` shows it."""

    status: ResizeStatus

    @property
    def applied(self) -> bool:
        return self.status.state == "Applied"

    def annotation_patch(self) -> dict[str, str]:
        return {ANNOTATION_BUDGET_RESIZE: self.status.to_annotation()}


@dataclass(frozen=True)
class Outcome(Decided):
    """One container's answer."""

    entries: list[BudgetEntry] | None = None
    """The budget file's new entries when applied."""


def awaiting(annotations: Mapping[str, str]) -> ResizeStatus | None:
    """The approved resize this pod waits for the node to decide, if any."""
    s = ResizeStatus.parse(annotations.get(ANNOTATION_BUDGET_RESIZE))
    return s if s is not None and s.state == "Approved" else None


def decide(
    annotations: Mapping[str, str],
    container: str,
    units: Sequence[str],
    current: Sequence[BudgetEntry],
    unit_memory: Mapping[str, int | None],
    committed_elsewhere: Mapping[str, Sequence[int]],
) -> Outcome | None:
    """The node's answer to an approved resize of ``container`` (None: nothing to decide).

    ``current``: the container's budget file entries now; ``committed_elsewhere``: per unit,
    the memory budgets of every *other* container there."""
    s = awaiting(annotations)
    if s is None:
        return None
    try:
        budget = container_budget(annotations, container)
    except BudgetAnnotationError as exc:
        return Outcome(replace(s, state="Refused", reason=str(exc)))
    return _decide(s, budget, units, current, unit_memory, committed_elsewhere)


def _decide(
    s: ResizeStatus,
    budget: PerShareBudget,
    units: Sequence[str],
    current: Sequence[BudgetEntry],
    unit_memory: Mapping[str, int | None],
    committed_elsewhere: Mapping[str, Sequence[int]],
) -> Outcome:
    """:func:`decide` for the request ``s`` and the container's new ``budget``."""
    why = overcommit(units, budget.memory_bytes, unit_memory, committed_elsewhere)
    if why is not None:
        return Outcome(replace(s, state="Refused", reason=f"on this node: {why}"))
    ctx = {e.uuid: e.context for e in current if e.uuid}
    new = entries(budget, units, False, {u: ctx.get(u, 0) for u in units})
    by_uuid = {e.uuid: e for e in current}
    kept = [
        replace(e, rate=by_uuid[e.uuid].rate, burst=by_uuid[e.uuid].burst)
        if e.uuid in by_uuid and by_uuid[e.uuid].cores is not None and e.cores is not None
        else e
        for e in new
    ]
    return Outcome(ResizeStatus(s.request, "Applied"), kept)


@dataclass(frozen=True)
class Placed:
    """One container of the pod set up on this node: its allocation and budget file now."""

    key: str
    container: str
    units: tuple[str, ...]
    current: tuple[BudgetEntry, ...]


@dataclass(frozen=True)
class PodOutcome(Decided):
    """The answer for all of a pod's containers on this node."""

    entries: Mapping[str, list[BudgetEntry]] = field(default_factory=dict)
    """Allocation key -> the budget file's new entries (empty unless applied)."""
    budget: BudgetAnnotation | None = None
    """The pod's new budget annotation, as parsed for the decision (None unless applied)."""


def decide_pod(
    annotations: Mapping[str, str],
    placed: Sequence[Placed],
    unit_memory: Mapping[str, int | None],
    held_elsewhere: Mapping[str, Sequence[int]],
) -> PodOutcome | None:
    """The node's answer for every container of the pod set up here: all of them applied,
    or none (the first that does not fit refuses the whole request, as the operator
    approved it as a whole). ``held_elsewhere``: per unit, the memory budgets of the
    containers of *other* pods. Two containers of the pod on one unit are checked against
    each other's new budget once decided, and their current one before (never less)."""
    s = awaiting(annotations)
    if not placed or s is None:
        return None
    try:
        budget = pod_budget(annotations)  # once for all the pod's containers
    except BudgetAnnotationError as exc:
        return PodOutcome(replace(s, state="Refused",
                                  reason=f"container {placed[0].container}: {exc}"), {})
    decided: dict[str, list[BudgetEntry]] = {}
    status: ResizeStatus | None = None
    for p in placed:
        others = {u: list(v) for u, v in held_elsewhere.items()}
        for q in placed:
            if q.key != p.key:
                for e in decided.get(q.key, q.current):
                    if e.uuid is not None:
                        others.setdefault(e.uuid, []).append(
                            e.memory if e.memory is not None else unit_memory.get(e.uuid) or 0)
        try:
            mine = budget_for(budget, p.container)
        except BudgetAnnotationError as exc:
            out = Outcome(replace(s, state="Refused", reason=str(exc)))
        else:
            out = _decide(s, mine, p.units, p.current, unit_memory, others)
        if not out.applied or out.entries is None:
            reason = f"container {p.container}: {out.status.reason}"
            return PodOutcome(replace(out.status, reason=reason), {})
        decided[p.key] = out.entries
        status = out.status
    assert status is not None
    return PodOutcome(status, decided, budget)


def commitments(
    unit_memory: Mapping[str, int | None], held: Mapping[str, Sequence[int]]
) -> str:
    """``tessera.dev/gpu-commitments``: per unit, its memory and the budgets committed there."""
    return json.dumps(
        {u: {"memory": m, "committed": sum(held.get(u, ())), "containers": len(held.get(u, ()))}
         for u, m in sorted(unit_memory.items())},
        sort_keys=True, separators=(",", ":"))


def resized_message(budget: BudgetAnnotation) -> str:
    """The ``BudgetResized`` Event's message: each container's budget now, per GPU share."""
    parts = []
    for name, b in sorted(budget.containers.items()):
        if b.shares:
            parts.append(f"{name}: {b.memory_bytes // MIB} MiB, {b.cores:g}% cores per GPU")
    return "budget resized, obeyed from the containers' next GPU call: " + "; ".join(parts)
