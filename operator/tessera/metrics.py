"""Prometheus metrics of the operator process (served on /metrics with /healthz): admission,
reservations and the leader's loops, all named here so dashboards and alerts have one list."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

ADMISSION_SECONDS = Histogram(
    "tessera_admission_seconds", "Time to answer one admission review.", ["webhook", "result"],
    buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1,
             2.5))
QUOTA_WRITE_SECONDS = Histogram(
    "tessera_quota_write_seconds",
    "One GPUQuota status write by admission (API server round trip), conflicts included.",
    buckets=(0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5, 1))
RESERVATION_CONFLICTS = Counter(
    "tessera_quota_reservation_conflicts_total",
    "GPUQuota status writes that lost a resourceVersion race and were retried.")
IS_LEADER = Gauge("tessera_leader", "1 while this replica holds the leader Lease.")
STATUS_WRITES = Counter("tessera_status_writes_total", "Status patches the operator sent.",
                        ["kind", "why"])
RECOUNT_HEALS = Counter("tessera_quota_recount_heals_total",
                        "Times a recount corrected GPUQuota status.used.")
RELEASES = Counter("tessera_quota_releases_total", "Pod budgets given back to GPUQuotas.")
WATCHED = Gauge("tessera_watched_objects", "Objects in the operator's caches.", ["kind"])
RESERVATION_BATCH = Histogram(
    "tessera_quota_reservation_batch_size", "Reservations written in one GPUQuota update.",
    buckets=(1, 2, 4, 8, 16, 32, 64))
FORWARDED = Counter(
    "tessera_quota_reservations_forwarded_total",
    "Reservations a non-leader replica handed to the leader (forwarded) or, the leader being "
    "unreachable, made itself (fallback).", ["outcome"])
