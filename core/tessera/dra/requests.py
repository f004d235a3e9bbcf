"""What a ResourceClaim's requests ask, read the one way both processes need (pure): the
operator's claims webhooks count it, the node's kubelet plugin budgets it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def request_body(claim: Mapping[str, Any], request: str) -> Mapping[str, Any]:
    """What the claim's request ``request`` (``<request>`` or, for a ``firstAvailable``
    alternative, ``<request>/<subrequest>``, as allocation results name them) asks: its
    ``exactly`` or its subrequest ({} when the claim has no such request)."""
    name, _, sub = request.partition("/")
    for r in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or []:
        if not isinstance(r, Mapping) or r.get("name") != name:
            continue
        if not sub:
            exactly = r.get("exactly")
            return exactly if isinstance(exactly, Mapping) else {}
        for s in r.get("firstAvailable") or []:
            if isinstance(s, Mapping) and s.get("name") == sub:
                return s
    return {}


def stated_capacity(body: Mapping[str, Any]) -> Mapping[str, Any]:
    """The capacity a request (an ``exactly`` or a subrequest) states,
    ``capacity.requests`` ({} when it states none)."""
    cap = body.get("capacity")
    req = cap.get("requests") if isinstance(cap, Mapping) else None
    return req if isinstance(req, Mapping) else {}
