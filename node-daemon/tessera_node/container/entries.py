"""A container's budget file entries, one per unit it sees (pure): the same for a container
the device plugin set up (its pod's budget annotation) and for one a DRA claim set up (the
capacity the scheduler allocated)."""

from __future__ import annotations

from tessera_node.budget.formats import BudgetEntry

INITIAL_RATE = 100_000.0
"""Launch tokens per second until the core controller has learnt the kernels' cost: high
enough not to throttle; the controller lowers it within its first intervals."""
ALL_CORES = 100


def shared_entry(index: int, uuid: str, memory: int | None, cores: float | None,
                 context: int = 0) -> BudgetEntry:
    """A unit shared with other containers: ``memory`` bytes (None: no limit) and ``cores``
    percent of its SM time (all of it, or None: no core limit, nothing to pace)."""
    limit = cores if cores is not None and cores < ALL_CORES else None
    return BudgetEntry(
        index=index, uuid=uuid, memory=memory, cores=limit,
        rate=INITIAL_RATE if limit is not None else 0.0,
        burst=INITIAL_RATE / 20 if limit is not None else 1.0, context=context,
    )


def whole_entry(index: int, uuid: str, context: int = 0) -> BudgetEntry:
    """A whole MIG instance: no memory or core limit, the instance is the container's alone."""
    return BudgetEntry(index=index, uuid=uuid, context=context)
