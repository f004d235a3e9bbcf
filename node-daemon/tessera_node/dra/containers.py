"""The claims prepared on this node as the rest of the daemon sees containers (pure): one
:class:`~tessera_node.deviceplugin.registry.SetUpContainer` per prepared claim, so that the
core controllers hold a claim's processes to its ``cores`` and the audit attributes its
processes, checks its files and counts its memory, as for a container the device plugin set
up.

A claim is one budget: one budget file and one ledger, mounted into every container that
uses it (a shared claim's pods, several containers of one pod). So it is *one* entry, with
the pods that use it:

* **who uses it** comes from the pods bound to this node (the kubelet asks to prepare a claim
  once, not once per pod): a pod names a claim in ``spec.resourceClaims`` directly
  (``resourceClaimName``) or through a template, whose generated claim's name the pod's
  ``status.resourceClaimStatuses`` records; its containers use the pod's claim entries they
  list in ``resources.claims``. The first pod still running (by name) is the entry's pod
  (its Events, its metrics' ``pod`` label); the others' processes are the claim's too;
* **its policy** (GPUQuota, fair-share weight, lending) is read once, when it is prepared,
  from its namespace's GPUQuota, as a pod's is read once, at admission;
* it is **core-controlled** (``resource`` ``tessera.dev/vgpu``) when a unit of it has a core
  budget; a claim of whole units without one is not (the unit is the claim's alone).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.api.budget import PerShareBudget
from tessera.api.names import DRA_DRIVER, VGPU
from tessera.api.quota import GPUQuotaSpec
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_node.dra.checkpoint import PreparedClaim
from tessera_node.dra.claims import ClaimError

ENDED = ("Succeeded", "Failed")

ClaimKey = tuple[str, str]
"""(namespace, claim name)."""


@dataclass(frozen=True)
class ClaimUser:
    """A pod of this node that uses a claim, and which of its containers do."""

    pod_uid: str
    pod: str
    containers: tuple[str, ...]
    running: bool
    """Not ended (Succeeded or Failed)."""


@dataclass(frozen=True)
class ClaimPolicy:
    """What a claim's namespace's GPUQuota says of its containers' core time."""

    quota: str | None = None
    """``namespace/name`` of the GPUQuota, if the namespace has one."""
    weight: int = 1
    lending: bool = True


def users_by_claim(pods: Iterable[Mapping[str, Any]]) -> dict[ClaimKey, list[ClaimUser]]:
    """Every claim the pods use, with its users: running pods first, then by name."""
    out: dict[ClaimKey, list[ClaimUser]] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        status = pod.get("status") or {}
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in status.get("resourceClaimStatuses") or []
                     if isinstance(s, Mapping)}
        containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        for entry in spec.get("resourceClaims") or []:
            if not isinstance(entry, Mapping):
                continue
            name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
            if not name:
                continue  # a template's claim not generated yet
            using = tuple(str(c.get("name")) for c in containers if isinstance(c, Mapping)
                          and any(isinstance(r, Mapping) and r.get("name") == entry.get("name")
                                  for r in ((c.get("resources") or {}).get("claims") or [])))
            out.setdefault((str(meta.get("namespace", "")), str(name)), []).append(ClaimUser(
                str(meta.get("uid", "")), str(meta.get("name", "")), using,
                status.get("phase") not in ENDED))
    for users in out.values():
        users.sort(key=lambda u: (not u.running, u.pod, u.pod_uid))
    return out


def claim_policy(namespace: str, quotas: Sequence[Mapping[str, Any]]) -> ClaimPolicy:
    """The policy from a namespace's GPUQuotas (their objects): weight and lending from the
    one that sets them (at most one may: admission checks it), the quota named is that one,
    else the namespace's first by name. A GPUQuota whose spec cannot be read fails the claim
    (its weight and lending are not guessed)."""
    named: list[tuple[str, GPUQuotaSpec]] = []
    for q in quotas:
        name = str((q.get("metadata") or {}).get("name", ""))
        try:
            named.append((name, GPUQuotaSpec.model_validate(q.get("spec") or {})))
        except ValueError as exc:
            first = str(exc).splitlines()[0]
            raise ClaimError(f"GPUQuota {namespace}/{name}: its spec cannot be read ({first}); "
                             "fix the GPUQuota, the kubelet tries again") from None
    if not named:
        return ClaimPolicy()
    named.sort(key=lambda ns: ns[0])
    for name, spec in named:
        if spec.weight is not None or spec.lending is not None:
            return ClaimPolicy(f"{namespace}/{name}", spec.weight or 1,
                               True if spec.lending is None else spec.lending)
    return ClaimPolicy(f"{namespace}/{named[0][0]}")


def claim_containers(claims: Iterable[PreparedClaim],
                     users: Mapping[ClaimKey, Sequence[ClaimUser]],
                     gpu_of: Mapping[str, str],
                     files: Callable[[str], tuple[str, str]]) -> list[SetUpContainer]:
    """One entry per prepared claim. ``gpu_of``: unit UUID -> its GPU's UUID (a unit not
    there is its own GPU); ``files``: claim UID -> (budget file, ledger directory)."""
    out = []
    for c in claims:
        who = list(users.get((c.namespace, c.name), ()))
        first = who[0] if who else None
        budget_file, ledger_dir = files(c.uid)
        cores = [u.cores for u in c.units if u.cores is not None]
        memory = [u.memory for u in c.units if u.memory is not None]
        budget = PerShareBudget(shares=len(c.units), memory_bytes=max(memory, default=0),
                                cores=min(cores, default=100))
        out.append(SetUpContainer(
            key=c.uid, pod_uid=first.pod_uid if first else "", namespace=c.namespace,
            pod=first.pod if first else "",
            container="+".join(first.containers) if first and first.containers else c.name,
            resource=VGPU if cores else DRA_DRIVER,
            units=tuple(u.uuid for u in c.units),
            gpus=tuple(gpu_of.get(u.uuid, u.uuid) for u in c.units),
            budget=budget, refused=None, budget_file=budget_file, ledger_dir=ledger_dir,
            quota=c.quota, weight=c.weight, lending=c.lending,
            claim=f"{c.namespace}/{c.name}",
            other_pod_uids=tuple(u.pod_uid for u in who[1:])))
    return out
