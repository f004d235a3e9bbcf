"""The ``tessera.dev/claim-budget`` pod annotation: the live budget of the DRA claims a pod
owns, once a live resize changed one.

A claim's spec is immutable and Kubernetes has no claim resize (1.34-1.37), so what a resize
grants is kept beside the claim: on the pod whose ResourceClaimTemplate made it (the claim is
that pod's alone and is deleted with it).  The operator writes it (approving a resize, taking
a growth back); the node daemon reads it and holds the claim's containers to it.  Per claim
UID::

    {"0b6c…": {"claim": "infer-gpu-x7k2q", "memoryMiB": 12288, "cores": 40,
               "allocatedMemoryMiB": 4096, "allocatedCores": 30}}

``allocated*`` is what the claim's allocation took (``consumedCapacity``): the GPUQuota counts
it through the claim's holder, and the node's published capacity leaves room for it; what a
budget has beyond it (its *growth*) is held apart, in the quota by growth holders and on the
node by publishing that much less capacity.  A claim that is not listed has its allocation as
its budget.  Pure: both processes import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

MIB = 1 << 20


class ClaimBudgetError(ValueError):
    """The annotation is not a claim budget this version understands."""


@dataclass(frozen=True)
class ClaimBudget:
    claim: str
    """The claim's name (in the pod's namespace)."""
    memory_mib: int
    cores: int
    allocated_memory_mib: int
    allocated_cores: int

    @property
    def growth(self) -> tuple[int, int]:
        """(MiB, cores) beyond the allocation; zero where the budget is not larger."""
        return (max(0, self.memory_mib - self.allocated_memory_mib),
                max(0, self.cores - self.allocated_cores))

    def to_json(self) -> dict[str, int | str]:
        return {"claim": self.claim, "memoryMiB": self.memory_mib, "cores": self.cores,
                "allocatedMemoryMiB": self.allocated_memory_mib,
                "allocatedCores": self.allocated_cores}


def _int(uid: str, raw: Mapping[str, object], key: str, low: int, high: int | None) -> int:
    v = raw.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < low or (high is not None and v > high):
        bound = f"{low}..{high}" if high is not None else f">= {low}"
        raise ClaimBudgetError(f"claim {uid}: {key} must be a whole number {bound}, not {v!r}")
    return v


def parse_claim_budgets(text: str | None) -> dict[str, ClaimBudget]:
    """Claim UID -> its budget; {} when absent. ClaimBudgetError names what is wrong."""
    if not text:
        return {}
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ClaimBudgetError(f"claim budget is not JSON: {exc.msg}") from None
    if not isinstance(raw, dict):
        raise ClaimBudgetError("claim budget must be a JSON object by claim UID")
    out = {}
    for uid, c in raw.items():
        if not isinstance(c, dict) or not isinstance(c.get("claim"), str):
            raise ClaimBudgetError(f"claim {uid}: must be an object naming its claim")
        out[str(uid)] = ClaimBudget(
            c["claim"], _int(uid, c, "memoryMiB", 1, None), _int(uid, c, "cores", 1, 100),
            _int(uid, c, "allocatedMemoryMiB", 1, None), _int(uid, c, "allocatedCores", 1, 100))
    return out


def claim_budgets_text(budgets: Mapping[str, ClaimBudget]) -> str:
    return json.dumps({uid: b.to_json() for uid, b in sorted(budgets.items())},
                      sort_keys=True, separators=(",", ":"))
