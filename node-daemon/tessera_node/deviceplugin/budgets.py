"""A container's budget file entries from its pod's ``tessera.dev/budget`` annotation (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tessera.api.budget import (
    BudgetAnnotation,
    BudgetAnnotationError,
    PerShareBudget,
    parse_budget_annotation,
)
from tessera.api.names import ANNOTATION_BUDGET, VGPU
from tessera_node.budget.formats import BudgetEntry
from tessera_node.container.entries import shared_entry, whole_entry


def pod_budget(annotations: Mapping[str, str]) -> BudgetAnnotation:
    """The pod's budget annotation; BudgetAnnotationError when absent or unreadable."""
    text = annotations.get(ANNOTATION_BUDGET)
    if text is None:
        raise BudgetAnnotationError(f"the pod has no {ANNOTATION_BUDGET} annotation")
    return parse_budget_annotation(text)


def budget_for(budget: BudgetAnnotation, container: str) -> PerShareBudget:
    """The container's budget in the pod's (parsed) annotation; BudgetAnnotationError when it
    has none for it (a GPU container admitted by tessera always has one: its absence is an
    error, not 'unlimited')."""
    found = budget.containers.get(container)
    if found is None:
        raise BudgetAnnotationError(f"{ANNOTATION_BUDGET} has no budget for container {container}")
    return found


def container_budget(annotations: Mapping[str, str], container: str) -> PerShareBudget:
    """The container's budget from the pod's annotations (parsed here: where the pod's other
    containers are wanted too, parse once with :func:`pod_budget` and use :func:`budget_for`)."""
    return budget_for(pod_budget(annotations), container)


def entries(
    budget: PerShareBudget, units: Sequence[str], whole: bool,
    context_bytes: Mapping[str, int],
) -> list[BudgetEntry]:
    """One entry per unit, matched by UUID. ``whole``: whole MIG instances (no memory or core
    limit: the instance is the container's alone)."""
    return [whole_entry(i, u, context_bytes.get(u, 0)) if whole
            else shared_entry(i, u, budget.memory_bytes, budget.cores, context_bytes.get(u, 0))
            for i, u in enumerate(units)]


def memory_wanted(budget: PerShareBudget, whole: bool, unit_memory: int | None) -> int | None:
    """What the container's budget takes of each unit's memory: a whole instance all of it."""
    return unit_memory if whole else budget.memory_bytes


def per_unit(annotations: Mapping[str, str], container: str, resource: str) -> int | None:
    """The bytes a container's budget takes of each of its units: None for a whole MIG
    instance (all of it), 0 when its budget cannot be read (it is refused at confirmation)."""
    if resource != VGPU:
        return None
    try:
        return container_budget(annotations, container).memory_bytes
    except BudgetAnnotationError:
        return 0
