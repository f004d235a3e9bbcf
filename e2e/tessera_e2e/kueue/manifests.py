"""Kueue's manifests, rendered from the pinned module's own ``config/`` as kustomize would.

The module ships ``config/default`` (a kustomization) rather than rendered YAML; the test bed
needs three parts of it, and renders them with the handful of kustomize rules they use:

- the CRDs (``config/components/crd``): the bases, with the conversion-webhook patches the
  kustomization lists (the v1beta1 <-> v1beta2 conversions Kueue serves at ``/convert``);
- the RBAC (``config/components/rbac``): ServiceAccount, roles and bindings;
- the webhook configurations (``config/components/webhook``): ``manifests.yaml`` with the
  kustomization's strategic-merge patches (the namespace selectors of the pod, Deployment
  and StatefulSet webhooks).

``config/default`` then names everything ``kueue-…`` (``namePrefix``) in ``kueue-system``
(``namespace``); both are read from its kustomization, and applied to names, namespaces,
role references, ServiceAccount subjects and the webhook Service references, which is what
kustomize's prefix and namespace transformers (and the components' ``kustomizeconfig.yaml``
name references) do to these kinds. CRD names are never prefixed (kustomize leaves them).
What the test bed leaves out: the manager Deployment (the manager runs as a local process),
the internal-certificate Secret, the metrics and visibility Services and APIService, and the
common labels (``app.kubernetes.io/name``, ``control-plane``), which nothing selects on here.

:func:`serve_at` then points every webhook and conversion at a URL (the local manager on
loopback) with the CA that signed its certificate: the API server reaches the manager as it
reaches tessera's operator replicas on the test bed.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.build import KUEUE_MODULE, KUEUE_MODULE_DIR, find_go
from tessera_e2e.controlplane.errors import ControlPlaneError

Doc = dict[str, Any]
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
                  *WEBHOOK_KINDS}


def module_source(module_dir: Path = KUEUE_MODULE_DIR) -> Path:
    """Where the pinned Kueue module's source is (the Go module cache; downloaded if not)."""
    env = dict(os.environ, GOFLAGS="-mod=readonly", GOTOOLCHAIN="local")
    go = find_go(env)
    out = subprocess.run([go, "mod", "download", "-json", KUEUE_MODULE], cwd=module_dir,
                         env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise ControlPlaneError(f"go mod download {KUEUE_MODULE}: {out.stderr.strip()}")
    source = Path(json.loads(out.stdout)["Dir"])
    if not (source / "config" / "default" / "kustomization.yaml").is_file():
        raise ControlPlaneError(f"{source} has no config/default/kustomization.yaml")
    return source


@dataclass
class Rendered:
    """Kueue's objects, by part, as kustomize would render them."""

    namespace: str
    prefix: str
    crds: list[Doc] = field(default_factory=list)
    rbac: list[Doc] = field(default_factory=list)
    webhooks: list[Doc] = field(default_factory=list)

    @property
    def service_account(self) -> str:
        return f"{self.prefix}controller-manager"

    @property
    def all(self) -> list[Doc]:
        return [*self.crds, *self.rbac, *self.webhooks]

    def crd_names(self) -> list[str]:
        return [str(d["metadata"]["name"]) for d in self.crds]


def _load(path: Path) -> list[Doc]:
    return [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]


def _kustomization(directory: Path) -> Doc:
    doc = yaml.safe_load((directory / "kustomization.yaml").read_text())
    if not isinstance(doc, dict):
        raise ControlPlaneError(f"{directory}/kustomization.yaml is not a mapping")
    return doc


def merge(base: Any, patch: Any, key: str = "") -> Any:
    """Strategic merge as kustomize applies it to these objects: maps merge key by key;
    ``webhooks`` (a list keyed by ``name``) merges item by item; other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        out = dict(base)
        for k, v in patch.items():
            out[k] = merge(base[k], v, k) if k in base else copy.deepcopy(v)
        return out
    if key == "webhooks" and isinstance(base, list) and isinstance(patch, list):
        by_name = {str(item.get("name")): item for item in patch if isinstance(item, dict)}
        merged = [merge(item, by_name.pop(str(item.get("name")), {}), "") for item in base]
        return merged + list(by_name.values())
    return copy.deepcopy(patch)


def _component(directory: Path) -> list[Doc]:
    """One component's resources with its own patches applied (by kind and name)."""
    kustomization = _kustomization(directory)
    docs: list[Doc] = []
    for resource in kustomization.get("resources") or []:
        docs.extend(_load(directory / resource))
    for entry in kustomization.get("patches") or []:
        patches = (_load(directory / entry["path"]) if "path" in entry
                   else [yaml.safe_load(entry["patch"])])
        for patch in patches:
            target = (patch.get("kind"), (patch.get("metadata") or {}).get("name"))
            hits = [i for i, d in enumerate(docs)
                    if (d.get("kind"), d["metadata"].get("name")) == target]
            if not hits:
                raise ControlPlaneError(f"{directory}: patch for {target} matches nothing")
            for i in hits:
                docs[i] = merge(docs[i], patch)
    return docs


def _service_ref(ref: Mapping[str, Any], prefix: str, namespace: str) -> dict[str, Any]:
    out = dict(ref)
    out["name"] = prefix + str(ref["name"])
    out["namespace"] = namespace
    return out


def _place(doc: Doc, prefix: str, namespace: str) -> Doc:
    """kustomize's namePrefix and namespace transformers on one object."""
    doc = copy.deepcopy(doc)
    kind, meta = doc["kind"], doc["metadata"]
    if kind != "CustomResourceDefinition":
        meta["name"] = prefix + meta["name"]
    if kind not in CLUSTER_SCOPED:
        meta["namespace"] = namespace
    if kind in ("RoleBinding", "ClusterRoleBinding"):
        doc["roleRef"]["name"] = prefix + doc["roleRef"]["name"]
        for subject in doc.get("subjects") or []:
            if subject.get("kind") == "ServiceAccount":
                subject["name"] = prefix + subject["name"]
                subject["namespace"] = namespace
    for hook in doc.get("webhooks") or []:
        service = (hook.get("clientConfig") or {}).get("service")
        if service:
            hook["clientConfig"]["service"] = _service_ref(service, prefix, namespace)
    conversion = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
    service = (conversion.get("clientConfig") or {}).get("service")
    if service:
        conversion["clientConfig"]["service"] = _service_ref(service, prefix, namespace)
    return doc


def render(source: Path) -> Rendered:
    """The CRDs, RBAC and webhook configurations of ``config/default`` in ``source``."""
    config = source / "config"
    default = _kustomization(config / "default")
    prefix, namespace = str(default["namePrefix"]), str(default["namespace"])
    used = {str(r) for r in default.get("resources") or []}
    parts = {"crds": "../components/crd", "rbac": "../components/rbac",
             "webhooks": "../components/webhook"}
    kinds = {"crds": ("CustomResourceDefinition",), "webhooks": WEBHOOK_KINDS}
    # (the webhook component's Service is left out: the API server calls a URL here)
    missing = sorted(set(parts.values()) - used)
    if missing:
        raise ControlPlaneError(f"config/default no longer uses {', '.join(missing)}")
    out = Rendered(namespace=namespace, prefix=prefix)
    for part, relative in parts.items():
        docs = [_place(d, prefix, namespace)
                for d in _component((config / "default" / relative).resolve())
                if part not in kinds or d.get("kind") in kinds[part]]
        getattr(out, part).extend(docs)
    return out


def serve_at(docs: Iterable[Doc], base_url: str, ca_pem: bytes) -> list[Doc]:
    """The objects with every webhook and CRD conversion sent to ``base_url`` + its path
    (instead of the Service), trusting ``ca_pem``."""
    bundle = base64.b64encode(ca_pem).decode()
    out: list[Doc] = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        configs = [h.get("clientConfig") for h in doc.get("webhooks") or []]
        conversion = ((doc.get("spec") or {}).get("conversion") or {}).get("webhook") or {}
        configs.append(conversion.get("clientConfig"))
        for config in configs:
            if not config or "service" not in config:
                continue
            path = str(config.pop("service").get("path") or "/")
            config["url"] = base_url.rstrip("/") + path
            config["caBundle"] = bundle
        out.append(doc)
    return out
