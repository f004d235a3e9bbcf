"""Placement on the device-plugin path (pure): which GPU or MIG instance each container of a
pod uses, decided before the pod is bound.

``record`` (the ``tessera.dev/placement`` annotation), ``units`` (a node's units from its
inventory), ``demand`` (what a pod asks of them), ``usage`` (what is placed on them: the
assumed state), ``policy`` (binpack/spread, models, UUIDs, topology), ``topology`` (NVLink
groups, NUMA nodes), ``choose`` (one pod on one node: the units, or why none),
``fragmentation`` (which MIG instance keeps the most useful slots free), ``preemption`` (the
fewest lower-priority pods to remove). No I/O: the operator's placement service and the node
daemon's device plugin call it.
"""
