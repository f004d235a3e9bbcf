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
* ``adminAccess`` is refused: it reaches devices other claims hold, beyond any quota;
* the claim is one GPU pod (``hard.pods``), whatever its requests: a claim made from a
  ResourceClaimTemplate is one pod's, and a shared claim is one budget its pods share;
* a request through the MIG class (``mig.gpu.tessera.dev``) takes ``count`` whole instances
  of the profile its selectors pin (:func:`pinned_profile`), for ``hard.migInstances``.
  One that pins a profile and states no capacity at all asks for **whole instances**, as a
  pod's ``tessera.dev/mig-<profile>`` does: nothing is filled in, it counts its instances
  (and its pod) but no memory or cores, and the node gives each instance whole (an
  exclusive device has no limit; a shared one is allocated all of its capacity). One that
  states some capacity asks for a share of an instance: completed from ``default`` and
  counted in memory and cores as well.
  Under a GPUQuota that limits MIG instances, a MIG-class request that pins no single
  profile is refused (its instances could be of any profile); under one that does not, an
  unpinned request counts no instance, as a pod's ``tessera.dev/mig-*`` of a profile the
  GPUQuota does not list is not limited.

Kubernetes' own ResourceQuota counts a claim's devices, never their capacity (1.34-1.37), so
the capacity count is tessera's.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import (
    DRA_ATTRIBUTE_MIG_PROFILE,
    DRA_CAPACITY_CORES,
    DRA_CAPACITY_MEMORY,
    DRA_DEVICE_CLASS_MIG,
    DRA_DEVICE_CLASSES,
    DRA_DRIVER,
    GPU_POD,
    MIG_PREFIX,
)
from tessera.api.profile import PROFILE_NAME_PATTERN
from tessera.dra.requests import stated_capacity
from tessera_operator.quota.arith import RES_PODS, QuotaPolicy, QuotaView, Usage
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


# -- MIG instances: the profile a request's selectors pin ---------------------------------

_STR = r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
_ATTRIBUTE = (rf"device\s*\.\s*attributes\s*\[\s*(?P<domain>{_STR})\s*\]\s*"
              rf"(?:\.\s*(?P<field>[A-Za-z_][A-Za-z0-9_]*)|\[\s*(?P<key>{_STR})\s*\])")
_PIN = (re.compile(rf"{_ATTRIBUTE}\s*==\s*(?P<value>{_STR})", re.S),
        re.compile(rf"(?P<value>{_STR})\s*==\s*{_ATTRIBUTE}", re.S))
_PROFILE = re.compile(PROFILE_NAME_PATTERN)


def _unquote(literal: str) -> str:
    """A CEL string literal's text (an escaped character stands for itself)."""
    return re.sub(r"\\(.)", r"\1", literal[1:-1], flags=re.S)


def _strip_parens(expr: str) -> str:
    """``expr`` without parentheses that enclose all of it."""
    expr = expr.strip()
    while expr.startswith("(") and expr.endswith(")") and _closing(expr, 0) == len(expr) - 1:
        expr = expr[1:-1].strip()
    return expr


def _code(expr: str, at: int = 0) -> Iterator[tuple[int, int]]:
    """(index, bracket depth after it) of each character of CEL ``expr`` from ``at`` that is
    outside string literals; a literal left open ends it with ``(len(expr), -1)``."""
    depth, quote, i = 0, "", at
    while i < len(expr):
        ch = expr[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        else:
            depth += (ch in "([{") - (ch in ")]}")
            yield i, depth
        i += 1
    if quote:
        yield len(expr), -1


def _closing(expr: str, at: int) -> int:
    """Where the bracket opened at ``at`` closes (-1: never), skipping string literals."""
    for i, depth in _code(expr, at):
        if depth == 0 and i < len(expr) and expr[i] in ")]}":
            return i
    return -1


def conjuncts(expr: str) -> list[str]:
    """The parts of CEL ``expr`` that must all hold: split at its top-level ``&&``; the
    whole expression when it has a top-level ``||`` or ``?:`` (``&&`` binds tighter, so a
    part of it need not hold) or cannot be scanned."""
    parts: list[str] = []
    start, skip, depth = 0, -1, 0
    for i, depth in _code(expr):
        if i == len(expr) or i <= skip:
            continue  # a literal left open (depth -1), or the second "&" of "&&"
        if depth == 0 and (expr.startswith("||", i) or expr[i] == "?"):
            return [_strip_parens(expr)]
        if depth == 0 and expr.startswith("&&", i):
            parts.append(expr[start:i])
            start, skip = i + 2, i + 1
    if depth:
        return [_strip_parens(expr)]
    parts.append(expr[start:])
    out: list[str] = []
    for p in parts:
        inner = _strip_parens(p)
        out.extend(conjuncts(inner) if inner != p.strip() else [inner])
    return out


def pinned_by(expr: str) -> str | None:
    """The MIG profile CEL ``expr`` pins, if it is exactly
    ``device.attributes["gpu.tessera.dev"].migProfile == "<profile>"`` (either quote, any
    spacing, either side of ``==``, ``["migProfile"]`` for ``.migProfile``, in
    parentheses)."""
    expr = _strip_parens(expr)
    for pattern in _PIN:
        m = pattern.fullmatch(expr)
        if m is None:
            continue
        attr = m["field"] or _unquote(m["key"] or "''")
        if _unquote(m["domain"]) == DRA_DRIVER and attr == DRA_ATTRIBUTE_MIG_PROFILE:
            return _unquote(m["value"])
    return None


def pins(body: Mapping[str, Any]) -> set[str]:
    """The MIG profiles a request's (or subrequest's) CEL selectors pin, each selector's
    top-level ``&&`` parts read on their own (all of them must hold)."""
    out: set[str] = set()
    selectors = body.get("selectors")
    for sel in selectors if isinstance(selectors, list) else []:
        cel = sel.get("cel") if isinstance(sel, Mapping) else None
        expr = cel.get("expression") if isinstance(cel, Mapping) else None
        if not isinstance(expr, str):
            continue
        for part in conjuncts(expr):
            pinned = pinned_by(part)
            if pinned is not None:
                out.add(pinned)
    return out


def pinned_profile(body: Mapping[str, Any]) -> str | None:
    """The one MIG profile a request pins (a valid profile name), or None: it pins none, or
    more than one (then no device matches them all)."""
    found = pins(body)
    if len(found) != 1:
        return None
    (only,) = found
    return only if _PROFILE.fullmatch(only) else None


def pin_example(profile: str) -> str:
    """A selector that pins ``profile``, as a claim writes it."""
    return (f'selectors: [{{cel: {{expression: \'device.attributes["{DRA_DRIVER}"].'
            f'{DRA_ATTRIBUTE_MIG_PROFILE} == "{profile}"\'}}}}]')


@dataclass(frozen=True)
class MigLimit:
    """The GPUQuota of the namespace that limits MIG instances (``hard.migInstances``)."""

    quota: str
    profiles: tuple[str, ...]


def mig_limit_of(views: Iterable[QuotaView]) -> MigLimit | None:
    """The first GPUQuota (by name) that lists any profile in ``hard.migInstances``."""
    for v in sorted(views, key=lambda v: v.name):
        if v.hard.mig:
            return MigLimit(v.name, tuple(sorted(v.hard.mig)))
    return None


def _instances(ask: DeviceAsk, n: int, mig: MigLimit | None) -> dict[str, int]:
    """The MIG instances a request takes: ``n`` of the profile it pins, through the MIG
    class only (the class of any device counts memory and cores, as a pod's
    ``tessera.dev/vgpu`` does)."""
    if ask.body.get("deviceClassName") != DRA_DEVICE_CLASS_MIG:
        return {}
    profile = pinned_profile(ask.body)
    if profile is not None:
        return {profile: n}
    if mig is None:
        return {}
    found = sorted(pins(ask.body))
    says = (f"it pins {' and '.join(found)}, and no instance is of more than one profile"
            if len(found) > 1 else f"it pins {found[0]!r}, not a MIG profile name"
            if found else "it pins none")
    raise ClaimRequestError(
        f"{ask.where}.selectors: GPUQuota \"{mig.quota}\" limits MIG instances "
        f"(hard.migInstances: {', '.join(mig.profiles)}), and a request through "
        f"{DRA_DEVICE_CLASS_MIG} counts instances of the one profile its selectors pin; "
        f"{says}. Pin one profile, e.g. {pin_example(mig.profiles[0])}")


def device_usage(ask: DeviceAsk, mig: MigLimit | None = None) -> Usage:
    """What one request takes: ``count`` x (memory, cores) as stated, and through the MIG
    class ``count`` instances of the profile it pins.  Raises :class:`ClaimRequestError`
    for what cannot be counted (a value missing or unreadable, ``All``, ``adminAccess``,
    under ``mig`` a MIG-class request that pins no one profile)."""
    if ask.body.get("adminAccess") is True:
        raise ClaimRequestError(
            f"{ask.where}.adminAccess: admin access reaches tessera devices that other claims "
            f"hold, beyond any GPUQuota; it is refused in a namespace with a GPUQuota")
    n = _count(ask)
    whole = whole_instances(ask)
    if whole is not None:
        return Usage(mig={whole: n})
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
    return Usage(memory_mib=mem * n, cores=cores * n, mig=_instances(ask, n, mig))


def claim_ask(spec: Mapping[str, Any], where: str = "spec", mig: MigLimit | None = None
              ) -> Usage:
    """What claim spec ``spec`` takes of tessera's devices at most (module docstring): one
    GPU pod when it asks any, and its requests' memory, cores and MIG instances."""
    total = Usage()
    alternatives: dict[int, Usage] = {}
    asks = device_asks(spec, where)
    for ask in asks:
        u = device_usage(ask, mig)
        if ask.alternative_of is None:
            total = total + u
            continue
        alternatives[ask.alternative_of] = alternatives.get(ask.alternative_of, Usage()).peak(u)
    for u in alternatives.values():
        total = total + u
    return total + Usage(pods=1) if asks else total


def claim_note(resources: Iterable[str]) -> str:
    """What a refusal of a claim over ``resources`` (a GPUQuota's names, ``pods`` or
    ``tessera.dev/mig-<profile>``, or the managed ResourceQuota's) should add: how a claim
    counts in them ("" when none is pods or MIG instances)."""
    names = {r.removeprefix("requests.") for r in resources}
    notes = []
    if names & {RES_PODS, GPU_POD}:
        notes.append("a claim for tessera devices counts as one GPU pod in hard.pods")
    if any(r.startswith(MIG_PREFIX) for r in names):
        notes.append(f"each device a request through {DRA_DEVICE_CLASS_MIG} takes counts as "
                     f"one instance of the profile it pins in hard.migInstances")
    return f" ({'; '.join(notes)})" if notes else ""


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


def whole_instances(ask: DeviceAsk) -> str | None:
    """The profile of a request for whole MIG instances (module docstring), or None."""
    if ask.body.get("deviceClassName") != DRA_DEVICE_CLASS_MIG or stated_capacity(ask.body):
        return None
    return pinned_profile(ask.body)


def _filled_values(ask: DeviceAsk, policy: QuotaPolicy) -> dict[str, str]:
    cap = stated_capacity(ask.body)
    add: dict[str, str] = {}
    if whole_instances(ask) is not None:
        return add  # whole instances: nothing to state
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


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str


def claim_users(claims: Iterable[Mapping[str, Any]]) -> list[PodRef]:
    """The pods that claims allocated devices of tessera's are reserved for (the scheduler
    reserves a claim for each pod it binds with it), each once, in order."""
    out: dict[str, PodRef] = {}
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or []
        if not any(isinstance(r, Mapping) and r.get("driver") == DRA_DRIVER for r in results):
            continue
        for r in status.get("reservedFor") or []:
            if isinstance(r, Mapping) and r.get("resource") == "pods" and not r.get("apiGroup") \
                    and r.get("uid") and r.get("name"):
                out.setdefault(str(r["uid"]), PodRef(str(meta.get("namespace")),
                                                     str(r["name"]), str(r["uid"])))
    return sorted(out.values(), key=lambda p: (p.namespace, p.name, p.uid))
