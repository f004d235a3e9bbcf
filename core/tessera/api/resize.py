"""The ``tessera.dev/budget-resize`` pod annotation: the outcome of a live resize request.

Written by the operator (Approved, or Refused against the quota) and the node daemon
(Applied, or Refused for the GPU's memory); the user writes only ``tessera.dev/budget-request``
(its rules: :mod:`tessera_operator.quota.resize`).

What the operator acts on later -- the budget to restore when a node refuses, what grew --
carries a **seal**: an HMAC, with a key only the operator holds (a Secret in its namespace),
over the pod's UID, the request it answers, ``previous`` and ``grow``.  The node daemon
copies it through when it turns Approved into Refused; a record without a valid seal (a
user's forgery at create, a copy from another pod, a changed ``previous``) is never acted on.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
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
    :mod:`tessera_operator.quota.managed`)."""

    request: str
    state: State
    reason: str = ""
    previous: str | None = None
    grow: Mapping[str, int] | None = None
    seal: str | None = None
    """While Approved (and when a node refuses it): :func:`seal` of the record."""

    def to_annotation(self) -> str:
        out: dict[str, Any] = {"request": self.request, "state": self.state}
        if self.reason:
            out["reason"] = self.reason
        if self.previous is not None:
            out["previous"] = self.previous
        if self.grow is not None:
            out["grow"] = dict(self.grow)
        if self.seal is not None:
            out["seal"] = self.seal
        return json.dumps(out, sort_keys=True, separators=(",", ":"))

    def sealed(self, key: bytes, pod_uid: str) -> ResizeStatus:
        """This record with its seal for the pod ``pod_uid``."""
        return replace(self, seal=seal(key, pod_uid, self))

    def seal_holds(self, key: bytes, pod_uid: str) -> bool:
        """Whether the operator wrote this record's ``previous`` and ``grow`` for this pod."""
        return self.seal is not None and hmac.compare_digest(
            self.seal, seal(key, pod_uid, self))

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
            previous, sealed_by = raw.get("previous"), raw.get("seal")
            return cls(str(raw["request"]), state, str(raw.get("reason", "")),
                       previous if isinstance(previous, str) else None,
                       {str(k): int(v) for k, v in grow.items()} if grow else None,
                       sealed_by if isinstance(sealed_by, str) else None)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


def seal(key: bytes, pod_uid: str, status: ResizeStatus) -> str:
    """HMAC-SHA256 over what the operator acts on (not the state, which the node turns
    from Approved to Applied or Refused)."""
    message = json.dumps([pod_uid, status.request, status.previous,
                          dict(sorted(status.grow.items())) if status.grow else None],
                         separators=(",", ":"))
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def digest(request_text: str) -> str:
    return hashlib.sha256(request_text.encode()).hexdigest()[:16]


