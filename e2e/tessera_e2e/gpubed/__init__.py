"""The GPU bed: the test bed's nodes with tessera-node running on their simulated GPUs
(``bed``, ``daemons``), and the real GPU processes its tests run (``workloads``)."""
