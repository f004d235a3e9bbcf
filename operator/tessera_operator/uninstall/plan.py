"""Pure: what the uninstall hook changes on a Node (no I/O)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tessera.api.names import PREFIX


def node_patch(node: Mapping[str, Any]) -> dict[str, Any] | None:
    """The JSON merge patch that removes every tessera label and annotation from ``node``
    (what the node daemons and the operator wrote); None when it carries none."""
    meta = node.get("metadata") or {}
    out: dict[str, Any] = {}
    for field in ("labels", "annotations"):
        keys = sorted(k for k in (meta.get(field) or {}) if k.startswith(PREFIX))
        if keys:
            out[field] = dict.fromkeys(keys)
    if not out:
        return None
    if meta.get("resourceVersion"):
        # a precondition: a write made meanwhile is read again, never undone blindly
        out["resourceVersion"] = meta["resourceVersion"]
    return {"metadata": out}

