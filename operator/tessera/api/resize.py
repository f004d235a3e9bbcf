"""The ``tessera.dev/budget-resize`` pod annotation: the outcome of a live resize request.

Written by the operator (Approved, or Refused against the quota) and the node daemon
(Applied, or Refused for the GPU's memory); the user writes only ``tessera.dev/budget-request``
(its rules: :mod:`tessera.quota.resize`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

State = Literal["Approved", "Applied", "Refused"]


@dataclass(frozen=True)
class ResizeStatus:
    """``tessera.dev/budget-resize``: the last request's outcome.

    ``request``: a digest of the request it answers (a new request is one whose digest
    differs). ``state``: Approved (the operator holds the growth against the quota and
    wrote the new budget; the node daemon has not applied it yet), Applied (the container's
    budget file has it), Refused (``reason`` says why; the budget is what it was).
    ``previous``: while Approved, the budget annotation before the resize (restored if the
    node refuses), and ``grow`` what grew (held on the managed ResourceQuota:
    :mod:`tessera.quota.managed`)."""

    request: str
    state: State
    reason: str = ""
    previous: str | None = None
    grow: Mapping[str, int] | None = None

    def to_annotation(self) -> str:
        out: dict[str, Any] = {"request": self.request, "state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.previous is not None:
            out["previous"] = self.previous
        if self.grow is not None:
            out["grow"] = dict(self.grow)
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    @classmethod
    def parse(cls, text: str | None) -> ResizeStatus | None:
        """None when absent or unreadable (an unreadable status is answered anew)."""
        if not text:
            return None
        try:
            raw = json.loads(text)
            state = raw["state"]
            if state not in ("Approved", "Applied", "Refused"):
                return None
            grow = raw.get("grow")
            return cls(str(raw["request"]), state, str(raw.get("reason", "")),
                       raw.get("previous"),
                       {str(k): int(v) for k, v in grow.items()} if grow else None)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def digest(request_text: str) -> str:
    return hashlib.sha256(request_text.encode()).hexdigest()[:16]


