"""Growth holders: how a live resize's growth is counted by the API server, without any I/O.

A pod's ``limits`` cannot change after it is created, so the ResourceQuota each GPUQuota
manages (the API server's race-free count) counts what a pod was admitted with.  When a
live resize takes a pod's budget beyond its limits, tessera creates a **growth holder**: a
pod in the same namespace that asks for exactly that growth (``tessera.dev/vgpu-memory``,
``tessera.dev/vgpu-cores``) and carries a scheduling gate, so it is never scheduled and
never runs.  The API server's quota admission evaluates the holder like any other pod, in
the same count and the same conditional write as every create: a growth is admitted only
into room that is really there, and nothing is written to the ResourceQuota's ``spec`` (a
``spec.hard`` change makes kube-controller-manager recount from its cache, which can miss
pods admitted a moment before: the undercount that let creates pass ``hard`` while
resizes grew).

Per pod, the holders together must hold what it *needs*:

* the growth of its live budget beyond its limits, resource by resource;
* while a resize is Approved and not yet decided by the node: the larger of the growth
  before and after it (a node's refusal restores the previous budget without asking the
  quota again).

:func:`settle` says how to get from the holders a pod has to exactly what it needs: create
first, delete after, so that the count never drops below the need in between.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tessera.api.names import (
    GPU_POD,
    GROWTH_HOLDER_PREFIX,
    LABEL_CLAIM_OF,
    LABEL_GROWTH_OF,
    SCHEDULING_GATE_GROWTH,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera.api.resources import mig_resource_name, profile_from_resource
from tessera_operator.quota.arith import Usage
from tessera_operator.quota.units import count

CONTAINER = "growth"


@dataclass(frozen=True)
class Holder:
    name: str
    holds: Usage
    """Memory (MiB) and cores only."""


def grown(live: Usage, limits: Usage) -> Usage:
    """How far a live budget is beyond what the pod's limits say (resource by resource)."""
    return Usage(max(0, live.memory_mib - limits.memory_mib), max(0, live.cores - limits.cores))


def need(live: Usage, limits: Usage, previous: Usage | None = None) -> Usage:
    """What a pod's holders must hold: its growth, and while a resize waits for the node
    (``previous``: the budget before it) the larger of the growth before and after."""
    out = grown(live, limits)
    if previous is not None:
        before = grown(previous, limits)
        out = Usage(max(out.memory_mib, before.memory_mib), max(out.cores, before.cores))
    return out


def total(holders: Iterable[Holder]) -> Usage:
    out = Usage()
    for h in holders:
        out = out + h.holds
    return out


def covers(have: Usage, want: Usage) -> bool:
    return have.memory_mib >= want.memory_mib and have.cores >= want.cores


def missing(have: Usage, want: Usage) -> Usage:
    """What ``have`` lacks of ``want`` (zero where it has enough)."""
    return Usage(max(0, want.memory_mib - have.memory_mib), max(0, want.cores - have.cores))


def is_zero(u: Usage) -> bool:
    return u.memory_mib == 0 and u.cores == 0


@dataclass(frozen=True)
class Settle:
    """Steps from a pod's holders to its need: first ``create`` (a holder of that size, if
    not zero), then ``delete`` -- only once the create is admitted.  When the API server
    refuses the create, ``fallback`` is what can still be deleted (what leaves at least
    the need held)."""

    create: Usage
    delete: tuple[str, ...]
    fallback: tuple[str, ...] = ()

    @property
    def nothing(self) -> bool:
        return is_zero(self.create) and not self.delete


def settle(holders: Sequence[Holder], want: Usage) -> Settle:
    """From ``holders`` to exactly ``want``.

    Short: the missing part is created (nothing deleted; a holder holding nothing waits for
    the next settle).  Over: the largest holders that
    fit together within ``want`` are kept, the remainder is created and the others go;
    if that create is refused, ``fallback`` deletes what it can while keeping ``want``.
    """
    empty = tuple(sorted(h.name for h in holders if is_zero(h.holds)))
    holders = [h for h in holders if not is_zero(h.holds)]
    have = total(holders)
    short = missing(have, want)
    if not is_zero(short):
        return Settle(short, ())
    if have == Usage(want.memory_mib, want.cores):
        return Settle(Usage(), empty, empty)
    keep: list[Holder] = []
    kept = Usage()
    for h in sorted(holders, key=lambda h: (-h.holds.memory_mib, -h.holds.cores, h.name)):
        if covers(want, kept + h.holds):
            keep.append(h)
            kept = kept + h.holds
    remainder = missing(kept, want)
    kept_names = {h.name for h in keep}
    drop = tuple(sorted(h.name for h in holders if h.name not in kept_names))
    left = have
    fallback = []
    for h in sorted(holders, key=lambda h: (h.holds.memory_mib, h.holds.cores, h.name)):
        if covers(left - h.holds, want) and covers(left, h.holds):
            fallback.append(h.name)
            left = left - h.holds
    return Settle(remainder, tuple(sorted((*drop, *empty))),
                  tuple(sorted((*fallback, *empty))))


# -- the holder pod ----------------------------------------------------------------------------


def holder_name(owner_uid: str, tag: str) -> str:
    """A holder's name: the same for the same pod and purpose, so a create repeated after a
    lost answer finds the holder it made (``AlreadyExists``) instead of making a second."""
    digest = hashlib.sha256(f"{owner_uid}/{tag}".encode()).hexdigest()[:20]
    return GROWTH_HOLDER_PREFIX + digest


def is_holder(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    name = str(meta.get("name") or meta.get("generateName") or "")
    return name.startswith(GROWTH_HOLDER_PREFIX) or LABEL_GROWTH_OF in (meta.get("labels") or {})


def holds(pod: Mapping[str, Any]) -> Usage:
    """What a holder pod holds: its requests (an unreadable value counts as nothing held).
    A growth holder holds memory and cores; a claim holder also one GPU pod and the MIG
    instances its claim takes."""
    out = Usage()
    for c in (pod.get("spec") or {}).get("containers") or []:
        res = c.get("resources") or {}
        asked = {**(res.get("limits") or {}), **(res.get("requests") or {})}
        try:
            mig = {p: count(v) for k, v in asked.items()
                   if (p := profile_from_resource(str(k))) is not None}
            out = out + Usage(count(asked.get(VGPU_MEMORY, 0)), count(asked.get(VGPU_CORES, 0)),
                              count(asked.get(GPU_POD, 0)), mig)
        except (ValueError, TypeError):
            continue
    return out


def owner_of(pod: Mapping[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_GROWTH_OF) or "")


def claim_holder_pod(namespace: str, claim_uid: str, amount: Usage, image: str
                     ) -> dict[str, Any]:
    """A *claim holder*: a growth holder of what a DRA claim takes (``amount``: its
    capacity, one GPU pod, its MIG instances, as
    :func:`tessera_operator.quota.claims.claim_ask` counts them), named after the claim's
    UID (a repeated create finds it), labelled with it twice (``growth-of``: every holder
    protection covers it; ``claim-of``: the growth settle leaves it alone).  It has no owner
    reference: it is made while the claim is being admitted, before the claim exists, and
    the garbage collector would delete a dependent whose owner it cannot find yet; the
    leader deletes it once its claim is gone (:mod:`tessera_operator.controller.claims`)."""
    body = holder_pod(namespace, "", claim_uid, amount, holder_name(claim_uid, "claim"), image)
    body["metadata"]["labels"][LABEL_CLAIM_OF] = claim_uid
    del body["metadata"]["ownerReferences"]
    return body


def claim_of(pod: Mapping[str, Any]) -> str:
    """The UID of the claim a claim holder holds for ("" for a pod's growth holder)."""
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(LABEL_CLAIM_OF) or "")


def holder_pod(namespace: str, owner_name: str, owner_uid: str, amount: Usage, name: str,
               image: str) -> dict[str, Any]:
    """The holder: never scheduled (a scheduling gate only tessera removes, and it never
    does), nothing to mount, within the ``restricted`` Pod Security Standard, deleted with
    the pod it holds for (owner reference)."""
    limits = {}
    if amount.memory_mib:
        limits[VGPU_MEMORY] = str(amount.memory_mib)
    if amount.cores:
        limits[VGPU_CORES] = str(amount.cores)
    if amount.pods:  # a claim holder: its claim is a GPU pod (hard.pods)
        limits[GPU_POD] = str(amount.pods)
    for profile, n in sorted(amount.mig.items()):  # a claim holder's MIG instances
        if n:
            limits[mig_resource_name(profile)] = str(n)
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {LABEL_GROWTH_OF: owner_uid, "app.kubernetes.io/managed-by": "tessera"},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": owner_name,
                                 "uid": owner_uid, "blockOwnerDeletion": False}],
        },
        "spec": {
            "schedulingGates": [{"name": SCHEDULING_GATE_GROWTH}],
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "terminationGracePeriodSeconds": 0,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65534,
                                "runAsGroup": 65534,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": CONTAINER, "image": image,
                "resources": {"limits": limits, "requests": dict(limits)},
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
        },
    }


CLAIM_HOLDER_GRACE_S = 10.0
"""How long a claim holder whose claim is not seen is kept: it is made while its claim is
admitted, a moment before the claim is stored (and before a list shows it)."""


def orphaned_claim_holders(holders: Iterable[Mapping[str, Any]], claim_uids: set[str],
                           now: datetime, grace_s: float = CLAIM_HOLDER_GRACE_S) -> list[str]:
    """The names of the claim holders to delete: their claim is not among ``claim_uids``
    (the namespace's claims now) and they are older than ``grace_s`` (a claim whose
    admission failed after its holder was made is never stored).  A holder whose age
    cannot be read is kept (the next pass decides)."""
    out = []
    for h in holders:
        meta = h.get("metadata") or {}
        if claim_of(h) in claim_uids or meta.get("deletionTimestamp"):
            continue
        try:
            made = datetime.fromisoformat(str(meta.get("creationTimestamp")).replace(
                "Z", "+00:00"))
        except ValueError:
            continue
        if (now - made).total_seconds() >= grace_s:
            out.append(str(meta.get("name")))
    return sorted(out)

