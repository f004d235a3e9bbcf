"""JSON merge patches (RFC 7386) computed from two versions of an object."""

from __future__ import annotations

from typing import Any


def merge_diff(old: Any, new: Any) -> Any:
    """The JSON merge patch (RFC 7386) that turns ``old`` into ``new``; {} when equal.

    Objects are diffed key by key (a key gone from ``new``, or None there, becomes null so
    the API server removes it); lists and scalars are replaced whole.
    """
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    out: dict[str, Any] = {}
    for k, v in new.items():
        if v is None:
            if k in old:
                out[k] = None
        elif k not in old:
            out[k] = v
        elif isinstance(v, dict) and isinstance(old[k], dict):
            sub = merge_diff(old[k], v)
            if sub != {}:
                out[k] = sub
        elif old[k] != v:
            out[k] = v
    for k in old:
        if k not in new:
            out[k] = None
    return out
