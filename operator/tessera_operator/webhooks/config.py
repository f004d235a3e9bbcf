"""The Mutating/ValidatingWebhookConfiguration objects the leader keeps applied.

Pods go through one mutating webhook, which fills in and writes the budget and checks it
against the GPUQuotas (no side effects: the count is the API server's, against the
ResourceQuota each GPUQuota manages).  It is reinvoked when a later mutating webhook changes
the pod, so the budget it wrote always matches the pod as stored.  It is scoped so that
pods asking for no tessera resource never reach it (they are still created while the
operator is down): ``matchConditions`` (CEL, evaluated by the API server) select pods whose
containers name a ``tessera.dev/`` resource, or that carry a key only tessera may write
(:mod:`tessera.api.writers`: the webhook removes it), or are named like a growth holder.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

from tessera.api.names import (
    DRA_DEVICE_CLASSES,
    GPUPARTITIONS,
    GPUQUOTAS,
    GROUP,
    GROWTH_HOLDER_PREFIX,
    PREFIX,
    VERSION,
)
from tessera.api.writers import tessera_only_pod_keys
from tessera.kube.client import ApiError, Kube, path

MUTATING_NAME = "tessera-pods"
VALIDATING_NAME = "tessera-resources"
POD_PATH = "/mutate/pods"
PARTITION_PATH = "/validate/gpupartitions"
QUOTA_PATH = "/validate/gpuquotas"
CLAIM_MUTATE_PATH = "/mutate/resourceclaims"
CLAIM_VALIDATE_PATH = "/validate/resourceclaims"


@dataclass(frozen=True)
class ClientConfig:
    """Where the API server reaches the webhooks: a URL (local cluster) or a Service."""

    ca_pem: bytes
    url: str | None = None
    service_name: str | None = None
    service_namespace: str | None = None
    service_port: int = 443

    def for_path(self, p: str) -> dict[str, Any]:
        out: dict[str, Any] = {"caBundle": base64.b64encode(self.ca_pem).decode()}
        if self.url is not None:
            out["url"] = self.url.rstrip("/") + p
        else:
            out["service"] = {"name": self.service_name, "namespace": self.service_namespace,
                              "path": p, "port": self.service_port}
        return out


def _containers_ask(field: str) -> str:
    has_res = (f"c.resources.{kind}.exists(k, k.startsWith('{PREFIX}'))"
               for kind in ("limits", "requests"))
    guard = " || ".join(f"(has(c.resources.{kind}) && {e})"
                        for kind, e in zip(("limits", "requests"), has_res, strict=True))
    return (f"(has(object.spec.{field}) && object.spec.{field}.exists(c, "
            f"has(c.resources) && ({guard})))")


def _carries(section: str, keys: tuple[str, ...]) -> str:
    listed = ", ".join(f"'{k}'" for k in keys)
    return (f"(has(object.metadata.{section}) && "
            f"object.metadata.{section}.exists(k, k in [{listed}]))")


POD_MATCH_EXPRESSION = " || ".join([
    _containers_ask("containers"),
    _containers_ask("initContainers"),
    _carries("annotations", tessera_only_pod_keys("annotation")),
    _carries("labels", tessera_only_pod_keys("label")),
    f"object.metadata.?name.orValue('').startsWith('{GROWTH_HOLDER_PREFIX}')",
    f"object.metadata.?generateName.orValue('').startsWith('{GROWTH_HOLDER_PREFIX}')",
])


def claim_match_expression(spec: str) -> str:
    """CEL: the claim spec at ``spec`` has a request naming one of tessera's DeviceClasses."""
    classes = ", ".join(f"'{c}'" for c in DRA_DEVICE_CLASSES)
    return (f"has({spec}.devices) && has({spec}.devices.requests) && "
            f"{spec}.devices.requests.exists(r, (has(r.exactly) && r.exactly.deviceClassName "
            f"in [{classes}]) || (has(r.firstAvailable) && r.firstAvailable.exists(s, "
            f"s.deviceClassName in [{classes}])))")


def _claim_hooks(cc: ClientConfig, p: str, holds: bool = False) -> list[dict[str, Any]]:
    """ResourceClaims and ResourceClaimTemplates asking tessera's DeviceClasses (the DRA
    path's GPUQuota).  ``Fail``: while the operator is down such claims wait, as GPU pods
    do, rather than take devices no GPUQuota counted.  ``holds``: the validating webhook,
    which holds an admitted claim's capacity with a claim holder (its side effect, none on
    a dry run)."""
    out = []
    for plural, operations, spec in (("resourceclaims", ["CREATE"], "object.spec"),
                                     ("resourceclaimtemplates", ["CREATE", "UPDATE"],
                                      "object.spec.spec")):
        out.append({
            "name": f"{plural}.{GROUP}",
            "clientConfig": cc.for_path(p),
            "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                       "operations": operations, "resources": [plural],
                       "scope": "Namespaced"}],
            "matchConditions": [{"name": "asks-for-tessera-devices",
                                 "expression": claim_match_expression(spec)}],
            "failurePolicy": "Fail",
            "sideEffects": "NoneOnDryRun" if holds and plural == "resourceclaims" else "None",
            "timeoutSeconds": 10,
            "admissionReviewVersions": ["v1"],
            "matchPolicy": "Equivalent",
        })
    return out


def _pod_hook(cc: ClientConfig, p: str) -> dict[str, Any]:
    return {
        "name": f"pods.{GROUP}",
        "clientConfig": cc.for_path(p),
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                   "resources": ["pods"], "scope": "Namespaced"}],
        "matchConditions": [{"name": "asks-for-tessera", "expression": POD_MATCH_EXPRESSION}],
        "failurePolicy": "Fail",
        "sideEffects": "None",
        "timeoutSeconds": 10,
        "admissionReviewVersions": ["v1"],
        "matchPolicy": "Equivalent",
    }


def mutating(cc: ClientConfig) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": MUTATING_NAME, "labels": {"app.kubernetes.io/name": "tessera"}},
        "webhooks": [{**_pod_hook(cc, POD_PATH), "reinvocationPolicy": "IfNeeded"},
                     *({**hook, "reinvocationPolicy": "IfNeeded"}
                       for hook in _claim_hooks(cc, CLAIM_MUTATE_PATH))],
    }


def validating(cc: ClientConfig) -> dict[str, Any]:
    def hook(name: str, plural: str, p: str, scope: str) -> dict[str, Any]:
        return {
            "name": name,
            "clientConfig": cc.for_path(p),
            "rules": [{"apiGroups": [GROUP], "apiVersions": [VERSION],
                       "operations": ["CREATE", "UPDATE"], "resources": [plural],
                       "scope": scope}],
            # The CRD schema and its CEL rules still hold while the operator is down, so a
            # GitOps sync that applies CRs before the operator runs is not blocked.
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 5,
            "admissionReviewVersions": ["v1"],
        }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": VALIDATING_NAME, "labels": {"app.kubernetes.io/name": "tessera"}},
        "webhooks": [hook(f"{GPUPARTITIONS}.{GROUP}", GPUPARTITIONS, PARTITION_PATH, "Cluster"),
                     hook(f"{GPUQUOTAS}.{GROUP}", GPUQUOTAS, QUOTA_PATH, "Namespaced"),
                     *_claim_hooks(cc, CLAIM_VALIDATE_PATH, holds=True)],
    }


async def apply_configurations(kube: Kube, cc: ClientConfig) -> None:
    """Server-side apply both configurations (leader only; unchanged = no write)."""
    group = "admissionregistration.k8s.io"
    await kube.apply(path(group, "v1", "mutatingwebhookconfigurations", name=MUTATING_NAME),
                     mutating(cc))
    await kube.apply(path(group, "v1", "validatingwebhookconfigurations", name=VALIDATING_NAME),
                     validating(cc))


def ca_bundle_patches(cc: ClientConfig) -> dict[str, dict[str, Any]]:
    """By configuration URL: the part of each configuration the operator owns when an
    installer (the Helm chart) owns the rest: every webhook's ``clientConfig.caBundle``."""
    group = "admissionregistration.k8s.io"
    out: dict[str, dict[str, Any]] = {}
    for plural, full in (("mutatingwebhookconfigurations", mutating(cc)),
                         ("validatingwebhookconfigurations", validating(cc))):
        name = full["metadata"]["name"]
        out[path(group, "v1", plural, name=name)] = {
            "apiVersion": full["apiVersion"], "kind": full["kind"],
            "metadata": {"name": name},
            "webhooks": [{"name": hook["name"],
                          "clientConfig": {"caBundle": hook["clientConfig"]["caBundle"]}}
                         for hook in full["webhooks"]],
        }
    return out


async def patch_ca_bundles(kube: Kube, cc: ClientConfig) -> list[str]:
    """Set the caBundle of the installer's configurations (server-side apply of that field
    only, manager ``tessera-operator-ca``); a configuration that does not exist is not
    created (it would lack everything but its CA). Returns the URLs of missing ones."""
    missing = []
    for url, body in ca_bundle_patches(cc).items():
        try:
            await kube.get(url)
        except ApiError as exc:
            if exc.status != 404:
                raise
            missing.append(url)
            continue
        await kube.apply(url, body, manager="tessera-operator-ca")
    return missing
