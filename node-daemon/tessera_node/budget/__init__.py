"""A container's budget files on the host: the budget file the daemon writes and libtessera
reads (``formats``), the ledger the daemon creates and the container's processes keep
(``ledger``), and where both live for each allocation (``writer``). Files only: who decides
what goes in them is the device plugin (budgets) and the core controllers (rates,
:mod:`tessera_node.cores`).

The binary formats are defined in ``hook/src/formats.h`` and documented in ``hook/README.md``;
``formats`` and ``ledger`` mirror them byte for byte.
"""

from tessera_node.budget.formats import (
    BUDGET_FILE_SIZE,
    BudgetEntry,
    BudgetFile,
    read_budget_file,
    write_budget_file,
)
from tessera_node.budget.ledger import LedgerDevice, LedgerSlot, LedgerView, read_ledger

__all__ = [
    "BUDGET_FILE_SIZE",
    "BudgetEntry",
    "BudgetFile",
    "LedgerDevice",
    "LedgerSlot",
    "LedgerView",
    "read_budget_file",
    "read_ledger",
    "write_budget_file",
]
