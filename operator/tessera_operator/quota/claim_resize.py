"""Live resize of a pod's DRA claims: the rules, without any I/O.

A pod whose GPUs come from DRA claims asks for a resize as any pod does, with
``tessera.dev/budget-request`` naming containers (:func:`tessera_operator.quota.resize.
parse_request`).  Each container named must use exactly one claim of tessera's, and that
claim must be

* **the pod's own**: made from a ResourceClaimTemplate for it (its controller owner is the
  pod), so nothing else uses it and it ends with the pod.  A named claim may be shared by
  other pods and outlive this one: whose resize would its budget follow, and who would hold
  its growth after the pod is gone?  It is refused, with what to do instead;
* **one device** (a budget file names one budget per device; which device a multi-device
  claim's new size is for is not said);
* **a share**: its allocation recorded ``consumedCapacity`` (a shared device on an API
  server with ``DRAConsumableCapacity``).  A device allocated whole has all of it already.

The new budget is checked against the per-pod ``max`` (each claim is a pod's GPU budget, as
the claims webhook counts it); what grows beyond the allocation is the growth the operator
holds in the quota (growth holders) and the node holds on the device (less capacity
published).  The outcome goes into ``tessera.dev/claim-budget``
(:mod:`tessera.api.claim_budget`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tessera.api.claim_budget import ClaimBudget
from tessera.api.names import DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY, DRA_DRIVER
from tessera_operator.quota.arith import QuotaPolicy, Usage, claims_growth
from tessera_operator.quota.resize import ResizeError, parse_request
from tessera_operator.quota.units import count, memory_mib, mib_quantity

CORES = 100


@dataclass(frozen=True)
class ClaimResizePlan:
    budgets: dict[str, ClaimBudget]
    """Claim UID -> its budget after the resize (every claim of the annotation)."""
    grow: Usage
    shrink: Usage


def claims_by_container(pod: Mapping[str, Any]) -> dict[str, list[str]]:
    """Container -> the names of the claims it uses (a template's claim once generated; an
    entry whose claim is not generated yet is left out)."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in status.get("resourceClaimStatuses") or [] if isinstance(s, Mapping)}
    names = {}
    for entry in spec.get("resourceClaims") or []:
        if isinstance(entry, Mapping):
            name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
            if name:
                names[entry.get("name")] = str(name)
    out: dict[str, list[str]] = {}
    for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if not isinstance(c, Mapping):
            continue
        used = [names[r.get("name")] for r in (c.get("resources") or {}).get("claims") or []
                if isinstance(r, Mapping) and r.get("name") in names]
        out[str(c.get("name"))] = used
    return out


def tessera_results(claim: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The claim's allocation results on tessera's devices (none: not tessera's, or not
    allocated)."""
    alloc = (claim.get("status") or {}).get("allocation") or {}
    return [r for r in (alloc.get("devices") or {}).get("results") or []
            if isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER]


def owned_by(claim: Mapping[str, Any], pod_uid: str) -> bool:
    return any(isinstance(o, Mapping) and o.get("uid") == pod_uid and o.get("controller")
               for o in (claim.get("metadata") or {}).get("ownerReferences") or [])


def allocated_share(claim: Mapping[str, Any], pod_uid: str) -> ClaimBudget:
    """The claim as its allocation sized it (memory MiB, cores); ResizeError when it cannot
    be resized (see the module's docstring)."""
    meta = claim.get("metadata") or {}
    name = str(meta.get("name"))
    if not owned_by(claim, pod_uid):
        raise ResizeError(
            f"ResourceClaim {name} is not this pod's own (one a ResourceClaimTemplate made for "
            f"it): a claim that other pods may share and that outlives the pod is not resized "
            f"through one of them; give the pod a ResourceClaimTemplate instead")
    results = tessera_results(claim)
    if len(results) != 1:
        raise ResizeError(f"ResourceClaim {name} has {len(results)} devices of {DRA_DRIVER} "
                          f"allocated; only a claim of one device can be resized")
    consumed = results[0].get("consumedCapacity")
    if not isinstance(consumed, Mapping) or DRA_CAPACITY_MEMORY not in consumed \
            or DRA_CAPACITY_CORES not in consumed:
        raise ResizeError(
            f"ResourceClaim {name} has device {results[0].get('device')} whole (its allocation "
            f"consumed no capacity: the device is exclusive, or the API server's "
            f"DRAConsumableCapacity feature is off); a whole device has nothing to grow into")
    try:
        mem, cores = memory_mib(consumed[DRA_CAPACITY_MEMORY]), count(consumed[DRA_CAPACITY_CORES])
    except (ValueError, TypeError):
        raise ResizeError(f"ResourceClaim {name}: its consumed capacity {dict(consumed)} "
                          f"cannot be read") from None
    if mem <= 0 or not 0 < cores <= CORES:
        raise ResizeError(f"ResourceClaim {name}: its consumed capacity {dict(consumed)} is "
                          f"outside what a device has")
    return ClaimBudget(name, mem, cores, mem, cores)


def plan_claims(pod: Mapping[str, Any], request_text: str, claims: Mapping[str, Mapping[str, Any]],
                current: Mapping[str, ClaimBudget], policy: QuotaPolicy) -> ClaimResizePlan:
    """The claims' new budgets and what grows and shrinks. ``claims``: the pod's claims by
    name, as the API server has them; ``current``: ``tessera.dev/claim-budget`` now."""
    asked = parse_request(request_text)
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    used = claims_by_container(pod)
    budgets = dict(current)
    chosen: dict[str, tuple[str, int, int]] = {}
    for container, (mem, cores) in asked.items():
        if container not in used:
            raise ResizeError(f"the pod has no container {container!r}")
        mine = [n for n in used[container] if n in claims and tessera_results(claims[n])]
        if len(mine) != 1:
            raise ResizeError(
                f"container {container!r} uses {len(mine)} claims of {DRA_DRIVER}"
                + (f" ({', '.join(mine)})" if mine else "")
                + "; a resize names one budget per container: it must use exactly one")
        claim = claims[mine[0]]
        cuid = str((claim.get("metadata") or {}).get("uid") or "")
        base = allocated_share(claim, uid)
        now = budgets.get(cuid, base)
        if (now.allocated_memory_mib, now.allocated_cores) != (base.allocated_memory_mib,
                                                                base.allocated_cores):
            now = base  # a budget of another allocation (the claim was allocated again)
        new_mem = now.memory_mib if mem is None else mem
        new_cores = now.cores if cores is None else cores
        if not 0 < new_cores <= CORES:
            raise ResizeError(f"container {container!r}: cores must be 1..{CORES} (percent of "
                              f"its device), not {new_cores}")
        if cuid in chosen and chosen[cuid][1:] != (new_mem, new_cores):
            raise ResizeError(f"containers {chosen[cuid][0]!r} and {container!r} use the same "
                              f"claim {base.claim} and ask for different sizes")
        chosen[cuid] = (container, new_mem, new_cores)
        if policy.max_memory_mib is not None and new_mem > policy.max_memory_mib:
            raise ResizeError(f"claim {base.claim} would hold {mib_quantity(new_mem)} GPU "
                              f'memory, over the per-pod GPUQuota "{policy.quota}" max '
                              f"{mib_quantity(policy.max_memory_mib)}")
        if policy.max_cores is not None and new_cores > policy.max_cores:
            raise ResizeError(f"claim {base.claim} would hold {new_cores} cores, over the "
                              f'per-pod GPUQuota "{policy.quota}" max {policy.max_cores}')
        budgets[cuid] = ClaimBudget(base.claim, new_mem, new_cores, base.allocated_memory_mib,
                                    base.allocated_cores)
    budgets = {k: b for k, b in budgets.items()
               if (b.memory_mib, b.cores) != (b.allocated_memory_mib, b.allocated_cores)}
    old, new = claims_growth(current), claims_growth(budgets)
    return ClaimResizePlan(
        budgets,
        Usage(max(0, new.memory_mib - old.memory_mib), max(0, new.cores - old.cores)),
        Usage(max(0, old.memory_mib - new.memory_mib), max(0, old.cores - new.cores)))
