"""What a ResourceClaim asks of tessera's devices, for GPUQuota (pure).

A claim (or a ResourceClaimTemplate's claim) asks tessera's devices through the requests
that name one of tessera's DeviceClasses (:data:`tessera.api.names.DRA_DEVICE_CLASSES`):
``exactly`` requests, and ``firstAvailable`` subrequests.  Under a GPUQuota each such
request must say what it takes of each device -- ``capacity.requests.memory`` and
``cores`` -- because that is what GPUQuota counts and what the node budgets; a request that
does not say gets the GPUQuota's ``default`` filled in at admission (as a pod's limits
do), and one that still does not say is refused with what to add.

What a claim counts (:func:`claim_ask`):

* an ``exactly`` request: ``count`` x its capacity (``allocationMode: All`` is refused: it
  takes every matching device, a number nobody can count at admission);
* a ``firstAvailable`` request: the most any of its tessera subrequests would take (the
  scheduler picks one; which is not known at admission);
* ``adminAccess`` is refused: it reaches devices other claims hold, beyond any quota.

Kubernetes' own ResourceQuota counts a claim's devices, never their capacity (1.34-1.37), so
the capacity count is tessera's.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import DRA_CAPACITY_CORES, DRA_CAPACITY_MEMORY, DRA_DEVICE_CLASSES
from tessera.dra.requests import stated_capacity
from tessera_operator.quota.arith import QuotaPolicy, Usage
from tessera_operator.quota.units import count, memory_mib

MAX_COUNT = 64
"""Most devices one tessera request may ask for (DRA allows a claim at most 32 requests of
any count; a quota needs a bound)."""


class ClaimRequestError(ValueError):
    """The claim cannot be counted; the message names the field and what to write."""


class CapacityNotStated(ClaimRequestError):
    """A tessera request states no memory or cores (admission fills them; the API server
    drops them where consumable capacity is off)."""


@dataclass(frozen=True)
class DeviceAsk:
    """One request (or subrequest) of a claim that names a tessera DeviceClass."""

    where: str
    """Its field path in the claim, as a message names it (``spec.devices.requests[0].exactly``)."""
    pointer: str
    """Its JSON pointer in the object (for the admission patch)."""
    body: Mapping[str, Any] = field(compare=False)
    alternative_of: int | None = None
    """For a ``firstAvailable`` subrequest: the index of its request."""


def device_asks(spec: Mapping[str, Any], where: str = "spec", pointer: str = "/spec"
                ) -> list[DeviceAsk]:
    """The requests of claim spec ``spec`` that name a tessera DeviceClass."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: list[DeviceAsk] = []
    for i, r in enumerate(requests if isinstance(requests, list) else []):
        if not isinstance(r, Mapping):
            continue
        here, at = f"{where}.devices.requests[{i}]", f"{pointer}/devices/requests/{i}"
        exactly = r.get("exactly")
        if isinstance(exactly, Mapping) and exactly.get("deviceClassName") in DRA_DEVICE_CLASSES:
            out.append(DeviceAsk(f"{here}.exactly", f"{at}/exactly", exactly))
        subs = r.get("firstAvailable")
        for j, sub in enumerate(subs if isinstance(subs, list) else []):
            if isinstance(sub, Mapping) and sub.get("deviceClassName") in DRA_DEVICE_CLASSES:
                out.append(DeviceAsk(f"{here}.firstAvailable[{j}]",
                                     f"{at}/firstAvailable/{j}", sub, alternative_of=i))
    return out


def _count(ask: DeviceAsk) -> int:
    mode = ask.body.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise ClaimRequestError(
            f"{ask.where}.allocationMode: {mode} takes every matching tessera device, which a "
            f"GPUQuota cannot count; ask for a count (allocationMode: ExactCount, count: N)")
    raw = ask.body.get("count", 1)
    try:
        n = count(raw)
    except (ValueError, TypeError):
        raise ClaimRequestError(f"{ask.where}.count: {raw!r} is not a whole number") from None
    if not 1 <= n <= MAX_COUNT:
        raise ClaimRequestError(f"{ask.where}.count: {n} is not between 1 and {MAX_COUNT}")
    return n


def device_usage(ask: DeviceAsk) -> Usage:
    """What one request takes: ``count`` x (memory, cores) as stated.  Raises
    :class:`ClaimRequestError` for what cannot be counted (a value missing or unreadable,
    ``All``, ``adminAccess``)."""
    if ask.body.get("adminAccess") is True:
        raise ClaimRequestError(
            f"{ask.where}.adminAccess: admin access reaches tessera devices that other claims "
            f"hold, beyond any GPUQuota; it is refused in a namespace with a GPUQuota")
    n = _count(ask)
    cap = stated_capacity(ask.body)
    missing = [k for k in (DRA_CAPACITY_MEMORY, DRA_CAPACITY_CORES) if k not in cap]
    if missing:
        raise CapacityNotStated(
            f"{ask.where}.capacity.requests: {' and '.join(missing)} not stated, and a GPUQuota "
            f"counts what each tessera device of a claim takes; state "
            f"{' and '.join(missing)} (e.g. memory: 4Gi, cores: 30)")
    try:
        mem = memory_mib(cap[DRA_CAPACITY_MEMORY])
    except (ValueError, TypeError):
        raise ClaimRequestError(f"{ask.where}.capacity.requests.memory: "
                                f"{cap[DRA_CAPACITY_MEMORY]!r} is not a quantity") from None
    try:
        cores = count(cap[DRA_CAPACITY_CORES])
    except (ValueError, TypeError):
        raise ClaimRequestError(f"{ask.where}.capacity.requests.cores: "
                                f"{cap[DRA_CAPACITY_CORES]!r} is not a whole number") from None
    if mem < 1:
        raise ClaimRequestError(f"{ask.where}.capacity.requests.memory: a GPU budget without "
                                f"memory is no budget; ask for at least 1Mi")
    if not 1 <= cores <= 100:
        raise ClaimRequestError(f"{ask.where}.capacity.requests.cores: {cores} is not a "
                                f"percentage of a device's SM time between 1 and 100")
    return Usage(memory_mib=mem * n, cores=cores * n)


def claim_ask(spec: Mapping[str, Any], where: str = "spec") -> Usage:
    """What claim spec ``spec`` takes of tessera's devices at most (module docstring)."""
    total = Usage()
    alternatives: dict[int, Usage] = {}
    for ask in device_asks(spec, where):
        u = device_usage(ask)
        if ask.alternative_of is None:
            total = total + u
            continue
        best = alternatives.get(ask.alternative_of, Usage())
        alternatives[ask.alternative_of] = Usage(max(best.memory_mib, u.memory_mib),
                                                 max(best.cores, u.cores))
    for u in alternatives.values():
        total = total + u
    return total


def fill_capacity(spec: Mapping[str, Any], policy: QuotaPolicy, where: str = "spec",
                  pointer: str = "/spec") -> list[dict[str, Any]]:
    """The JSON patch that states each tessera request's missing ``memory`` and ``cores``
    from the GPUQuota's ``default`` (cores: 100 when it sets none, as for pods).  Raises
    :class:`ClaimRequestError` when memory is missing and there is no default."""
    return [op for ask in device_asks(spec, where, pointer)
            for op in _fill_one(ask, _filled_values(ask, policy))]


def filled_spec(spec: Mapping[str, Any], policy: QuotaPolicy, where: str = "spec"
                ) -> dict[str, Any]:
    """``spec`` as :func:`fill_capacity`'s patch leaves it (what admission counts)."""
    out = copy.deepcopy(dict(spec))
    for ask in device_asks(out, where):
        add = _filled_values(ask, policy)
        if add:
            body = ask.body
            assert isinstance(body, dict)
            cap = body.setdefault("capacity", {})
            if not isinstance(cap, dict):
                cap = body["capacity"] = {}
            req = cap.setdefault("requests", {})
            if not isinstance(req, dict):
                req = cap["requests"] = {}
            req.update(add)
    return out


def _filled_values(ask: DeviceAsk, policy: QuotaPolicy) -> dict[str, str]:
    cap = stated_capacity(ask.body)
    add: dict[str, str] = {}
    if DRA_CAPACITY_MEMORY not in cap:
        if not policy.default_memory_mib:
            quota = f'GPUQuota "{policy.quota}"' if policy.quota else "the GPUQuota"
            raise CapacityNotStated(
                f"{ask.where}.capacity.requests.memory: not stated, and {quota} sets no "
                f"default memory; state the memory each device of this request takes "
                f"(e.g. memory: 4Gi)")
        add[DRA_CAPACITY_MEMORY] = f"{policy.default_memory_mib}Mi"
    if DRA_CAPACITY_CORES not in cap:
        add[DRA_CAPACITY_CORES] = str(100 if policy.default_cores is None
                                      else min(policy.default_cores, 100))
    return add


def _fill_one(ask: DeviceAsk, add: Mapping[str, str]) -> list[dict[str, Any]]:
    if not add:
        return []
    outer = ask.body.get("capacity")
    if not isinstance(outer, Mapping):
        return [{"op": "add", "path": f"{ask.pointer}/capacity", "value": {"requests": add}}]
    if not isinstance(outer.get("requests"), Mapping):
        return [{"op": "add", "path": f"{ask.pointer}/capacity/requests", "value": dict(add)}]
    return [{"op": "add", "path": f"{ask.pointer}/capacity/requests/{k}", "value": v}
            for k, v in add.items()]


def over_max(asked: Usage, policy: QuotaPolicy) -> str | None:
    """Why a claim asks for more than the GPUQuota's per-pod ``max`` allows (a claim is
    held to the same bound as a pod), if it does."""
    quota = f'GPUQuota "{policy.quota}"'
    if policy.max_memory_mib is not None and asked.memory_mib > policy.max_memory_mib:
        return (f"the claim asks for {asked.memory_mib}Mi of GPU memory in all, more than "
                f"{quota} allows one pod (max.memory {policy.max_memory_mib}Mi)")
    if policy.max_cores is not None and asked.cores > policy.max_cores:
        return (f"the claim asks for {asked.cores} cores in all, more than {quota} allows "
                f"one pod (max.cores {policy.max_cores})")
    return None
