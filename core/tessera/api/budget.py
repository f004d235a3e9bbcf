"""The ``tessera.dev/budget`` pod annotation: the admitted budget of each container.

The mutating webhook writes it once at admission; it is the only input the node daemon
uses to build a container's budget file.  Values are per GPU share (a whole GPU or one MIG
instance), because that is what libtessera enforces on each device it sees; the pod's
limits carry the totals.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field, ValidationError

from tessera.api.meta import ApiModel
from tessera.api.profile import ProfileName

MIB = 1 << 20
MAX_SHARES = 64
"""Most GPU shares one container may hold (a node has at most this many GPUs and MIG
instances a container could be given)."""


class BudgetAnnotationError(ValueError):
    """The annotation is not a budget this version understands."""


class PerShareBudget(ApiModel):
    """One container's budget on each of its GPU shares."""

    shares: int = Field(ge=0, le=MAX_SHARES)
    """How many GPU shares (``tessera.dev/vgpu``) the container holds."""
    memory_bytes: int = Field(ge=0)
    """Device memory the container may hold on each share, in bytes."""
    cores: float = Field(ge=0, le=100)
    """Percent of each share's SMs the container is held to under contention."""
    mig: dict[ProfileName, int] = Field(default_factory=dict)
    """Whole MIG instances by profile (``tessera.dev/mig-*``); not budgeted, recorded for audit."""

    @classmethod
    def from_totals(
        cls, shares: int, memory_mib: int, cores: int, mig: dict[str, int] | None = None
    ) -> PerShareBudget:
        """Split a container's totals (its pod limits) evenly over its shares."""
        if shares <= 0:
            return cls(shares=0, memory_bytes=0, cores=0, mig=mig or {})
        return cls(
            shares=shares,
            memory_bytes=memory_mib * MIB // shares,
            cores=cores / shares,
            mig=mig or {},
        )


class BudgetAnnotation(ApiModel):
    """The whole annotation: every GPU container of the pod by container name."""

    version: Literal[1] = 1
    """Format version; a daemon refuses versions it does not know."""
    quota: str | None = None
    """The GPUQuota that supplied defaults and weight, if any."""
    weight: int = Field(default=1, ge=1, le=1000)
    """Fair-share weight for idle capacity, from the quota."""
    lending: bool = True
    """False: hard caps (the quota's ``lending: false``): neither lends nor borrows core time."""
    containers: dict[str, PerShareBudget] = Field(default_factory=dict)
    """Budgets by container name."""

    def to_annotation(self) -> str:
        """Compact, key-sorted JSON so the same budget always gives the same annotation."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))


def parse_budget_annotation(text: str) -> BudgetAnnotation:
    """Parse the annotation value; errors are one line naming the field."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BudgetAnnotationError(f"budget annotation is not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise BudgetAnnotationError("budget annotation must be a JSON object")
    try:
        return BudgetAnnotation.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"])
        raise BudgetAnnotationError(f"budget annotation {path}: {first['msg']}") from None
