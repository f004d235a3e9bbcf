"""What a daemon found wrong or foreign on its node, published on the Node for users.

Each finding is one line a person can act on.  The list goes into the Node annotation
``tessera.dev/node-findings`` (JSON list of ``{"kind", "message"}``), a new finding is
posted once as an Event on the Node, and findings that concern a partition's GPUs also show
in that partition's report.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

FindingKind = Literal["OtherDevicePlugin", "OtherMigManager", "ProfileMismatch",
                      "UnknownModel", "DRAFieldsDropped", "DRAOnDemandUnavailable"]


@dataclass(frozen=True, order=True)
class Finding:
    kind: FindingKind
    message: str
    gpu: int | None = None
    """The GPU it concerns, when it concerns one."""


def to_annotation(findings: Iterable[Finding]) -> str:
    return json.dumps([{"kind": f.kind, "message": f.message} for f in sorted(findings)],
                      separators=(",", ":"))


def parse_messages(raw: str | None) -> set[str]:
    """The messages of an annotation as written before (unreadable: none)."""
    if not raw:
        return set()
    try:
        data = json.loads(raw)
        return {str(item["message"]) for item in data}
    except (ValueError, TypeError, KeyError):
        return set()


def new_findings(previous_annotation: str | None, findings: Iterable[Finding]
                 ) -> list[Finding]:
    """Findings not yet published (each is worth one Event, once)."""
    seen = parse_messages(previous_annotation)
    return [f for f in sorted(findings) if f.message not in seen]
