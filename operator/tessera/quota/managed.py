"""The ResourceQuota each GPUQuota manages: what it must say, without any I/O.

Kubernetes' ResourceQuota admission counts a pod's ``requests`` race-free inside the API
server (one conditional write of the quota's ``status.used`` per admitted pod, and a
refusal when it would pass ``status.hard``).  So each GPUQuota ``q`` manages a ResourceQuota
``gpuquota-<q>`` in its namespace whose ``hard`` holds q's limits on the extended resources
the admitted pods carry in their limits (tessera's mutating webhook writes every budget into
them: :func:`tessera.webhooks.admission.fill_patch`):

    GPUQuota spec.hard.memory          requests.tessera.dev/vgpu-memory  (MiB)
    GPUQuota spec.hard.cores           requests.tessera.dev/vgpu-cores
    GPUQuota spec.hard.migInstances.P  requests.tessera.dev/mig-P

``spec.hard.pods`` (GPU pods) has no ResourceQuota counterpart (a ResourceQuota counts every
pod of the namespace, GPU or not): tessera's webhook checks it against the GPUQuota's count,
which is not race-free (docs/operator.md, "Counting").

A live resize grows a pod's budget beyond its limits, which the ResourceQuota never sees:
``hard`` is lowered by every running pod's outstanding growth, recorded by pod UID on the
ResourceQuota itself (``tessera.dev/resize-growth``) in the same write that lowers it, so the
namespace's total (limits + growth) still stays under the GPUQuota's hard.

A GPUQuota whose spec cannot be read admits nothing: its ResourceQuota's hard is zero.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from tessera.api.names import (
    ANNOTATION_RESIZE_GROWTH,
    API_VERSION,
    LABEL_GPUQUOTA,
    MANAGED_QUOTA_PREFIX,
    QUOTA_REQUESTS_PREFIX,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.api.resources import mig_resource_name
from tessera.quota.arith import Limits, Usage
from tessera.quota.units import count

MAX_NAME = 253
MEMORY = QUOTA_REQUESTS_PREFIX + VGPU_MEMORY
CORES = QUOTA_REQUESTS_PREFIX + VGPU_CORES


def managed_name(quota: str) -> str:
    """The managed ResourceQuota's name (a GPUQuota name is at most 253 characters; the
    prefix could push it over: such a name is cut and ends in a digest to stay unique)."""
    name = MANAGED_QUOTA_PREFIX + quota
    if len(name) <= MAX_NAME:
        return name
    tag = hashlib.sha256(quota.encode()).hexdigest()[:10]
    return f"{name[:MAX_NAME - 11]}-{tag}"


def mig_key(profile: str) -> str:
    return QUOTA_REQUESTS_PREFIX + mig_resource_name(profile)


NO_GROWTH = Usage()


def hard_of(limits: Limits | None, growth: Usage = NO_GROWTH) -> dict[str, str]:
    """The ResourceQuota's ``hard``: the GPUQuota's limits less the outstanding growth
    (never below zero); ``None`` (a spec that cannot be read) admits nothing."""
    if limits is None:
        return {MEMORY: "0", CORES: "0"}
    out: dict[str, str] = {}
    if limits.memory_mib is not None:
        out[MEMORY] = str(max(0, limits.memory_mib - growth.memory_mib))
    if limits.cores is not None:
        out[CORES] = str(max(0, limits.cores - growth.cores))
    for profile, n in sorted(limits.mig.items()):
        out[mig_key(profile)] = str(n)
    return out


def growth_of(rq: Mapping[str, Any] | None) -> dict[str, Usage]:
    """The outstanding growth recorded on a managed ResourceQuota, by pod UID (an entry
    that cannot be read counts as no growth: the operator rewrites the record whole)."""
    raw = (((rq or {}).get("metadata") or {}).get("annotations") or {}).get(
        ANNOTATION_RESIZE_GROWTH)
    if not isinstance(raw, str):
        return {}
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return {}
    if not isinstance(parsed, dict):
        return {}
    out = {}
    for uid, g in parsed.items():
        if not isinstance(g, dict):
            continue
        try:
            u = Usage(count(g.get("memoryMiB", 0)), count(g.get("cores", 0)))
        except (ValueError, TypeError):
            continue
        out[str(uid)] = Usage(max(0, u.memory_mib), max(0, u.cores))
    return out


def growth_annotation(growth: Mapping[str, Usage]) -> str:
    """The record as written; a pod shrunk back keeps its zero entry while it runs (so a
    late pod event with the old budget cannot bring the growth back)."""
    return json.dumps({uid: {"memoryMiB": g.memory_mib, "cores": g.cores}
                       for uid, g in sorted(growth.items())}, separators=(",", ":"))


def total_growth(growth: Mapping[str, Usage]) -> Usage:
    out = Usage()
    for g in growth.values():
        out = out + Usage(g.memory_mib, g.cores)
    return out


def grown(live: Usage, limits: Usage) -> Usage:
    """How far a pod's live budget is beyond what its limits say (resource by resource)."""
    return Usage(max(0, live.memory_mib - limits.memory_mib), max(0, live.cores - limits.cores))


def desired(quota: Mapping[str, Any], limits: Limits | None,
            growth: Mapping[str, Usage]) -> dict[str, Any]:
    """The whole managed ResourceQuota a GPUQuota wants (owned by it, so deleted with it)."""
    meta = quota.get("metadata") or {}
    name = str(meta.get("name"))
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {
            "name": managed_name(name), "namespace": meta.get("namespace"),
            "labels": {LABEL_GPUQUOTA: name, "app.kubernetes.io/managed-by": "tessera"},
            "annotations": {ANNOTATION_RESIZE_GROWTH: growth_annotation(growth)},
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "GPUQuota", "name": name,
                                 "uid": meta.get("uid"), "controller": True,
                                 "blockOwnerDeletion": False}],
        },
        "spec": {"hard": hard_of(limits, total_growth(growth))},
    }


def drift(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that sets a managed ResourceQuota back to what it must say (its
    hard, scopes, label, growth record and owner), or None when it already does."""
    hm, wm = have.get("metadata") or {}, want["metadata"]
    patch: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    labels = hm.get("labels") or {}
    if any(labels.get(k) != v for k, v in wm["labels"].items()):
        meta["labels"] = wm["labels"]
    ann = (hm.get("annotations") or {}).get(ANNOTATION_RESIZE_GROWTH)
    if ann != wm["annotations"][ANNOTATION_RESIZE_GROWTH]:
        meta["annotations"] = wm["annotations"]
    if [(o.get("uid"), o.get("controller")) for o in hm.get("ownerReferences") or []] != [
            (o["uid"], True) for o in wm["ownerReferences"]]:
        meta["ownerReferences"] = wm["ownerReferences"]
    if meta:
        patch["metadata"] = meta
    spec = have.get("spec") or {}
    hard = spec.get("hard") or {}
    want_hard = want["spec"]["hard"]
    if not _same_hard(hard, want_hard) or spec.get("scopes") or spec.get("scopeSelector"):
        patch["spec"] = {"hard": {**{k: None for k in hard if k not in want_hard}, **want_hard},
                         "scopes": None, "scopeSelector": None}
    return patch or None


def _same_hard(have: Mapping[str, Any], want: Mapping[str, str]) -> bool:
    if set(have) != set(want):
        return False
    try:
        return all(count(have[k]) == count(v) for k, v in want.items())
    except (ValueError, TypeError):
        return False


def lowered_fits(rq: Mapping[str, Any], want_hard: Mapping[str, str]) -> list[str]:
    """What a managed ResourceQuota already has in use beyond a lowered ``hard`` (empty:
    the lower hard can be written: nothing admitted so far passes it)."""
    used = (rq.get("status") or {}).get("used") or {}
    out = []
    for k, v in sorted(want_hard.items()):
        try:
            u = count(used.get(k, 0))
        except (ValueError, TypeError):
            out.append(f"{k} used cannot be read")
            continue
        if u > count(v):
            out.append(f"{k} used {u}, hard would be {v}")
    return out
