"""tessera's operator: admission webhooks on every replica, reconciliation on the leader
(``tessera operator run``), and the ``tessera`` command line. What it shares with the node
daemon is the core package, :mod:`tessera`."""

__version__ = "0.1.0"
