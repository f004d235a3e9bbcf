"""Prometheus metrics of the operator process (served on /metrics with /healthz): admission
and the leader's loops, all named here so dashboards and alerts have one list."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ADMISSION_SECONDS = Histogram(
    "tessera_admission_seconds", "Time to answer one admission review.", ["webhook", "result"],
    buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1,
             2.5))
LOOP_LAG_SECONDS = Histogram(
    "tessera_event_loop_lag_seconds",
    "How late the event loop woke a task (sampled every 50 ms): what an admission review "
    "arriving then would wait behind the watches, status writes and kopf.",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5))
IS_LEADER = Gauge("tessera_leader", "1 while this replica holds the leader Lease.")
STATUS_WRITES = Counter("tessera_status_writes_total", "Status patches the operator sent.",
                        ["kind", "why"])
MANAGED_QUOTA_WRITES = Counter(
    "tessera_managed_quota_writes_total",
    "Writes to the ResourceQuotas GPUQuotas manage: created, set back (edited by hand, "
    "lost its label, or the GPUQuota changed), released (deleted after its GPUQuota).",
    ["why"])
HOLDER_WRITES = Counter(
    "tessera_growth_holder_writes_total",
    "Growth holders (pods that hold live resizes' growth in the count): created, refused "
    "by the API server's quota admission (no room), deleted.", ["what"])
GROWTH_TAKEN_BACK = Counter(
    "tessera_growth_taken_back_total",
    "Live-resized budgets set back to their pods' limits because their growth could no "
    "longer be held (a holder deleted, no room to hold it again).")
HOLDER_WRITES.labels("created")
HOLDER_WRITES.labels("refused")
HOLDER_WRITES.labels("deleted")
CLAIM_HOLDER_WRITES = Counter(
    "tessera_claim_holder_writes_total",
    "Claim holders (pods that hold DRA claims' capacity in the count): created at a claim's "
    "admission, refused by the API server's quota admission (the claim refused), deleted "
    "once their claim is gone.", ["what"])
CLAIM_HOLDER_WRITES.labels("created")
CLAIM_HOLDER_WRITES.labels("refused")
CLAIM_HOLDER_WRITES.labels("deleted")
WATCHED = Gauge("tessera_watched_objects", "Objects in the operator's caches.", ["kind"])
PLACEMENT_DECISIONS = Counter(
    "tessera_placement_filters_total",
    "Filter answers of the placement service: placed (a node and units reserved) or unplaced "
    "(no node holds the pod; the scheduler shows why).", ["outcome"])
PLACEMENT_BINDS = Counter(
    "tessera_placement_binds_total",
    "Bind answers of the placement service: bound, refused (the node no longer holds the pod) "
    "or failed (the Binding was not written).", ["outcome"])
PLACEMENT_SECONDS = Histogram(
    "tessera_placement_seconds", "Time the placement service took to answer a verb.", ["verb"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
PLACEMENT_FORWARDED = Counter(
    "tessera_placement_forwarded_total",
    "Extender calls this replica forwarded to the Lease holder.", ["outcome"])
PLACEMENT_ON_DEMAND = Counter(
    "tessera_placement_mig_instances_asked_total",
    "MIG instances the placement service asked node daemons to make for pods no instance "
    "could hold (migMode OnDemand).")
PLACEMENT_ON_DEMAND_UNUSED = Counter(
    "tessera_placement_mig_instances_unused_total",
    "MIG instances made for pods that stayed unused while the pod waited for something else, "
    "released (migMode OnDemand).")
PLACEMENT_PREEMPTIONS = Counter(
    "tessera_placement_preemptions_total",
    "Pods the placement service evicted to make unit room for higher-priority pods (where "
    "the scheduler's own preemption, which counts node totals, finds none).")
