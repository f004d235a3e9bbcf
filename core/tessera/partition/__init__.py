"""Pure GPUPartition logic: node/GPU selection, claim conflicts, layout checks, conditions.

The controller feeds in the partitions and the node inventories it watches and writes back
what :func:`resolve` and :func:`aggregate` decide; nothing here does I/O.
"""

from tessera.partition.logic import (
    Claim,
    NodeProblem,
    PartitionView,
    Resolution,
    aggregate,
    claim_order,
    layout_problem,
    resolve,
    spec_errors,
    transitions,
)

__all__ = [
    "Claim",
    "NodeProblem",
    "PartitionView",
    "Resolution",
    "aggregate",
    "claim_order",
    "layout_problem",
    "resolve",
    "spec_errors",
    "transitions",
]
