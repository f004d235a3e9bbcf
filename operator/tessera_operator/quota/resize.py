"""Live resize of a running pod's budget: the rules, without any I/O.

A user asks with ``tessera.dev/budget-request`` on the pod: a JSON object naming containers
and, for each, a new ``memory`` (a Kubernetes quantity) and/or ``cores`` (percent of one
GPU), *totals* over the container's GPU shares, the units its limits use::

    {"main": {"memory": "12Gi", "cores": 40}, "@id": "2"}

(``@id`` is optional: a request is answered once, so asking for the same sizes again after
a refusal needs a different ``@id``.)

The operator checks the request against the namespace's per-pod ``max`` (the new budget as
a whole, as admission does) and, for what grows, against every GPUQuota's ``hard`` (a
growth is held by lowering the managed ResourceQuota's ``hard`` by it, a shrink gives it
back: :mod:`tessera_operator.quota.managed`). The node daemon then decides whether the
new memory fits beside the other budgets on the container's GPUs (``tessera_node`` side).
``tessera.dev/budget`` itself is only ever written by tessera; the pod's ``limits`` cannot
change, so the scheduler and Kubernetes' ResourceQuota keep counting the admitted totals
(docs/operator.md, "Live resize").

The outcome is recorded in ``tessera.dev/budget-resize`` (:mod:`tessera.api.resize`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api import budget as api_budget
from tessera_operator.quota.arith import QuotaPolicy, Usage, container_usage, usage_of
from tessera_operator.quota.units import memory_mib, mib_quantity

MIB = api_budget.MIB
REQUEST_ID = "@id"
"""Optional key of a request (not a container name: those are DNS labels): any string, so the
same sizes can be asked for again after a refusal (each request is answered once)."""


class ResizeError(ValueError):
    """A request that cannot be granted; the message is what the pod's status says."""


@dataclass(frozen=True)
class ResizePlan:
    budget: api_budget.BudgetAnnotation
    """The budget after the resize."""
    grow: Usage
    """Usage that grows (held against the quota), resource by resource."""
    shrink: Usage
    """Usage that shrinks (given back)."""


def usage_fields(u: Usage) -> dict[str, int]:
    return {"memoryMiB": u.memory_mib, "cores": u.cores}


def parse_request(text: str) -> dict[str, tuple[int | None, int | None]]:
    """Container -> (memory MiB, cores), None where unchanged. Errors name the field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ResizeError(f"budget request is not JSON: {exc.msg}") from None
    if not isinstance(raw, dict) or not raw:
        raise ResizeError('budget request must be a JSON object naming containers, e.g. '
                          '{"main": {"memory": "12Gi", "cores": 40}}')
    out: dict[str, tuple[int | None, int | None]] = {}
    if not isinstance(raw.pop(REQUEST_ID, ""), str):
        raise ResizeError(f"budget request {REQUEST_ID} must be a string")
    if not raw:
        raise ResizeError("budget request names no container")
    for name, want in raw.items():
        if not isinstance(want, dict) or not want or set(want) - {"memory", "cores"}:
            raise ResizeError(f"budget request for container {name!r} must be an object with "
                              f"memory and/or cores")
        mem = cores = None
        if "memory" in want:
            try:
                mem = memory_mib(want["memory"])
            except (ValueError, TypeError):
                raise ResizeError(f"container {name!r}: memory {want['memory']!r} is not a "
                                  f"quantity") from None
            if mem <= 0:
                raise ResizeError(f"container {name!r}: memory must be positive")
        if "cores" in want:
            c = want["cores"]
            if not isinstance(c, int) or isinstance(c, bool) or c < 0:
                raise ResizeError(f"container {name!r}: cores must be a whole number >= 0")
            cores = c
        out[str(name)] = (mem, cores)
    return out


def plan(current: api_budget.BudgetAnnotation, request_text: str, policy: QuotaPolicy,
         spec: Mapping[str, Any] | None = None) -> ResizePlan:
    """The new budget and what grows and shrinks; :class:`ResizeError` when refused."""
    asked = parse_request(request_text)
    containers = dict(current.containers)
    for name, (mem, cores) in asked.items():
        c = containers.get(name)
        if c is None or c.shares == 0:
            raise ResizeError(f"container {name!r} holds no GPU share of this pod's budget")
        total = container_usage(c)
        mem = total.memory_mib if mem is None else mem
        cores = total.cores if cores is None else cores
        if cores > 100 * c.shares:
            raise ResizeError(f"container {name!r}: cores {cores} exceed its {c.shares} "
                              f"share(s) (100 each)")
        containers[name] = api_budget.PerShareBudget.from_totals(c.shares, mem, cores, c.mig)
    new = current.model_copy(update={"containers": containers})
    old_u, new_u = usage_of(current, spec), usage_of(new, spec)
    if policy.max_memory_mib is not None and new_u.memory_mib > policy.max_memory_mib:
        raise ResizeError(f"pod would hold {mib_quantity(new_u.memory_mib)} GPU memory, over "
                          f'the per-pod GPUQuota "{policy.quota}" max '
                          f"{mib_quantity(policy.max_memory_mib)}")
    if policy.max_cores is not None and new_u.cores > policy.max_cores:
        raise ResizeError(f"pod would hold {new_u.cores} cores, over the per-pod GPUQuota "
                          f'"{policy.quota}" max {policy.max_cores}')
    grow = Usage(max(0, new_u.memory_mib - old_u.memory_mib), max(0, new_u.cores - old_u.cores))
    shrink = Usage(max(0, old_u.memory_mib - new_u.memory_mib),
                   max(0, old_u.cores - new_u.cores))
    return ResizePlan(new, grow, shrink)
