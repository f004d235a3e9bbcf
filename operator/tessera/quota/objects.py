"""GPUQuota objects (raw API dicts) to and from the arithmetic's values.

Tolerant on read (a status someone edited by hand must not stop admission: unreadable
values count as absent, and recount heals them) and exact on write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from tessera.quota.arith import Limits, QuotaPolicy, QuotaView, Usage
from tessera.quota.units import count, memory_mib, mib_quantity


def _opt(value: Any, conv: Any) -> int | None:
    if value is None:
        return None
    try:
        out: int = conv(value)
        return out
    except (ValueError, TypeError):
        return None


def _mig(raw: Any) -> dict[str, int]:
    if not isinstance(raw, Mapping):
        return {}
    out = {}
    for k, v in raw.items():
        n = _opt(v, count)
        if n is not None:
            out[str(k)] = n
    return out


def limits_of(spec: Mapping[str, Any]) -> Limits:
    hard = spec.get("hard") or {}
    return Limits(_opt(hard.get("memory"), memory_mib), _opt(hard.get("cores"), count),
                  _opt(hard.get("pods"), count), _mig(hard.get("migInstances")))


def used_of(status: Mapping[str, Any] | None) -> Usage | None:
    """``status.used``; None when the quota was never counted (no reservation ever made)."""
    used = (status or {}).get("used")
    if not isinstance(used, Mapping):
        return None
    return Usage(_opt(used.get("memory"), memory_mib) or 0, _opt(used.get("cores"), count) or 0,
                 _opt(used.get("pods"), count) or 0, _mig(used.get("migInstances")))


def view_of(obj: Mapping[str, Any]) -> QuotaView:
    meta = obj.get("metadata") or {}
    return QuotaView(str(meta.get("name")), limits_of(obj.get("spec") or {}),
                     used_of(obj.get("status")) or Usage(), str(meta.get("resourceVersion", "")))


def carries_policy(spec: Mapping[str, Any]) -> bool:
    return any(spec.get(k) is not None for k in ("default", "max", "weight"))


def policy_of(quotas: Iterable[Mapping[str, Any]]) -> QuotaPolicy:
    """The namespace's per-pod policy: from the (one) quota carrying default/max/weight."""
    carriers = sorted((q for q in quotas if carries_policy(q.get("spec") or {})),
                      key=lambda q: str((q.get("metadata") or {}).get("name")))
    if not carriers:
        return QuotaPolicy()
    q = carriers[0]
    spec = q.get("spec") or {}
    d, m = spec.get("default") or {}, spec.get("max") or {}
    return QuotaPolicy(
        quota=str((q.get("metadata") or {}).get("name")),
        default_memory_mib=_opt(d.get("memory"), memory_mib),
        default_cores=_opt(d.get("cores"), count),
        max_memory_mib=_opt(m.get("memory"), memory_mib), max_cores=_opt(m.get("cores"), count),
        weight=int(spec.get("weight") or 1))


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


def used_patch(obj: Mapping[str, Any], new: Usage) -> dict[str, Any]:
    """Merge patch writing ``used`` (and its summary) only if ``obj`` is still current.

    Profiles that dropped to zero are nulled so the merge patch removes them.
    """
    old = used_of(obj.get("status")) or Usage()
    used = used_to_status(new)
    for k in old.mig:
        if k not in new.mig:
            used["migInstances"][k] = None
    meta = obj.get("metadata") or {}
    return {"metadata": {"resourceVersion": meta.get("resourceVersion")},
            "status": {"used": used, "summary": summary(limits_of(obj.get("spec") or {}), new)}}
