"""The uninstall hook: stop tessera's writers, then remove what they made at run time.

Order matters: the webhook configurations go first (a ``failurePolicy: Fail`` pod webhook
without its server would block every GPU pod create), then the operator Deployment and the
node daemon DaemonSets and, with placement on, the tessera-scheduler Deployment (waiting
until their pods are gone, so that nobody writes a Lease, the Secret or a Node label again),
then the leader Leases, the serving Secret (with
cert-manager: its Certificates first, then their Secrets), tessera's finalizer on every
managed ResourceQuota (the GPUQuotas' counts stay; deleting them no longer waits for tessera)
and the tessera labels and annotations on every Node. GPUs are not touched: a MIG layout stays as
it is unless a GPUPartition with ``deletionPolicy: Reset`` was deleted before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tessera.api.names import DRA_DRIVER, LABEL_GPUQUOTA
from tessera.kube.client import ApiError, Kube, Obj, path
from tessera_operator.quota.managed import finalizer_off
from tessera_operator.uninstall.plan import node_patch
from tessera_operator.webhooks.config import MUTATING_NAME, VALIDATING_NAME

log = logging.getLogger("tessera_operator.uninstall")
ADMISSION = "admissionregistration.k8s.io"
CERT_MANAGER = "cert-manager.io"


@dataclass(frozen=True)
class Targets:
    namespace: str
    deployments: tuple[str, ...]
    """The operator Deployment and, with placement on, ``tessera-scheduler``."""
    daemonsets: tuple[str, ...]
    """The node daemon's DaemonSets: ``tessera-node`` and, with DRA pools, ``tessera-node-dra``."""
    leases: tuple[str, ...]
    """Their leader Leases (``tessera-operator``; ``tessera-scheduler``), deleted once they
    are stopped: a running one would write its Lease again."""
    secrets: tuple[str, ...]
    resource_slices: bool = False
    """Delete the ResourceSlices of tessera's DRA driver (installs with DRA pools)."""
    certificates: tuple[str, ...] = ()
    """cert-manager Certificates, deleted before the Secrets (else cert-manager issues a
    deleted Secret again, and the Secret outlives the release)."""


async def _delete(kube: Kube, url: str) -> bool:
    """DELETE; False when it was not there."""
    try:
        await kube.delete(url)
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


async def _wait_gone(kube: Kube, url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await kube.get(url)
        except ApiError as exc:
            if exc.status == 404:
                return
            raise
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} still exists after {timeout_s:.0f}s")
        await asyncio.sleep(0.5)


async def uninstall(kube: Kube, t: Targets, timeout_s: float = 120.0) -> dict[str, int]:
    """Returns counts of what was removed (for the hook's log)."""
    done = {"webhookConfigurations": 0, "workloads": 0, "resourceSlices": 0,
            "runtimeObjects": 0, "resourceQuotas": 0, "nodes": 0}
    for plural, name in (("mutatingwebhookconfigurations", MUTATING_NAME),
                         ("validatingwebhookconfigurations", VALIDATING_NAME)):
        done["webhookConfigurations"] += await _delete(kube, path(ADMISSION, "v1", plural,
                                                                  name=name))
    done["workloads"] = await stop_workloads(kube, t, timeout_s)
    if t.resource_slices:
        done["resourceSlices"] = await delete_resource_slices(kube)
    for name in t.certificates:
        done["runtimeObjects"] += await _delete(kube, path(
            CERT_MANAGER, "v1", "certificates", t.namespace, name))
    for url in (*(path("coordination.k8s.io", "v1", "leases", t.namespace, lease)
                  for lease in t.leases),
                *(path("", "v1", "secrets", t.namespace, s) for s in t.secrets)):
        done["runtimeObjects"] += await _delete(kube, url)
    done["resourceQuotas"] = await _release_managed_quotas(kube)
    for node in (await kube.list(path("", "v1", "nodes"))).get("items", []):
        done["nodes"] += await _patch_settled(
            kube, path("", "v1", "nodes", name=node["metadata"]["name"]), node, node_patch)
    return done


async def stop_workloads(kube: Kube, t: Targets, timeout_s: float) -> int:
    """Delete the Deployments (the operator, the scheduler) and the node daemon DaemonSets
    (foreground), and wait until they and their pods are gone; how many there were."""
    workloads = [*(path("apps", "v1", "deployments", t.namespace, d) for d in t.deployments),
                 *(path("apps", "v1", "daemonsets", t.namespace, d) for d in t.daemonsets)]
    stopped = 0
    for url in workloads:
        stopped += await _delete_foreground(kube, url)
    for url in workloads:
        await _wait_gone(kube, url, timeout_s)  # foreground: gone once its pods are
    return stopped


async def delete_resource_slices(kube: Kube) -> int:
    """The ResourceSlices of tessera's DRA driver (the DRA daemons published them; with the
    daemons gone nobody would, and the scheduler would go on allocating their devices to
    claims no node prepares). Every node's, in one call; how many there were."""
    url = path("resource.k8s.io", "v1", "resourceslices")
    try:
        gone = await kube.request("DELETE", url, params={"fieldSelector":
                                                          f"spec.driver={DRA_DRIVER}"})
    except ApiError as exc:
        if exc.status == 404:  # an API server without resource.k8s.io/v1
            return 0
        raise
    return len(gone.get("items") or [])


async def _delete_foreground(kube: Kube, url: str) -> bool:
    try:
        await kube.request("DELETE", url, {"apiVersion": "v1", "kind": "DeleteOptions",
                                           "propagationPolicy": "Foreground"})
        return True
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise


async def _release_managed_quotas(kube: Kube) -> int:
    """tessera's finalizer off every managed ResourceQuota."""
    released = 0
    listed = await kube.list(path("", "v1", "resourcequotas"), LABEL_GPUQUOTA)
    for rq in listed.get("items", []):
        meta = rq["metadata"]
        released += await _patch_settled(
            kube, path("", "v1", "resourcequotas", meta["namespace"], meta["name"]), rq,
            finalizer_off)
    return released


async def _patch_settled(kube: Kube, url: str, obj: Obj,
                         make: Callable[[Obj], dict[str, Any] | None]) -> bool:
    """Apply ``make``'s JSON merge patch (its resourceVersion a precondition), reading the
    object again after a conflict; False when nothing was left to change or it is gone."""
    for _ in range(5):
        patch = make(obj)
        if patch is None:
            return False
        try:
            await kube.merge_patch(url, patch)
            return True
        except ApiError as exc:
            if exc.status == 404:
                return False
            if exc.status != 409:
                raise
            obj = await kube.get(url)
    return False
