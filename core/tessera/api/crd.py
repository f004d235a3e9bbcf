"""CustomResourceDefinitions generated from the API types (the types are the source of truth).

pydantic's JSON Schema is turned into a *structural* OpenAPI v3 schema: references
inlined, ``null`` branches dropped, ``const`` turned into ``enum``, keywords the API server
does not know removed; CEL rules, list types and int-or-string markers come from the types
themselves.  Output is deterministic so ``crds/`` can be checked against it.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from tessera.api import partition, quota
from tessera.api.conditions import READY
from tessera.api.meta import ApiModel
from tessera.api.names import CATEGORY, GROUP, VERSION

JSON = dict[str, Any]

_DROP = {"title", "propertyNames", "examples"}


def _tidy(text: str) -> str:
    """One paragraph per description, without reST markup, for ``kubectl explain``."""
    return " ".join(text.replace("``", "").split())


def _structural(node: Any, defs: JSON, keep_defaults: bool) -> Any:
    if isinstance(node, list):
        return [_structural(item, defs, keep_defaults) for item in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").rsplit("/", 1)[-1]])
        target.update(node)  # the field's own description/extras win over the type's
        return _structural(target, defs, keep_defaults)
    branches = node.get("anyOf")
    if isinstance(branches, list):
        rest = [b for b in branches if b != {"type": "null"}]
        if len(rest) != len(branches):
            del node["anyOf"]
            if len(rest) == 1:
                merged = dict(rest[0])
                merged.update(node)
                node = merged
                if "$ref" in node:
                    return _structural(node, defs, keep_defaults)
            else:
                node["anyOf"] = rest
    if "const" in node:
        node["enum"] = [node.pop("const")]
    out: JSON = {}
    for key, value in node.items():
        if key in _DROP or key == "$defs":
            continue
        if key == "default" and (value is None or not keep_defaults):
            continue
        if key == "additionalProperties" and value is False:
            continue
        if key == "description":
            out[key] = _tidy(value)
        elif key == "patternProperties":
            # The API server has no patternProperties; the key pattern is checked by the
            # types (admission) only, as a CEL rule over unbounded keys would cost too much.
            (schema,) = value.values()
            out["additionalProperties"] = _structural(schema, defs, keep_defaults)
        elif key in ("properties",):
            out[key] = {k: _structural(v, defs, keep_defaults) for k, v in value.items()}
        elif key in ("items", "additionalProperties", "anyOf"):
            out[key] = _structural(value, defs, keep_defaults)
        else:
            out[key] = value
    if "properties" in out or "additionalProperties" in out:
        out.setdefault("type", "object")
    return out


def schema_of(model: type[ApiModel], keep_defaults: bool = True) -> JSON:
    """Structural OpenAPI v3 schema of one API type."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    result: JSON = _structural(raw, defs, keep_defaults)
    return result


def _column(name: str, type_: str, path: str, description: str) -> JSON:
    return {"name": name, "type": type_, "jsonPath": path, "description": description}


_AGE = _column("Age", "date", ".metadata.creationTimestamp", "Time since creation.")


def _crd(
    *,
    kind: str,
    plural: str,
    short: str,
    scope: str,
    spec: type[ApiModel],
    status: type[ApiModel],
    top: type[ApiModel],
    columns: list[JSON],
) -> JSON:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": [CATEGORY],
            },
            "scope": scope,
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "description": (top.__doc__ or "").strip(),
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": schema_of(spec),
                                "status": schema_of(status, keep_defaults=False),
                            },
                        }
                    },
                }
            ],
        },
    }


def gpupartition_crd() -> JSON:
    return _crd(
        kind=partition.KIND,
        plural=partition.PLURAL,
        short="gpart",
        scope="Cluster",
        spec=partition.GPUPartitionSpec,
        status=partition.GPUPartitionStatus,
        top=partition.GPUPartition,
        columns=[
            _column("Selected", "integer", ".status.selectedNodeCount", "Nodes selected."),
            _column("Ready", "integer", ".status.readyNodeCount", "Selected nodes ready."),
            _column("Layout", "string", ".status.layout", "MIG layout per GPU."),
            _AGE,
        ],
    )


def gpuquota_crd() -> JSON:
    return _crd(
        kind=quota.KIND,
        plural=quota.PLURAL,
        short="gq",
        scope="Namespaced",
        spec=quota.GPUQuotaSpec,
        status=quota.GPUQuotaStatus,
        top=quota.GPUQuota,
        columns=[
            _column("Cores", "string", ".status.summary.cores", "Cores used/hard (% of a GPU)."),
            _column("Memory", "string", ".status.summary.memory", "GPU memory used/hard."),
            _column("Pods", "string", ".status.summary.pods", "GPU pods used/hard."),
            _column(READY, "string", f'.status.conditions[?(@.type=="{READY}")].status',
                    "Ready."),
            _AGE,
        ],
    )


def all_crds() -> list[JSON]:
    return [gpupartition_crd(), gpuquota_crd()]


def file_name(crd: JSON) -> str:
    return f"{crd['metadata']['name']}.yaml"


HEADER = "# Generated by `tessera crds` from tessera.api; do not edit (run `make crds`).\n"


def render(crd: JSON) -> str:
    """YAML text of one CRD, stable across runs."""
    return HEADER + yaml.safe_dump(crd, sort_keys=True, width=100, default_flow_style=False)


def rendered() -> dict[str, str]:
    """File name -> YAML text, for every CRD."""
    return {file_name(crd): render(crd) for crd in all_crds()}


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in rendered().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
