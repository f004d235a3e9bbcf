"""Per-container GPU budgets: the budget file libtessera reads, the ledger it keeps, and the
per-GPU core-share controller that sets each container's token rate.

The binary formats are defined in ``hook/src/formats.h`` and documented in ``hook/README.md``;
``formats`` mirrors them byte for byte.
"""

from tessera_node.budget.formats import (
    BUDGET_FILE_SIZE,
    BudgetEntry,
    BudgetFile,
    read_budget,
    write_budget,
)
from tessera_node.budget.ledger import LedgerDevice, LedgerSlot, LedgerView, read_ledger

__all__ = [
    "BUDGET_FILE_SIZE",
    "BudgetEntry",
    "BudgetFile",
    "LedgerDevice",
    "LedgerSlot",
    "LedgerView",
    "read_budget",
    "read_ledger",
    "write_budget",
]
