"""tessera's core, shared by the operator (:mod:`tessera_operator`) and the node daemon
(:mod:`tessera_node`), importing neither: the API types and every wire name (``api``), the
GPU model table (``models``), the MIG catalog and planner (``mig``), the GPUPartition rules
(``partition``), and the Kubernetes client layer (``kube``)."""

__version__ = "0.1.0"
