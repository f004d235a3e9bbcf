"""Memory never overcommits silently (pure): the memory budgets on one GPU or MIG instance
never add up to more than its memory."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MIB = 1 << 20


def free_memory(unit_memory: Mapping[str, int], held: Mapping[str, Sequence[int]]
                ) -> dict[str, int]:
    """Bytes not yet budgeted, per unit (negative never happens when every grant went
    through ``overcommit``)."""
    return {u: m - sum(held.get(u, ())) for u, m in unit_memory.items()}


def overcommit(
    units: Sequence[str],
    want: int,
    unit_memory: Mapping[str, int | None],
    held: Mapping[str, Sequence[int]],
) -> str | None:
    """Why a container budgeted ``want`` bytes on each of ``units`` does not fit beside the
    budgets already ``held`` there, or None when it fits. A unit of unknown memory never
    fits (a value that cannot be read is an error)."""
    for u in units:
        total = unit_memory.get(u)
        if total is None:
            return f"memory of {u} is unknown"
        already = sum(held.get(u, ()))
        if already + want > total:
            return (
                f"memory budgets on {u} would exceed its {total // MIB} MiB "
                f"({already // MIB} MiB budgeted, {want // MIB} MiB asked)"
            )
    return None
