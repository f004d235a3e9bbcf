"""The ResourceQuota each GPUQuota manages: what it must say, and whether it can be trusted
to count, without any I/O.

Kubernetes' ResourceQuota admission counts a pod's ``requests`` race-free inside the API
server (one conditional write of the quota's ``status.used`` per admitted pod, and a
refusal when it would pass ``status.hard``).  So each GPUQuota ``q`` manages a ResourceQuota
``gpuquota-<q>`` in its namespace whose ``hard`` holds q's limits on the extended resources
the admitted pods carry in their limits (tessera's mutating webhook writes every budget into
them, and one ``tessera.dev/pod`` per GPU pod):

    GPUQuota spec.hard.memory          requests.tessera.dev/vgpu-memory  (MiB)
    GPUQuota spec.hard.cores           requests.tessera.dev/vgpu-cores
    GPUQuota spec.hard.pods            requests.tessera.dev/pod
    GPUQuota spec.hard.migInstances.P  requests.tessera.dev/mig-P

A live resize's growth beyond a pod's limits is held by growth holders, pods the API
server counts like any other (:mod:`tessera_operator.quota.holders`): ``hard`` is the GPUQuota's,
always, so the operator writes ``spec`` only when the GPUQuota's ``hard`` changes or
someone else changed it.

A GPUQuota whose spec cannot be read admits nothing: its ResourceQuota's hard is zero.

:func:`enforcement` says whether a ResourceQuota (as a watch has it) counts for its
GPUQuota; when it does not, the GPUQuota admits no GPU pod and says why.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from tessera.api.names import (
    ANNOTATION_GPUQUOTA_NAME,
    API_VERSION,
    FINALIZER_MANAGED_QUOTA,
    GPU_POD,
    LABEL_GPUQUOTA,
    MANAGED_QUOTA_PREFIX,
    PREFIX,
    QUOTA_REQUESTS_PREFIX,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.api.resources import mig_resource_name
from tessera_operator.quota.arith import Limits
from tessera_operator.quota.units import count

MAX_NAME = 253
MAX_LABEL = 63
MEMORY = QUOTA_REQUESTS_PREFIX + VGPU_MEMORY
CORES = QUOTA_REQUESTS_PREFIX + VGPU_CORES
PODS = QUOTA_REQUESTS_PREFIX + GPU_POD


def _cut(text: str, limit: int) -> str:
    """``text``, or past ``limit`` characters a cut of it ending in a digest of the whole
    (still unique, still a valid name and label value: it ends in a letter or digit)."""
    if len(text) <= limit:
        return text
    tag = hashlib.sha256(text.encode()).hexdigest()[:10]
    return f"{text[:limit - 11]}-{tag}"


def managed_name(quota: str) -> str:
    """The managed ResourceQuota's name (a GPUQuota name is at most 253 characters; the
    prefix could push it over)."""
    return _cut(MANAGED_QUOTA_PREFIX + quota, MAX_NAME)


def label_value(quota: str) -> str:
    """The ``tessera.dev/gpuquota`` label's value (label values stop at 63 characters)."""
    return _cut(quota, MAX_LABEL)


def mig_key(profile: str) -> str:
    return QUOTA_REQUESTS_PREFIX + mig_resource_name(profile)


def hard_of(limits: Limits | None) -> dict[str, str]:
    """The ResourceQuota's ``hard``: the GPUQuota's limits; ``None`` (a spec that cannot be
    read) admits nothing."""
    if limits is None:
        return {MEMORY: "0", CORES: "0", PODS: "0"}
    out: dict[str, str] = {}
    if limits.memory_mib is not None:
        out[MEMORY] = str(limits.memory_mib)
    if limits.cores is not None:
        out[CORES] = str(limits.cores)
    if limits.pods is not None:
        out[PODS] = str(limits.pods)
    for profile, n in sorted(limits.mig.items()):
        out[mig_key(profile)] = str(n)
    return out


def desired(quota: Mapping[str, Any], limits: Limits | None) -> dict[str, Any]:
    """The whole managed ResourceQuota a GPUQuota wants (owned by it, so deleted with it)."""
    meta = quota.get("metadata") or {}
    name = str(meta.get("name"))
    return {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {
            "name": managed_name(name), "namespace": meta.get("namespace"),
            "labels": {LABEL_GPUQUOTA: label_value(name),
                       "app.kubernetes.io/managed-by": "tessera"},
            "annotations": {ANNOTATION_GPUQUOTA_NAME: name},
            "finalizers": [FINALIZER_MANAGED_QUOTA],
            "ownerReferences": [{"apiVersion": API_VERSION, "kind": "GPUQuota", "name": name,
                                 "uid": meta.get("uid"), "controller": True,
                                 "blockOwnerDeletion": False}],
        },
        "spec": {"hard": hard_of(limits)},
    }


def held(rq: Mapping[str, Any]) -> bool:
    """Whether tessera's finalizer holds ``rq``: deleted, it stays, and counts, until tessera
    lets it go (its GPUQuota gone)."""
    return FINALIZER_MANAGED_QUOTA in ((rq.get("metadata") or {}).get("finalizers") or [])


def finalizer_off(rq: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that takes tessera's finalizer off ``rq`` (the others stay, at the
    version read), or None when it carries none."""
    meta = rq.get("metadata") or {}
    if not held(rq):
        return None
    return {"metadata": {"resourceVersion": meta.get("resourceVersion"), "finalizers": [
        f for f in meta.get("finalizers") or [] if f != FINALIZER_MANAGED_QUOTA]}}


def release(rq: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that lets a deleted managed ResourceQuota go (its GPUQuota is gone),
    or None when it is not being deleted or tessera holds nothing there."""
    return finalizer_off(rq) if (rq.get("metadata") or {}).get("deletionTimestamp") else None


def quota_of(rq: Mapping[str, Any]) -> str | None:
    """The name of the GPUQuota a managed ResourceQuota is for (its annotation)."""
    name = ((rq.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_GPUQUOTA_NAME)
    return str(name) if name else None


def owned_by(rq: Mapping[str, Any], quota_uid: str) -> bool:
    """Whether ``rq`` names the GPUQuota with this UID as its controller."""
    return any(o.get("uid") == quota_uid and o.get("controller") is True
               and o.get("kind") == "GPUQuota"
               for o in (rq.get("metadata") or {}).get("ownerReferences") or [])


def drift(have: Mapping[str, Any], want: Mapping[str, Any]) -> dict[str, Any] | None:
    """The merge patch that sets a managed ResourceQuota back to what it must say (its
    hard, scopes, label, tessera's annotations and owner), or None when it already does."""
    hm, wm = have.get("metadata") or {}, want["metadata"]
    patch: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    labels = hm.get("labels") or {}
    if any(labels.get(k) != v for k, v in wm["labels"].items()):
        meta["labels"] = wm["labels"]
    have_ann = {k: v for k, v in (hm.get("annotations") or {}).items() if k.startswith(PREFIX)}
    if have_ann != wm["annotations"]:  # an earlier version's keys go too
        meta["annotations"] = {**{k: None for k in have_ann}, **wm["annotations"]}
    if [(o.get("uid"), o.get("controller")) for o in hm.get("ownerReferences") or []] != [
            (o["uid"], True) for o in wm["ownerReferences"]]:
        meta["ownerReferences"] = wm["ownerReferences"]
    finalizers = list(hm.get("finalizers") or [])
    if FINALIZER_MANAGED_QUOTA not in finalizers and not hm.get("deletionTimestamp"):
        meta["finalizers"] = [*finalizers, FINALIZER_MANAGED_QUOTA]  # one made before it
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


# -- can it be trusted to count? ---------------------------------------------------------------

MISSING = "ManagedQuotaMissing"
FOREIGN = "ManagedQuotaForeign"
DRIFTED = "ManagedQuotaDrifted"
UNWRITABLE = "ManagedQuotaUnwritable"
REASONS = (MISSING, FOREIGN, DRIFTED, UNWRITABLE)


def _too_loose(hard: Any, want: Mapping[str, str]) -> list[str]:
    """Resources ``hard`` does not limit at least as tightly as ``want``."""
    if not isinstance(hard, Mapping):
        return sorted(want)
    out = []
    for k, v in sorted(want.items()):
        try:
            if k not in hard or count(hard[k]) > count(v):
                out.append(k)
        except (ValueError, TypeError):
            out.append(k)
    return out


def enforcement(quota: Mapping[str, Any], limits: Limits | None,
                rq: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """Why the API server does not count GPU pods for this GPUQuota as it must (a reason
    and a sentence), or None when it does.

    ``rq``: the ResourceQuota by the managed name, carrying tessera's label, as a watch sees
    it (None: none).  It counts for the GPUQuota when it is the GPUQuota's own (owner
    reference by UID: tessera adopts nothing it did not create) and every limit it holds,
    in ``spec`` and, once the quota controller has synced it, ``status``, is at most the
    GPUQuota's.  Tighter is fine (it is on its way to the GPUQuota's after a raise); looser
    or missing is not.  A ResourceQuota the quota controller has not synced yet refuses
    every GPU pod by itself (``status unknown``), so it counts."""
    meta = quota.get("metadata") or {}
    name = managed_name(str(meta.get("name")))
    if rq is None:
        return MISSING, (f"its ResourceQuota {name} does not exist (tessera creates it "
                         f"again; if this lasts, see the GPUQuota's conditions)")
    rq_meta = rq.get("metadata") or {}
    if not owned_by(rq, str(meta.get("uid") or "")) or (rq_meta.get("labels") or {}).get(
            LABEL_GPUQUOTA) != label_value(str(meta.get("name"))):
        return FOREIGN, (f"ResourceQuota {name} is not this GPUQuota's (tessera adopts nothing "
                         f"it did not create): delete or rename it, and tessera creates its own")
    if rq_meta.get("deletionTimestamp") and not held(rq):
        return MISSING, f"its ResourceQuota {name} is being deleted (tessera creates it again)"
    want = hard_of(limits)
    loose = _too_loose((rq.get("spec") or {}).get("hard"), want)
    status_hard = (rq.get("status") or {}).get("hard")
    if status_hard is not None:
        loose = sorted({*loose, *_too_loose(status_hard, want)})
    if loose:
        return DRIFTED, (f"ResourceQuota {name} does not hold the GPUQuota's limits "
                         f"({', '.join(loose)}); tessera sets them back")
    return None
