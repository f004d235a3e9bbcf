"""GPUQuota objects (raw API dicts) to and from the arithmetic's values: one reader.

A GPUQuota's spec is read once per version of the object, by the API type itself
(:class:`tessera.api.quota.GPUQuotaSpec`, the model the CRD is generated from, quantities
with apimachinery's exact parser), into one value: :class:`~tessera_operator.quota.arith.QuotaView`
(its limits, its per-pod policy if it carries one, what it has in use, and the problem if a
field cannot be read).  Admission, the leader's reconcile, the metrics and the resize all
take that value (:meth:`tessera_operator.cache.quotas.QuotaCache.view` keeps it per
resourceVersion).  A spec value that cannot be read is an error naming the field
(:class:`FieldError`): the quota then admits nothing and says why in its conditions; it
never means "no limit".  A status that cannot be read (someone edited it by hand) counts as
never counted: admission waits for the operator's next count, which rewrites it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from tessera.api.meta import FieldPathError
from tessera.api.quantity import Quantity
from tessera.api.quota import GPUQuotaSpec, PodBudgetLimits, QuotaUsage
from tessera_operator.quota.arith import FieldError, Limits, QuotaPolicy, QuotaView, Usage
from tessera_operator.quota.units import MIB, mib_quantity

__all__ = ["FieldError", "limits_of", "policy_of", "status_patch", "summary", "used_of",
           "used_to_status", "view_of"]

POLICY_FIELDS = ("default", "max", "weight", "lending", "idle")


def _at(raw: Any, loc: tuple[int | str, ...]) -> Any:
    for part in loc:
        if isinstance(raw, Mapping) and part in raw:
            raw = raw[part]
        else:
            return None
    return raw


def _spec(spec: Any, quota: str | None) -> GPUQuotaSpec:
    """The spec as the API type reads it; :class:`FieldError` naming the first field that
    it cannot read."""
    if not isinstance(spec, Mapping):
        raise FieldError(quota, "spec", spec, "must be an object")
    try:
        return GPUQuotaSpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = tuple(first["loc"])
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, FieldPathError):
            loc = (*loc, *cause.path.split("."))  # relative to the model that checks it
        reason = str(cause) if cause is not None else first["msg"]
        field = ".".join(["spec", *map(str, loc)])
        raise FieldError(quota, field, _at(spec, loc), reason) from None


def _mib(q: Quantity | None) -> int | None:
    return None if q is None else math.ceil(q.value / MIB)


def _limits(s: GPUQuotaSpec) -> Limits:
    h = s.hard
    if h is None:
        return Limits()
    return Limits(_mib(h.memory), h.cores, h.pods, dict(h.mig_instances or {}))


def _policy(s: GPUQuotaSpec, quota: str) -> QuotaPolicy | None:
    """The per-pod policy this quota carries (``default``, ``max``, ``weight``, ``lending``),
    or None when it carries none."""
    if all(getattr(s, f) is None for f in POLICY_FIELDS):
        return None
    d, m = s.default or PodBudgetLimits(), s.max or PodBudgetLimits()
    return QuotaPolicy(quota=quota, default_memory_mib=_mib(d.memory), default_cores=d.cores,
                       max_memory_mib=_mib(m.memory), max_cores=m.cores, weight=s.weight or 1,
                       lending=True if s.lending is None else s.lending)


def limits_of(spec: Mapping[str, Any], quota: str | None = None) -> Limits:
    """``spec.hard``; raises :class:`FieldError` naming a field that cannot be read."""
    return _limits(_spec(spec, quota))


def used_of(status: Mapping[str, Any] | None) -> Usage | None:
    """``status.used``, read by the API type; None when never counted (or unreadable: the
    next count rewrites it)."""
    used = (status or {}).get("used")
    if not isinstance(used, Mapping):
        return None
    try:
        u = QuotaUsage.model_validate(used)
    except ValidationError:
        return None
    return Usage(_mib(u.memory) or 0, u.cores, u.pods,
                 {k: v for k, v in u.mig_instances.items() if v})


def view_of(obj: Mapping[str, Any]) -> QuotaView:
    """The quota, read once: what admission, the count and the metrics decide on.  A spec
    it cannot read makes it refuse all (``problem`` names the field)."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name"))
    used = used_of(obj.get("status"))
    raw = obj.get("spec") or {}
    carries = isinstance(raw, Mapping) and any(raw.get(f) is not None for f in POLICY_FIELDS)
    try:
        spec = _spec(raw, name)
    except FieldError as exc:  # says the field; refusals name the quota
        text = str(exc)
        problem = text.split(" ", 2)[2] if text.startswith("GPUQuota ") else text
        return QuotaView(name, Limits(), used or Usage(), str(meta.get("resourceVersion", "")),
                         used is not None, problem, carries_policy=carries, error=exc)
    return QuotaView(name, _limits(spec), used or Usage(), str(meta.get("resourceVersion", "")),
                     used is not None, None, _policy(spec, name), carries_policy=carries)


def policy_of(views: Iterable[QuotaView]) -> QuotaPolicy:
    """The namespace's per-pod policy: from the (one) quota carrying default/max/weight/
    lending.  Raises :class:`FieldError` when that quota's spec cannot be read."""
    for v in sorted((v for v in views if v.carries_policy), key=lambda v: v.name):
        if v.error is not None:
            raise v.error
        if v.policy is not None:
            return v.policy
    return QuotaPolicy()


def used_to_status(u: Usage) -> dict[str, Any]:
    """``status.used`` as written; MIG profiles not in use are removed (merge-patch null)."""
    return {"memory": mib_quantity(u.memory_mib) if u.memory_mib else "0", "cores": u.cores,
            "pods": u.pods, "migInstances": {k: v for k, v in sorted(u.mig.items()) if v}}


def summary(limits: Limits, u: Usage) -> dict[str, str]:
    """used/hard texts for the printer columns."""
    def pair(used: str, hard: str | None) -> str:
        return used if hard is None else f"{used}/{hard}"
    return {
        "cores": pair(str(u.cores), None if limits.cores is None else str(limits.cores)),
        "memory": pair(mib_quantity(u.memory_mib) if u.memory_mib else "0",
                       None if limits.memory_mib is None else mib_quantity(limits.memory_mib)),
        "pods": pair(str(u.pods), None if limits.pods is None else str(limits.pods)),
    }


def _keys(raw: Any) -> set[str]:
    """The keys of a map in a status as stored (read or not), to null what must go."""
    return {str(k) for k in raw} if isinstance(raw, Mapping) else set()


def status_patch(obj: Mapping[str, Any], used: Usage, limits: Limits) -> dict[str, Any]:
    """Merge patch writing ``used`` and the summary (against ``limits``) only if ``obj`` is
    current; MIG profiles that dropped to zero are nulled so the merge patch removes them."""
    status = obj.get("status") or {}
    out = used_to_status(used)
    raw_used = status.get("used")
    for k in _keys(raw_used.get("migInstances") if isinstance(raw_used, Mapping) else None):
        if k not in used.mig:
            out["migInstances"][k] = None
    meta = obj.get("metadata") or {}
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"used": out, "summary": summary(limits, used)}}
