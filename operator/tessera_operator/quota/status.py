"""A GPUQuota's conditions, derived from its ``hard`` limits and what is in use."""

from __future__ import annotations

from collections.abc import Sequence

from tessera.api.conditions import DEGRADED, READY, Condition, set_condition
from tessera_operator.quota.arith import Limits, Usage
from tessera_operator.quota.units import mib_quantity


def over_hard(limits: Limits, used: Usage) -> list[tuple[str, str, str]]:
    """Each resource whose use is above its hard limit: (field under ``hard``, used, hard),
    e.g. ``("memory", "48Gi", "40Gi")`` or ``("migInstances.1g.10gb", "3", "2")``."""
    out = []
    for res, lim, u, fmt in (("memory", limits.memory_mib, used.memory_mib, mib_quantity),
                             ("cores", limits.cores, used.cores, str),
                             ("pods", limits.pods, used.pods, str)):
        if lim is not None and u > lim:
            out.append((res, fmt(u), fmt(lim)))
    for prof, lim in sorted(limits.mig.items()):
        if used.mig.get(prof, 0) > lim:
            out.append((f"migInstances.{prof}", str(used.mig[prof]), str(lim)))
    return out


def quota_conditions(old: Sequence[Condition], limits: Limits, used: Usage | None,
                     generation: int, problem: str | None = None,
                     unenforced: tuple[str, str] | None = None) -> list[Condition]:
    """Ready once usage is counted and the API server counts it too; Degraded while use is
    above ``hard``; a spec that cannot be read (``problem`` names the field) is neither: the
    quota admits nothing.  ``unenforced``: why the ResourceQuota the quota manages does not
    count for it now (a reason and a sentence: :func:`tessera_operator.quota.managed.enforcement`):
    Ready and Degraded say so, and GPU pods of the namespace are refused meanwhile."""
    conds = list(old)
    if problem is not None:
        conds = set_condition(conds, READY, "False", "SpecUnreadable", problem, generation)
        return set_condition(conds, DEGRADED, "True", "SpecUnreadable", problem, generation)
    if unenforced is not None:
        reason, why = unenforced
        conds = set_condition(conds, READY, "False", reason, why, generation)
        return set_condition(conds, DEGRADED, "True", reason, f"{why}: GPU pods of this "
                             f"namespace are refused until it counts again", generation)
    if used is None:
        conds = set_condition(conds, READY, "False", "Counting", "usage not counted yet",
                              generation)
    else:
        conds = set_condition(conds, READY, "True", "Counted",
                              "usage is counted and enforced at admission", generation)
    over = [] if used is None else over_hard(limits, used)
    if over:
        text = "; ".join(f"{res} used {u} > hard {h}" for res, u, h in over)
        conds = set_condition(conds, DEGRADED, "True", "OverHard",
                              text + ": existing pods keep running, new GPU pods are refused "
                              "until usage drops", generation)
    else:
        conds = set_condition(conds, DEGRADED, "False", "WithinHard", "", generation)
    return conds
