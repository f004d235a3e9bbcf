"""The leader's placement decisions: filter, bind and preempt for kube-scheduler.

**Filter** decides: for each node the scheduler found feasible, :func:`tessera.placement.
choose.place` says whether one GPU or MIG instance holds each container's budget, given
what is placed there (the pods' records), what this leader has reserved and not seen bound
yet, and what the node's daemon confirmed for pods bound without a record. Nodes are tried
in the node policy's order of how full they are (``binpack``: the fullest first, ``spread``:
the emptiest; then by name), and the first that holds the pod is the answer: **one** node
(the scheduler binds where tessera decided), and the chosen units are reserved for the
pod at once, so the next pod's filter (the scheduler runs them one after the other while earlier
pods are still binding) never counts the same room twice. Every other node gets the reason
the pod does not fit there, which the scheduler shows in ``FailedScheduling``.

**Bind** records the choice and binds in one write: a Binding whose annotations carry
``tessera.dev/placement`` (the API server copies them onto the pod with ``spec.nodeName``).
There is no node lock: two pods bind on one node at once, each on its own reserved units.

**Preempt** names, per node the scheduler proposes, the fewest lower-priority pods whose
units the pod needs (:func:`tessera.placement.preemption.victims`).

A reservation the scheduler never binds (a later plugin refused the pod) lapses after
``reserve_s``; a bound one stays until the pod watch shows the record; either goes at once
when the pod is deleted.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tessera.api.names import ANNOTATION_PLACEMENT
from tessera.kube.client import ApiError, Kube, path
from tessera.placement import record as record_
from tessera.placement.choose import Fit, NoFit, place
from tessera.placement.demand import Demand, DemandError, pod_demands
from tessera.placement.policy import DEFAULT, Policy, PolicyError, parse
from tessera.placement.preemption import victims
from tessera.placement.usage import Placed, UnitUsage, usage
from tessera_operator import metrics
from tessera_operator.placement.cache import NodeView, PlacementCache, pod_requests

log = logging.getLogger("tessera.placement")


@dataclass
class Reservation:
    placed: Placed
    until: float
    bound: bool = False
    victims: tuple[str, ...] = ()
    """UIDs of the pods evicted to make this room (a nomination): until they are gone the
    pod waits, and no one else is evicted for it."""


@dataclass(frozen=True)
class FilterResult:
    nodes: tuple[str, ...] = ()
    failed: Mapping[str, str] = field(default_factory=dict)
    unresolvable: Mapping[str, str] = field(default_factory=dict)


@dataclass
class PlacementService:
    cache: PlacementCache
    kube: Kube
    default: Policy = DEFAULT
    reserve_s: float = 30.0
    """How long a filter's reservation waits for the scheduler's bind."""
    bound_s: float = 120.0
    """How long a bound pod's reservation waits for the pod watch to show its record."""
    reservations: dict[str, Reservation] = field(default_factory=dict)
    """By pod UID."""
    clock: Any = time.monotonic
    _used: dict[str, tuple[int, NodeView, dict[str, UnitUsage], float]] = field(
        default_factory=dict)
    evict: Callable[[str, Sequence[Placed]], None] | None = None
    """Evicts pods for a pod (its key) the filter preempted for; None: filter never
    preempts (only the scheduler's preemption with :meth:`preempt`)."""

    # -- the state a decision sees ------------------------------------------------------

    def _expire(self) -> None:
        now = self.clock()
        for uid, r in list(self.reservations.items()):
            seen = self.cache.pods.get(uid)
            if (r.until < now or uid in self.cache.deleted
                    or (r.bound and seen is not None and seen.placed is not None)):
                self._unreserve(uid)

    def _reserve(self, uid: str, r: Reservation) -> None:
        self._unreserve(uid)
        self.reservations[uid] = r
        self.cache.bump(r.placed.node)

    def _unreserve(self, uid: str) -> Reservation | None:
        r = self.reservations.pop(uid, None)
        if r is not None:
            self.cache.bump(r.placed.node)
        return r

    def forget(self) -> None:
        """Every reservation dropped (this replica no longer leads)."""
        for uid in list(self.reservations):
            self._unreserve(uid)

    def view_of(self, name: str) -> tuple[NodeView, dict[str, UnitUsage], float] | None:
        """A node, what is used on it (every pod's records and reservations) and how full
        it is (memory held over memory), computed once per version of the node."""
        view = self.cache.nodes.get(name)
        if view is None:
            return None
        version = self.cache.versions.get(name, 0)
        known = self._used.get(name)
        if known is not None and known[0] == version and known[1] is view:
            return view, known[2], known[3]
        used = self.used(view, self.placed_on(name))
        full = fullness(view, used)
        self._used[name] = (version, view, used, full)
        return view, used, full

    def placed_on(self, node: str, without: str = "") -> list[Placed]:
        """What holds units on ``node``: the pods' records and this leader's reservations
        (a pod's reservation replaces what the watch has of it), except pod ``without``."""
        out: dict[str, Placed] = {}
        for p in self.cache.holding(node):
            if p.placed is not None and p.uid != without:
                out[p.uid] = p.placed
        for uid, r in self.reservations.items():
            if r.placed.node == node and uid != without:
                out[uid] = r.placed
        return list(out.values())

    def used(self, view: NodeView, placed: Sequence[Placed]) -> dict[str, UnitUsage]:
        """Usage by records and reservations, plus, on a node where a pod bound without a
        record holds units, what the daemon confirmed on a unit beyond what the records
        there explain. (Only then: the daemon's figures trail the pods by its confirmation
        round and its Node write, and a unit a deleted pod left would look held.)"""
        out = usage(view.units, placed)
        if not any(p.placed is None for p in self.cache.holding(view.name)):
            return out
        whole_units = {u.uuid for u in view.units if u.shares == 0}
        for uuid, mib in view.committed_mib.items():
            u = out.get(uuid)
            if u is None:
                continue
            extra_mib = mib - u.memory_mib
            extra_n = view.committed_containers.get(uuid, 0) - len(u.holders)
            if extra_mib > 0 or extra_n > 0:
                out[uuid] = UnitUsage(
                    memory_mib=u.memory_mib + max(extra_mib, 0), cores=u.cores,
                    shares=u.shares + max(extra_n, 0),
                    whole=u.whole or (uuid in whole_units and extra_n > 0),
                    holders=u.holders)
        return out

    # -- the verbs ------------------------------------------------------------------------

    def filter(self, pod: Mapping[str, Any], node_names: Sequence[str]) -> FilterResult:
        self._expire()
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        try:
            demands = pod_demands(pod)
            policy = parse(meta.get("annotations") or {}, self.default)
        except (DemandError, PolicyError) as exc:
            return FilterResult(unresolvable={n: str(exc) for n in node_names})
        if not demands:
            return FilterResult(nodes=tuple(node_names))
        nominated = self._unreserve(uid)
        failed: dict[str, str] = {}
        if nominated is not None and nominated.victims:
            left = [v for v in nominated.victims if v in self.cache.pods]
            if left:  # the room is being made: wait for it, evict no one else
                self._reserve(uid, nominated)
                node = nominated.placed.node
                return FilterResult(failed={n: (
                    f"{n}: waiting for {len(left)} preempted pod(s) to end"
                    if n == node else f"{n}: the pod is nominated to {node}")
                    for n in node_names})
        unresolvable: dict[str, str] = {}
        candidates: list[tuple[float, str, NodeView, dict[str, UnitUsage]]] = []
        for name in node_names:
            known = self.view_of(name)
            if known is None:
                unresolvable[name] = f"{name}: no tessera GPU inventory"
            elif known[0].error is not None:
                unresolvable[name] = f"{name}: {known[0].error}"
            else:
                view, used, full = known
                candidates.append((-full if policy.node == "binpack" else full, name, view,
                                   used))
        best: tuple[str, Fit] | None = None
        for _, name, view, used in sorted(candidates, key=lambda c: (c[0], c[1])):
            got = place(name, demands, view.units, used, policy)
            if isinstance(got, NoFit):
                (unresolvable if got.unresolvable else failed)[name] = f"{name}: {got.reason}"
                continue
            best = (name, got)  # the first in the node policy's order that holds the pod
            break
        if best is None:
            metrics.PLACEMENT_DECISIONS.labels("unplaced").inc()
            if self.evict is not None:
                self._preempt_in_filter(pod, demands, policy, failed)
            return FilterResult(failed=failed, unresolvable=unresolvable)
        name, fit = best
        self._reserve(uid, Reservation(self._placed(pod, demands, fit),
                                       self.clock() + self.reserve_s))
        metrics.PLACEMENT_DECISIONS.labels("placed").inc()
        return FilterResult(nodes=(name,), failed=failed, unresolvable=unresolvable)

    def _totals_fit(self, view: NodeView, pod: Mapping[str, Any]) -> bool:
        """Whether the scheduler's own fit (the Node's allocatable less the requests of the
        pods bound there) holds the pod: then its preemption finds no victim on this node
        (it removes pods only while the totals do not fit) and cannot make unit room."""
        want = pod_requests(pod)
        used: dict[str, int] = {}
        for p in self.cache.holding(view.name):
            for k, v in p.requests.items():
                used[k] = used.get(k, 0) + v
        return all(view.allocatable.get(k, 0) - used.get(k, 0) >= v for k, v in want.items())

    def _preempt_in_filter(self, pod: Mapping[str, Any], demands: Sequence[Demand],
                           policy: Policy, failed: dict[str, str]) -> None:
        """Unit room only lower-priority pods hold, on a node whose totals already hold the
        pod (kube-scheduler's preemption removes pods only while totals do not fit, so it
        finds none there): evict the fewest, and hold the room for the pod meanwhile."""
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        priority = int((pod.get("spec") or {}).get("priority") or 0)
        best: tuple[tuple[int, int, str], str, list[Placed]] | None = None
        for name in failed:
            view = self.cache.nodes.get(name)
            if view is None or view.error is not None or not self._totals_fit(view, pod):
                continue
            chosen = victims(name, priority, demands, view.units, self.placed_on(name, uid),
                             policy)
            if not chosen:
                continue
            key = (len(chosen), max(p.priority for p in chosen), name)
            if best is None or key < best[0]:
                best = (key, name, chosen)
        if best is None:
            return
        _, name, chosen = best
        view = self.cache.nodes[name]
        gone = {p.uid for p in chosen}
        got = place(name, demands, view.units,
                    self.used(view, [p for p in self.placed_on(name, uid) if p.uid not in gone]),
                    policy)
        if not isinstance(got, Fit):
            return
        self._reserve(uid, Reservation(self._placed(pod, demands, got),
                                       self.clock() + self.bound_s, victims=tuple(gone)))
        failed[name] = (f"{name}: preempting {len(chosen)} lower-priority pod(s) "
                        f"({', '.join(p.key for p in chosen)}) for this pod")
        assert self.evict is not None
        self.evict(f"{meta.get('namespace')}/{meta.get('name')}", chosen)
        metrics.PLACEMENT_PREEMPTIONS.inc(len(chosen))

    def _placed(self, pod: Mapping[str, Any], demands: Sequence[Demand], fit: Fit) -> Placed:
        meta = pod.get("metadata") or {}
        return Placed(key=f"{meta.get('namespace')}/{meta.get('name')}",
                      uid=str(meta.get("uid", "")),
                      priority=int((pod.get("spec") or {}).get("priority") or 0),
                      node=fit.record.node, record=fit.record, demands=tuple(demands))

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Bind the pod to ``node`` with its placement recorded; '' or the error."""
        self._expire()
        r = self.reservations.get(uid)
        if r is None or r.placed.node != node:
            got = await self._place_now(namespace, name, uid, node)
            if isinstance(got, str):
                metrics.PLACEMENT_BINDS.labels("refused").inc()
                return got
            r = got
        r.until = self.clock() + self.bound_s
        r.bound = True
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid,
                             "annotations": {ANNOTATION_PLACEMENT:
                                             record_.dumps(r.placed.record)}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        try:
            await self.kube.create(path("", "v1", "pods", namespace, name) + "/binding", body)
        except (ApiError, OSError, TimeoutError) as exc:
            self._unreserve(uid)
            metrics.PLACEMENT_BINDS.labels("failed").inc()
            log.warning("binding failed", extra={"pod": f"{namespace}/{name}", "node": node,
                                                 "error": str(exc)[:300]})
            return f"binding {namespace}/{name} to {node}: {exc}"
        metrics.PLACEMENT_BINDS.labels("bound").inc()
        return ""

    async def _place_now(self, namespace: str, name: str, uid: str,
                         node: str) -> Reservation | str:
        """A bind with no reservation on that node (this replica took the Lease since the
        filter, or the scheduler chose another node): decide now, from the pod as it is."""
        try:
            pod = await self.kube.get(path("", "v1", "pods", namespace, name))
        except (ApiError, OSError, TimeoutError) as exc:
            return f"reading pod {namespace}/{name}: {exc}"
        if str((pod.get("metadata") or {}).get("uid")) != uid:
            return f"pod {namespace}/{name} is not the one the scheduler binds (uid {uid})"
        view = self.cache.nodes.get(node)
        if view is None or view.error is not None:
            return f"{node}: {view.error if view else 'no tessera GPU inventory'}"
        try:
            demands = pod_demands(pod)
            policy = parse((pod.get("metadata") or {}).get("annotations") or {}, self.default)
        except (DemandError, PolicyError) as exc:
            return str(exc)
        got = place(node, demands, view.units, self.used(view, self.placed_on(node, uid)),
                    policy)
        if isinstance(got, NoFit):
            return f"{node}: {got.reason}"
        r = Reservation(self._placed(pod, demands, got), self.clock() + self.bound_s)
        self._reserve(uid, r)
        return r

    def preempt(self, pod: Mapping[str, Any], proposed: Sequence[str]) -> dict[str, list[str]]:
        """Per proposed node, the UIDs of the fewest lower-priority pods to evict; nodes
        where no such set makes room are left out."""
        self._expire()
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        priority = int((pod.get("spec") or {}).get("priority") or 0)
        try:
            demands = pod_demands(pod)
            policy = parse(meta.get("annotations") or {}, self.default)
        except (DemandError, PolicyError):
            return {}
        out: dict[str, list[str]] = {}
        for name in proposed:
            view = self.cache.nodes.get(name)
            if view is None or view.error is not None:
                continue
            chosen = victims(name, priority, demands, view.units,
                             self.placed_on(name, uid), policy)
            if chosen:  # an empty list would fail the scheduler's whole preemption
                out[name] = [p.uid for p in chosen]
        return out


def fullness(view: NodeView, used: Mapping[str, UnitUsage]) -> float:
    """How full a node is: the memory budgeted on its shared units and the memory of its
    held whole instances, over all its units' memory (0 to 1)."""
    total = filled = 0
    for u in view.units:
        total += u.memory_mib
        got = used.get(u.uuid)
        if got is None:
            continue
        if u.shared:
            filled += min(u.memory_mib, got.memory_mib)
        elif not got.free:
            filled += u.memory_mib
    return filled / total if total else 0.0
