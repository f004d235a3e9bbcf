"""Idle holders on this node (the I/O around :mod:`tessera.idle`): every audit, each pod's
memory held and SM use from what the audit measured (NVML per process on a GPU; the
ledger's kernel launch count inside a MIG instance), its namespace's GPUQuota ``spec.idle``
read by the daemon itself (never from the pod; at most once a minute per namespace), an
Event ``GPUIdle`` once per idle episode, the gauge ``tessera_pod_gpu_idle_seconds``, and
under ``Evict`` an eviction through the Eviction API (policy/v1: PodDisruptionBudgets
respected; 429 is "not now", retried every audit, with one ``GPUIdleEvictionBlocked``
Event per episode).

Only pods of the registry are judged: containers the device plugin set up on this node, so
only pods on this node, each under its own namespace's quotas; the eviction carries the pod's
UID as a precondition, so a pod recreated under the same name is never the one evicted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from tessera.api.names import GPUQUOTAS, GROUP, NODE_DAEMON, VERSION
from tessera.idle import IdlePolicy, IdleTracker, Use, Verdict, idle_message, pod_use, policy_of
from tessera.kube.client import ApiError, Kube, path
from tessera.kube.events import EventType, post_event
from tessera_node import metrics

log = logging.getLogger("tessera_node.audit.idle")

REASON_IDLE = "GPUIdle"
REASON_EVICTED = "GPUIdleEvicted"
REASON_BLOCKED = "GPUIdleEvictionBlocked"
POLICY_TTL_S = 60.0
"""How long a namespace's idle policy read from its GPUQuotas is used before it is read
again: one list per namespace with GPU pods on this node per minute, served from the API
server's watch cache (``resourceVersion=0``), never etcd."""


@dataclass(frozen=True)
class PodKey:
    namespace: str
    pod: str
    uid: str


@dataclass(frozen=True)
class UnitSample:
    """One container on one GPU or MIG UUID, as the audit measured it."""

    pod: PodKey
    container: str
    unit: str
    memory: int
    nvml_sm: float | None
    """NVML's per-process SM percent summed over its processes (a GPU); None where NVML
    does not say (a MIG instance)."""
    launches: int | None
    """The kernels the container has launched so far, every process's (its ledger, counted by
    libtessera with or without a core budget); None where the ledger cannot be read."""


def sm_uses(samples: Sequence[UnitSample], last_launches: dict[tuple[str, str, str], int]
            ) -> dict[PodKey, list[Use]]:
    """Each pod's uses. A GPU: NVML's figure. Elsewhere: any kernel launched since the last
    audit is use (100), none is 0 once a previous count is known; unknown otherwise (never
    judged idle). ``last_launches`` is updated."""
    out: dict[PodKey, list[Use]] = {}
    seen: dict[tuple[str, str, str], int] = {}
    for s in samples:
        sm: float | None = s.nvml_sm
        if sm is None and s.launches is not None:
            k = (s.pod.uid, s.container, s.unit)
            before = last_launches.get(k)
            seen[k] = s.launches
            if before is not None:
                sm = 0.0 if s.launches == before else 100.0
        out.setdefault(s.pod, []).append(Use(s.memory, sm))
    last_launches.clear()
    last_launches.update(seen)
    return out


class IdleReclaim:
    def __init__(self, kube: Kube, interval_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.kube = kube
        self.clock = clock
        self.tracker: IdleTracker[PodKey] = IdleTracker(max_gap_s=3 * interval_s + 5)
        self._launches: dict[tuple[str, str, str], int] = {}
        self._policies: dict[str, tuple[float, IdlePolicy | None]] = {}
        self._blocked: set[tuple[PodKey, float]] = set()
        self._shown: set[tuple[str, str]] = set()
        self._evicted: set[str] = set()
        """UIDs of pods evicted (terminating): not evicted again."""
        self.last: dict[PodKey, Verdict] = {}

    async def step(self, samples: Sequence[UnitSample]) -> dict[PodKey, Verdict]:
        now = self.clock()
        uses = sm_uses(samples, self._launches)
        inputs = {}
        for pod, u in uses.items():
            memory, sm = pod_use(u)
            inputs[pod] = (memory, sm, await self._policy(pod.namespace, now))
        verdicts = self.tracker.observe(now, inputs)
        self.last = verdicts
        self._gauge(verdicts)
        for pod, v in verdicts.items():
            policy = inputs[pod][2]
            if v.due is None or policy is None:
                continue
            await self._act(pod, v, policy)
        live = {(p, e.since) for p, e in self.tracker.episodes.items()}
        self._blocked &= live
        self._evicted &= {p.uid for p in uses}
        return verdicts

    def _gauge(self, verdicts: Mapping[PodKey, Verdict]) -> None:
        shown = set()
        for pod, v in verdicts.items():
            if v.idle_s > 0:
                metrics.POD_IDLE.labels(pod.namespace, pod.pod).set(v.idle_s)
                metrics.POD_IDLE_MEMORY.labels(pod.namespace, pod.pod).set(v.memory)
                shown.add((pod.namespace, pod.pod))
        for gone in self._shown - shown:
            metrics.POD_IDLE.remove(*gone)
            metrics.POD_IDLE_MEMORY.remove(*gone)
        self._shown = shown

    async def _policy(self, namespace: str, now: float) -> IdlePolicy | None:
        """The namespace's idle policy; None (nothing done) when its quotas cannot be read."""
        got = self._policies.get(namespace)
        if got is not None and now - got[0] < POLICY_TTL_S:
            return got[1]
        try:
            body = await self.kube.list(path(GROUP, VERSION, GPUQUOTAS, namespace),
                                        cached=True)
            policy = policy_of(body.get("items") or [])
        except (ApiError, OSError, TimeoutError) as exc:
            log.warning("idle: cannot read GPUQuotas", extra={
                "namespace": namespace, "error": str(exc)[:300]})
            policy = None
        self._policies[namespace] = (now, policy)
        return policy

    async def _act(self, pod: PodKey, v: Verdict, policy: IdlePolicy) -> None:
        if policy.action == "Report":
            if v.new:
                metrics.IDLE_ACTIONS.labels("Report", "reported").inc()
                await self._event(pod, REASON_IDLE,
                                  idle_message(v, policy, "reported only"), "Normal")
            return
        if pod.uid in self._evicted:
            return
        if v.new:
            await self._event(pod, REASON_IDLE, idle_message(v, policy, "evicting it"),
                              "Warning")
        result = await self._evict(pod)
        metrics.IDLE_ACTIONS.labels("Evict", result).inc()
        ep = self.tracker.episodes.get(pod)
        if result in ("evicted", "gone"):
            self._evicted.add(pod.uid)
        if result == "evicted":
            log.info("idle pod evicted", extra={"pod": f"{pod.namespace}/{pod.pod}"})
            await self._event(pod, REASON_EVICTED, idle_message(v, policy, "evicted"),
                              "Warning")
        elif result == "blocked" and ep is not None and (pod, ep.since) not in self._blocked:
            self._blocked.add((pod, ep.since))
            await self._event(pod, REASON_BLOCKED, idle_message(
                v, policy, "eviction refused now (a PodDisruptionBudget allows no "
                           "disruption): retried every audit while it stays idle"), "Warning")

    async def _evict(self, pod: PodKey) -> str:
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": pod.pod, "namespace": pod.namespace},
                "deleteOptions": {"preconditions": {"uid": pod.uid}}}
        metrics.API_WRITES.labels("eviction").inc()
        try:
            await self.kube.create(path("", "v1", "pods", pod.namespace, pod.pod, "eviction"),
                                   body)
        except ApiError as exc:
            if exc.status == 429:
                return "blocked"
            if exc.status in (404, 409):  # gone, or another pod under that name now
                return "gone"
            log.warning("idle: eviction failed", extra={
                "pod": f"{pod.namespace}/{pod.pod}", "error": str(exc)[:300]})
            return "failed"
        except (OSError, TimeoutError) as exc:
            log.warning("idle: eviction failed", extra={
                "pod": f"{pod.namespace}/{pod.pod}", "error": str(exc)[:300]})
            return "failed"
        return "evicted"

    async def _event(self, pod: PodKey, reason: str, message: str,
                     type_: EventType) -> None:
        obj = {"metadata": {"name": pod.pod, "namespace": pod.namespace, "uid": pod.uid}}
        metrics.API_WRITES.labels("event").inc()
        await post_event(self.kube, obj, "v1", "Pod", reason, message, type_, NODE_DAEMON)
