"""GPUQuota objects (raw API dicts) to and from the arithmetic's values.

Quantities are read with apimachinery's exact parser (:mod:`tessera_operator.quota.units`).  A spec
value that cannot be read is an error naming the field (:class:`FieldError`): the quota then
admits nothing and says why in its conditions, it never means "no limit".  A status that
cannot be read (someone edited it by hand) counts as never counted: admission waits for the
operator's next count, which rewrites it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera_operator.quota.arith import Limits, QuotaPolicy, QuotaView, Usage
from tessera_operator.quota.units import count, memory_mib, mib_quantity


class FieldError(ValueError):
    """A GPUQuota field that cannot be read; the message names the field and the fix."""

    def __init__(self, quota: str | None, field: str, value: Any, reason: str) -> None:
        self.field = field
        where = f'GPUQuota "{quota}" ' if quota else ""
        super().__init__(f"{where}{field} {value!r} cannot be read ({reason}): fix the "
                         f"GPUQuota; until then it admits no GPU pods")


def _read(quota: str | None, field: str, value: Any, conv: Any) -> int | None:
    if value is None:
        return None
    try:
        out: int = conv(value)
    except (ValueError, TypeError) as exc:
        raise FieldError(quota, field, value, str(exc)) from None
    if out < 0:
        raise FieldError(quota, field, value, "must not be negative")
    return out


def _mig(quota: str | None, field: str, raw: Any) -> dict[str, int]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise FieldError(quota, field, raw, "must map MIG profiles to counts")
    out = {}
    for k, v in raw.items():
        n = _read(quota, f"{field}.{k}", v, count)
        if n is not None:
            out[str(k)] = n
    return out


def limits_of(spec: Mapping[str, Any], quota: str | None = None) -> Limits:
    """``spec.hard``; raises :class:`FieldError` naming a field that cannot be read."""
    hard = spec.get("hard") or {}
    if not isinstance(hard, Mapping):
        raise FieldError(quota, "spec.hard", hard, "must be an object")
    return Limits(_read(quota, "spec.hard.memory", hard.get("memory"), memory_mib),
                  _read(quota, "spec.hard.cores", hard.get("cores"), count),
                  _read(quota, "spec.hard.pods", hard.get("pods"), count),
                  _mig(quota, "spec.hard.migInstances", hard.get("migInstances")))


def readable_limits(quota: Mapping[str, Any]) -> Limits | None:
    """A GPUQuota object's ``spec.hard``, or None when a field cannot be read (its managed
    ResourceQuota then admits no GPU pod: :func:`tessera_operator.quota.managed.hard_of`)."""
    try:
        return limits_of(quota.get("spec") or {})
    except FieldError:
        return None


def _usage(raw: Mapping[str, Any]) -> Usage:
    return Usage(_read(None, "memory", raw.get("memory"), memory_mib) or 0,
                 _read(None, "cores", raw.get("cores"), count) or 0,
                 _read(None, "pods", raw.get("pods"), count) or 0,
                 _mig(None, "migInstances", raw.get("migInstances")))


def used_of(status: Mapping[str, Any] | None) -> Usage | None:
    """``status.used``; None when never counted (or unreadable: the next count rewrites it)."""
    used = (status or {}).get("used")
    if not isinstance(used, Mapping):
        return None
    try:
        return _usage(used)
    except (ValueError, TypeError):
        return None


def view_of(obj: Mapping[str, Any]) -> QuotaView:
    """The quota as admission decides on it; a spec it cannot read makes it refuse all."""
    meta = obj.get("metadata") or {}
    name = str(meta.get("name"))
    used = used_of(obj.get("status"))
    problem = None
    try:
        limits = limits_of(obj.get("spec") or {})
    except FieldError as exc:  # says the field; refusals name the quota
        limits, problem = Limits(), str(exc)
    return QuotaView(name, limits, used or Usage(), str(meta.get("resourceVersion", "")),
                     used is not None, problem)


def carries_policy(spec: Mapping[str, Any]) -> bool:
    return any(spec.get(k) is not None for k in ("default", "max", "weight", "lending"))


def policy_of(quotas: Iterable[Mapping[str, Any]]) -> QuotaPolicy:
    """The namespace's per-pod policy: from the (one) quota carrying default/max/weight.

    Raises :class:`FieldError` naming a field that cannot be read.
    """
    carriers = sorted((q for q in quotas if carries_policy(q.get("spec") or {})),
                      key=lambda q: str((q.get("metadata") or {}).get("name")))
    if not carriers:
        return QuotaPolicy()
    q = carriers[0]
    name = str((q.get("metadata") or {}).get("name"))
    spec = q.get("spec") or {}
    d, m = spec.get("default") or {}, spec.get("max") or {}
    weight = _read(name, "spec.weight", spec.get("weight"), count)
    return QuotaPolicy(
        quota=name,
        default_memory_mib=_read(name, "spec.default.memory", d.get("memory"), memory_mib),
        default_cores=_read(name, "spec.default.cores", d.get("cores"), count),
        max_memory_mib=_read(name, "spec.max.memory", m.get("memory"), memory_mib),
        max_cores=_read(name, "spec.max.cores", m.get("cores"), count),
        weight=weight or 1,
        lending=_lending(name, spec.get("lending")))


def _lending(quota: str, raw: Any) -> bool:
    if raw is None:
        return True
    if not isinstance(raw, bool):
        raise FieldError(quota, "spec.lending", raw, "must be true or false")
    return raw


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


def status_patch(obj: Mapping[str, Any], used: Usage) -> dict[str, Any]:
    """Merge patch writing ``used`` and the summary only if ``obj`` is current; MIG profiles
    that dropped to zero are nulled so the merge patch removes them."""
    status = obj.get("status") or {}
    out = used_to_status(used)
    raw_used = status.get("used")
    for k in _keys(raw_used.get("migInstances") if isinstance(raw_used, Mapping) else None):
        if k not in used.mig:
            out["migInstances"][k] = None
    try:
        limits = limits_of(obj.get("spec") or {})
    except FieldError:
        limits = Limits()
    meta = obj.get("metadata") or {}
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"used": out, "summary": summary(limits, used)}}
