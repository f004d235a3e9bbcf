"""What a pod asks of a node's units: one :class:`Demand` per container and tessera resource.

Read from the pod spec (``resources.limits``, else ``requests``) of ``containers`` and
``initContainers``:

- ``tessera.dev/vgpu: k`` -- k shares, each on a different unit; the per-share memory and
  cores come from the pod's ``tessera.dev/budget`` annotation (what admission granted), or,
  without one, from the totals ``tessera.dev/vgpu-memory`` (MiB) and ``tessera.dev/vgpu-cores``
  split evenly over the k shares (:meth:`PerShareBudget.from_totals`).
- ``tessera.dev/mig-<profile>: k`` -- k whole MIG instances (memory and cores 0: the
  instance is the container's alone).

Demands keep the pod's declaration order (init containers first, then app containers):
:mod:`tessera.placement.usage` relies on it to count a regular init container together
with the sidecars declared before it. An init container with ``restartPolicy: Always`` is a
sidecar: it runs beside the app containers (``init`` False, ``sidecar`` True).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api.budget import (
    MIB,
    BudgetAnnotationError,
    PerShareBudget,
    parse_budget_annotation,
)
from tessera.api.names import ANNOTATION_BUDGET, MIG_PREFIX, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.api.quantity import QuantityError, quantity_value
from tessera.api.resources import profile_from_resource


class DemandError(ValueError):
    """The pod's GPU requests cannot be read (message names the container and resource)."""


@dataclass(frozen=True)
class Demand:
    """One container's ask for one tessera resource."""

    container: str
    init: bool
    """A regular init container (runs alone, before the app containers)."""
    resource: str
    """``tessera.dev/vgpu`` or ``tessera.dev/mig-<profile>``."""
    count: int
    """Units wanted, all different."""
    memory_mib: int
    """Per unit (share) for ``vgpu``; 0 for whole MIG."""
    cores: float
    """Percent of the unit's SMs per unit (share) for ``vgpu``; 0 for whole MIG."""
    sidecar: bool = False
    """An init container with ``restartPolicy: Always`` (runs beside the app containers)."""


def _count(container: str, resource: str, raw: Any) -> int:
    try:
        value = quantity_value(raw)
    except (QuantityError, TypeError) as exc:
        raise DemandError(f"container {container}: {resource}: {exc}") from None
    if value < 0 or value != value.to_integral_value():
        raise DemandError(
            f"container {container}: {resource}: {raw!r} is not a whole non-negative number")
    return int(value)


def _amounts(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's tessera amounts: limits, with requests where a limit is absent."""
    resources = container.get("resources") or {}
    limits: Mapping[str, Any] = resources.get("limits") or {}
    requests: Mapping[str, Any] = resources.get("requests") or {}
    merged = {**requests, **limits}
    return {k: v for k, v in merged.items() if k == VGPU or k.startswith(MIG_PREFIX)
            or k in (VGPU_MEMORY, VGPU_CORES)}


def _budgets(pod: Mapping[str, Any]) -> Mapping[str, PerShareBudget]:
    raw = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_BUDGET)
    if raw is None:
        return {}
    try:
        return parse_budget_annotation(raw).containers
    except BudgetAnnotationError as exc:
        raise DemandError(f"{ANNOTATION_BUDGET}: {exc}") from None


def _container_demands(container: Mapping[str, Any], init: bool, sidecar: bool,
                       budgets: Mapping[str, PerShareBudget]) -> list[Demand]:
    name = str(container.get("name", ""))
    amounts = _amounts(container)
    out: list[Demand] = []
    shares = _count(name, VGPU, amounts[VGPU]) if VGPU in amounts else 0
    if shares > 0:
        budget = budgets.get(name)
        if budget is None:
            budget = PerShareBudget.from_totals(
                shares,
                _count(name, VGPU_MEMORY, amounts.get(VGPU_MEMORY, 0)),
                _count(name, VGPU_CORES, amounts.get(VGPU_CORES, 0)))
        out.append(Demand(container=name, init=init, sidecar=sidecar, resource=VGPU,
                          count=shares, memory_mib=budget.memory_bytes // MIB,
                          cores=float(budget.cores)))
    for resource in sorted(r for r in amounts if r.startswith(MIG_PREFIX)):
        if profile_from_resource(resource) is None:
            raise DemandError(f"container {name}: {resource!r} names no MIG profile")
        count = _count(name, resource, amounts[resource])
        if count > 0:
            out.append(Demand(container=name, init=init, sidecar=sidecar, resource=resource,
                              count=count, memory_mib=0, cores=0.0))
    return out


def pod_demands(pod: Mapping[str, Any]) -> list[Demand]:
    """Every GPU demand of the pod in declaration order; empty when it asks for no GPU."""
    spec = pod.get("spec") or {}
    budgets = _budgets(pod)
    out: list[Demand] = []
    for c in spec.get("initContainers") or []:
        sidecar = c.get("restartPolicy") == "Always"
        out += _container_demands(c, init=not sidecar, sidecar=sidecar, budgets=budgets)
    for c in spec.get("containers") or []:
        out += _container_demands(c, init=False, sidecar=False, budgets=budgets)
    return out
