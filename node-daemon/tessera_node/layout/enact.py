"""Who carries a plan out.  MIG enactment (``nvidia-smi mig -cgi/-dgi``, mode changes,
waiting for idle GPUs) is the next part of the daemon; until then the daemon's enactor says
why it cannot act, and the report says so instead of claiming the layout."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from tessera_node.layout.plan import GPUPlan


@dataclass(frozen=True)
class Outcome:
    done: bool
    message: str = ""


class Enactor(Protocol):
    def refusal(self) -> str | None:
        """Why it cannot act at all now (None: it can); asked before any plan is queued."""
        ...

    def apply(self, plan: GPUPlan) -> Outcome:
        """Carry ``plan`` out (blocking: runs in a worker thread); never raises."""
        ...


NOT_YET = "this tessera-node version does not change MIG layouts yet"


class NoEnactment:
    """Acts on nothing and says so (the daemon before MIG enactment, or beside another MIG
    manager)."""

    def __init__(self, reason: str = NOT_YET) -> None:
        self.reason = reason

    def refusal(self) -> str | None:
        return self.reason

    def apply(self, plan: GPUPlan) -> Outcome:
        return Outcome(False, self.reason)
