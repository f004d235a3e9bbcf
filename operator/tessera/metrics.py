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
    "Writes to the ResourceQuotas GPUQuotas manage: created, set back (edited by hand or "
    "the GPUQuota changed), lowered (a live resize grew a budget).", ["why"])
WATCHED = Gauge("tessera_watched_objects", "Objects in the operator's caches.", ["kind"])
