"""tessera: share NVIDIA GPUs between teams with MIG layouts and enforced per-pod budgets."""

__version__ = "0.1.0"
