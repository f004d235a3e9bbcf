"""Each GPUQuota's ``hard`` and ``used`` as Prometheus gauges, read from the operator's quota
cache when /metrics is scraped (a deleted quota's series end at once; nothing to keep in step).

``tessera_quota_enforced`` (labels ``namespace``, ``quota``): 1 while the API server counts
the quota's GPU pods as it must (its managed ResourceQuota exists, is tessera's and holds its
limits: :func:`tessera_operator.quota.managed.enforcement`), 0 while it does not (the
namespace's GPU pods are refused meanwhile).

``tessera_quota_hard`` and ``tessera_quota_used``, labels ``namespace``, ``quota`` and
``resource``: ``memory`` in bytes, ``cores`` in percent of one GPU, ``pods``, and
``mig/<profile>`` in instances.  ``hard`` has a series only for what the quota limits;
``used`` only once the quota was counted.  A quota whose spec cannot be read has no ``hard``
series (it admits nothing; its Degraded condition says why).  Every replica exports what its
cache holds, so a dashboard takes ``max by (namespace, quota, resource)``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import REGISTRY, Collector

from tessera_operator.quota import managed
from tessera_operator.quota.arith import Limits, Usage
from tessera_operator.quota.objects import view_of

Lookup = Callable[[str, str], Mapping[str, Any] | None]

MIB = 1 << 20
LABELS = ["namespace", "quota", "resource"]


def resources(amounts: Limits | Usage) -> Iterator[tuple[str, float]]:
    """(resource, value) for what is set."""
    for name, value in (("memory", None if amounts.memory_mib is None
                         else amounts.memory_mib * MIB),
                        ("cores", amounts.cores), ("pods", amounts.pods)):
        if value is not None:
            yield name, float(value)
    for profile, n in sorted(amounts.mig.items()):
        yield f"mig/{profile}", float(n)


class QuotaCollector(Collector):
    def __init__(self, quotas: Callable[[], Iterable[Mapping[str, Any]]],
                 counts: Lookup | None = None) -> None:
        self.quotas = quotas
        self.counts = counts

    def collect(self) -> Iterator[GaugeMetricFamily]:
        hard = GaugeMetricFamily("tessera_quota_hard", "A GPUQuota's spec.hard, by resource "
                                 "(memory in bytes, cores in percent of one GPU).", labels=LABELS)
        used = GaugeMetricFamily("tessera_quota_used", "A GPUQuota's status.used (admitted "
                                 "pods' budgets), by resource.", labels=LABELS)
        enforced = GaugeMetricFamily(
            "tessera_quota_enforced", "1 while the API server counts a GPUQuota's GPU pods "
            "(its managed ResourceQuota is there, tessera's, with its limits); 0 while not: "
            "the namespace's GPU pods are refused.", labels=LABELS[:2])
        for obj in list(self.quotas()):
            meta = obj.get("metadata") or {}
            key = [str(meta.get("namespace", "")), str(meta.get("name", ""))]
            view = view_of(obj)
            if self.counts is not None:
                rq = self.counts(key[0], managed.managed_name(key[1]))
                enforced.add_metric(key, float(managed.enforcement(
                    obj, view.readable_limits, rq) is None))
            if view.problem is None:
                for resource, value in resources(view.hard):
                    hard.add_metric([*key, resource], value)
            if view.counted:
                for resource, value in resources(view.used):
                    used.add_metric([*key, resource], value)
        yield hard
        yield used
        if self.counts is not None:
            yield enforced


_registered: QuotaCollector | None = None


def register(quotas: Callable[[], Iterable[Mapping[str, Any]]],
             counts: Lookup | None = None) -> QuotaCollector:
    """Serve these quotas' gauges on the process's /metrics (replacing an earlier source);
    ``counts`` finds a managed ResourceQuota by namespace and name."""
    global _registered
    if _registered is not None:
        REGISTRY.unregister(_registered)
    _registered = QuotaCollector(quotas, counts)
    REGISTRY.register(_registered)
    return _registered
