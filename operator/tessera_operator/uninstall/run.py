"""The uninstall hook: stop tessera's writers, then remove what they made at run time.

Order matters: the webhook configurations go first (a ``failurePolicy: Fail`` pod webhook
without its server would block every GPU pod create), then the operator Deployment and the
node daemon DaemonSet (waiting until their pods are gone, so that nobody writes the Lease,
the Secret or a Node label again), then the leader Lease, the serving Secret (with
cert-manager: its Certificates first, then their Secrets), tessera's finalizer on every
managed ResourceQuota (the GPUQuotas' counts stay; deleting them no longer waits for tessera)
and the tessera labels and annotations on every Node. GPUs are not touched: a MIG layout stays as
it is unless a GPUPartition with ``deletionPolicy: Reset`` was deleted before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from tessera.api.names import FINALIZER_MANAGED_QUOTA, LABEL_GPUQUOTA
from tessera.kube.client import ApiError, Kube, path
from tessera_operator.uninstall.plan import node_patch
from tessera_operator.webhooks.config import MUTATING_NAME, VALIDATING_NAME

log = logging.getLogger("tessera_operator.uninstall")
ADMISSION = "admissionregistration.k8s.io"
CERT_MANAGER = "cert-manager.io"


@dataclass(frozen=True)
class Targets:
    namespace: str
    deployment: str
    daemonset: str
    lease: str
    secrets: tuple[str, ...]
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
    done = {"webhookConfigurations": 0, "workloads": 0, "runtimeObjects": 0,
            "resourceQuotas": 0, "nodes": 0}
    for plural, name in (("mutatingwebhookconfigurations", MUTATING_NAME),
                         ("validatingwebhookconfigurations", VALIDATING_NAME)):
        done["webhookConfigurations"] += await _delete(kube, path(ADMISSION, "v1", plural,
                                                                  name=name))
    workloads = [path("apps", "v1", "deployments", t.namespace, t.deployment),
                 path("apps", "v1", "daemonsets", t.namespace, t.daemonset)]
    for url in workloads:
        if await _delete_foreground(kube, url):
            done["workloads"] += 1
    for url in workloads:
        await _wait_gone(kube, url, timeout_s)  # foreground: gone once its pods are
    for name in t.certificates:
        done["runtimeObjects"] += await _delete(kube, path(
            CERT_MANAGER, "v1", "certificates", t.namespace, name))
    for url in (path("coordination.k8s.io", "v1", "leases", t.namespace, t.lease),
                *(path("", "v1", "secrets", t.namespace, s) for s in t.secrets)):
        done["runtimeObjects"] += await _delete(kube, url)
    done["resourceQuotas"] = await _release_managed_quotas(kube)
    for node in (await kube.list(path("", "v1", "nodes"))).get("items", []):
        name = node["metadata"]["name"]
        for _ in range(5):
            patch = node_patch(node)
            if patch is None:
                break
            try:
                await kube.merge_patch(path("", "v1", "nodes", name=name), patch)
                done["nodes"] += 1
                break
            except ApiError as exc:
                if exc.status == 404:
                    break
                if exc.status != 409:
                    raise
                node = await kube.get(path("", "v1", "nodes", name=name))
    return done


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
    """tessera's finalizer off every managed ResourceQuota (a JSON merge patch of the others,
    at the version read; read again after a conflict)."""
    released = 0
    listed = await kube.list(path("", "v1", "resourcequotas"), LABEL_GPUQUOTA)
    for rq in listed.get("items", []):
        url = path("", "v1", "resourcequotas", rq["metadata"]["namespace"],
                   rq["metadata"]["name"])
        for _ in range(5):
            meta = rq["metadata"]
            finalizers = list(meta.get("finalizers") or [])
            if FINALIZER_MANAGED_QUOTA not in finalizers:
                break
            try:
                await kube.merge_patch(url, {"metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "finalizers": [f for f in finalizers if f != FINALIZER_MANAGED_QUOTA]}})
                released += 1
                break
            except ApiError as exc:
                if exc.status == 404:
                    break
                if exc.status != 409:
                    raise
                rq = await kube.get(url)
    return released
