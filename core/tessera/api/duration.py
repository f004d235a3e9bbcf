"""Durations on the wire (``90s``, ``30m``, ``1h30m``): the one parser, used by the API types'
validation (so by the validating webhook and ``load_manifest``) and by the node daemon that
acts on them. Hours, minutes and seconds, whole numbers, in that order, each at most once; no
fractions, no days (a day is not always 24 hours on a calendar, and nothing here needs one)."""

from __future__ import annotations

import re

PATTERN = r"^([0-9]{1,6}h)?([0-9]{1,6}m)?([0-9]{1,6}s)?$"
"""The same shape as a CRD pattern (the API server checks it before the webhook)."""

_RE = re.compile(PATTERN)


def parse_duration(text: str) -> int:
    """Seconds in ``text``; ValueError when it is not such a duration (empty included)."""
    m = _RE.fullmatch(text) if isinstance(text, str) else None
    if m is None or not text:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m or 1h30m")
    h, mi, s = (int(g[:-1]) if g else 0 for g in m.groups())
    return h * 3600 + mi * 60 + s


def format_duration(seconds: float) -> str:
    """``1h2m3s``-style text of whole seconds (``0s`` for nothing)."""
    s = max(0, int(seconds))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    out = (f"{h}h" if h else "") + (f"{m}m" if m else "") + (f"{s}s" if s or not (h or m)
                                                               else "")
    return out
