"""Small helpers the types use to carry CRD-only facts (CEL rules, list types)."""

from __future__ import annotations

from typing import Any


def cel(rule: str, message: str, field_path: str | None = None) -> dict[str, Any]:
    """An ``x-kubernetes-validations`` entry.

    ``fieldPath`` makes the API server name the offending field (``spec.default.cores:
    Invalid value: ...``) rather than the object the rule sits on.
    """
    entry: dict[str, Any] = {"rule": rule, "message": message}
    if field_path is not None:
        entry["fieldPath"] = field_path
    return entry


def list_map(*keys: str) -> dict[str, Any]:
    """Schema extras for a list that behaves as a map keyed by ``keys`` (unique, SSA-mergeable)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


LIST_SET: dict[str, Any] = {"x-kubernetes-list-type": "set"}
