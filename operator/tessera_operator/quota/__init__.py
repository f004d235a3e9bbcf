"""Pure quota arithmetic: budgets from pod requests, fit against every GPUQuota, recount.

No I/O here: the webhook and the controller feed in plain objects and write back what these
functions decide, so every rule is testable exhaustively without a cluster.
"""

from tessera_operator.quota.arith import (
    ContainerRequest,
    Limits,
    PodRequest,
    QuotaPolicy,
    QuotaView,
    Usage,
    Violation,
    budget_from_pod,
    check_fit,
    deny_message,
    recount,
)

__all__ = [
    "ContainerRequest",
    "Limits",
    "PodRequest",
    "QuotaPolicy",
    "QuotaView",
    "Usage",
    "Violation",
    "budget_from_pod",
    "check_fit",
    "deny_message",
    "recount",
]
