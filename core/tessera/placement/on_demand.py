"""MIG on demand on the device-plugin path: which instances to make for the pods that no
existing instance can hold (pure; the operator's leader turns the answer into each
GPUPartition's ``status.demand``, and each node daemon makes what is asked of its GPUs).

A pod asking ``tessera.dev/mig-<profile>`` is placed on a free instance of that profile by
the placement service, like any other. When there is none on any node the pod may run on,
and a GPU of a partition with ``migMode: OnDemand`` can take one beside its instances, one
is made there for the pod; once the node advertises it, the scheduler places the pod on it.

:func:`plan` decides, every round, from scratch but keeping what earlier rounds asked:

1. An instance asked for a pod that is still pending stays asked while it can still be
   made where it was asked (or exists there, free): decisions are stable, so a round never
   moves an instance a node daemon may be making.
2. Pods are then taken oldest first. Of the nodes the pod may run on (its selector,
   affinity, taints: :mod:`tessera.placement.eligibility`), with GPUs its policy allows,
   the pod's instances go where it needs the **fewest new** ones: free instances of its
   profiles are used first (one pod's free instance is not counted again for the next); the
   rest are added by :func:`tessera.mig.ondemand.choose` on that node's on-demand GPUs
   within their partition's bounds (``onDemand.profiles``, ``onDemand.maxInstances``, and
   ``onDemand.keepWhole``: while a partition has no more empty GPUs on the node than it
   keeps, those take a whole-GPU instance only).
   Among nodes needing as many, the one whose free room shrinks least (usable memory
   slices, as ``choose`` ranks), then the lowest name. All of a pod's instances are on one
   node: a pod runs on one node.
3. A pod that needs no new instance, or that no node can serve, gets nothing.

:func:`plan` answers for the pods still waiting; the operator keeps, besides, what was asked
for a pod that is bound but not started (until the kubelet has allocated the instance). An
asked instance is dropped once its pod runs (the kubelet's allocation and its placement
record then hold it), is deleted or ends; the node daemon destroys an instance no pod holds
and nothing asks once it has been idle a while.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from tessera.dra.partitions import Bounds, kept_whole
from tessera.mig.catalog import UnknownProfileError, profile
from tessera.mig.ondemand import Choice, candidates, choose, room_change
from tessera.mig.planner import Instance
from tessera.placement.units import Unit


@dataclass(frozen=True)
class OnDemandGpu:
    """A GPU of a partition with ``migMode: OnDemand``, on a node running the device plugin
    (its inventory says so), with the instances it has now."""

    node: str
    uuid: str
    index: int
    model: str
    partition: str
    bounds: Bounds
    instances: tuple[tuple[str, int], ...] = ()
    """(profile, start) of each instance present."""

    def allows(self, profile_name: str) -> bool:
        if self.bounds.profiles and profile_name not in self.bounds.profiles:
            return False
        try:
            profile(self.model, profile_name)
        except UnknownProfileError:
            return False
        return True


@dataclass(frozen=True)
class WantedInstance:
    """An instance asked of a node daemon: ``profile`` at slot ``start`` of GPU ``gpu``
    (UUID) on ``node``, for pod ``pod`` (``namespace/name``, UID ``pod_uid``)."""

    node: str
    gpu: str
    gpu_index: int
    profile: str
    start: int
    pod: str
    pod_uid: str
    partition: str = ""

    @property
    def placement(self) -> tuple[str, str, int]:
        return (self.gpu, self.profile, self.start)


@dataclass(frozen=True)
class PendingPod:
    """A pod the scheduler found no room for, with what it asks."""

    key: str
    uid: str
    profiles: tuple[str, ...]
    """One profile name per whole MIG instance it asks (``mig-<profile>: 2`` twice)."""
    may_run_on: Callable[[str], bool] = field(default=lambda _node: True)
    """Whether its selector, affinity and tolerations let it onto a node."""
    allows: Callable[[str, str], bool] = field(default=lambda _model, _gpu: True)
    """Whether its policy allows a GPU (model, UUID): ``tessera.dev/gpu-models`` and the
    exclusions."""


@dataclass
class _Fleet:
    """The on-demand GPUs as this round leaves them: present instances plus those asked."""

    gpus: dict[str, OnDemandGpu]
    layout: dict[str, list[tuple[str, int]]]

    @classmethod
    def of(cls, gpus: Sequence[OnDemandGpu]) -> _Fleet:
        return cls({g.uuid: g for g in gpus}, {g.uuid: list(g.instances) for g in gpus})

    def has_room(self, gpu: OnDemandGpu, profile_name: str) -> bool:
        """Its bounds allow one more ``profile_name`` (``onDemand.profiles``,
        ``maxInstances``)."""
        limit = gpu.bounds.max_instances
        return gpu.allows(profile_name) and (limit is None
                                             or len(self.layout[gpu.uuid]) < limit)

    def can_add(self, gpu: OnDemandGpu, profile_name: str, start: int) -> bool:
        return self.has_room(gpu, profile_name) and start in candidates(
            gpu.model, _placed(self.layout[gpu.uuid]), profile_name)

    def choose_on(self, gpus: Sequence[OnDemandGpu], profile_name: str
                  ) -> tuple[tuple[int, ...], OnDemandGpu, int] | None:
        """The best place among ``gpus`` (each with room under its bounds), and the change
        of its room, by :func:`tessera.mig.ondemand.choose` per model."""
        best: tuple[tuple[int, ...], OnDemandGpu, int] | None = None
        by_model: dict[str, list[OnDemandGpu]] = {}
        kept = kept_whole([(g.uuid, g.bounds, not self.layout[g.uuid]) for g in gpus])
        for g in gpus:
            if g.uuid in kept:  # kept for whole-GPU work: a whole-GPU instance only
                whole = g.bounds.whole_only(g.model)
                if whole is None or profile_name not in whole.profiles:
                    continue
            if self.has_room(g, profile_name):
                by_model.setdefault(g.model, []).append(g)
        for model, group in sorted(by_model.items()):
            fleet = [(g.uuid, _placed(self.layout[g.uuid])) for g in group]
            got: Choice[str] | None = choose(model, fleet, profile_name)
            if got is None:
                continue
            gpu = self.gpus[got.gpu]
            change = room_change(model, _placed(self.layout[gpu.uuid]), profile_name,
                                 got.start)
            key = (change[0], int(bool(self.layout[gpu.uuid])))
            if best is None or key > best[0]:
                best = (key, gpu, got.start)
        return best

    def add(self, gpu: str, profile_name: str, start: int) -> None:
        self.layout[gpu].append((profile_name, start))


def _placed(layout: Sequence[tuple[str, int]]) -> list[Instance]:
    return [Instance(p, s) for p, s in layout]


def _unit_key(u: Unit) -> tuple[str, str, int]:
    return (u.gpu_uuid, u.profile or "", u.start if u.start is not None else -1)


def plan(pending: Sequence[PendingPod], gpus: Sequence[OnDemandGpu],
         free: Mapping[str, Sequence[Unit]], previous: Sequence[WantedInstance],
         held: Collection[tuple[str, str, int]] = ()) -> list[WantedInstance]:
    """The instances to ask of the nodes now (rules in the module's docstring).

    ``pending``: oldest first. ``free``: per node, its free healthy whole MIG units (no pod
    holds or is reserved them), those made for a pod but not yet placed included.
    ``previous``: what the last round asked. ``held``: (GPU UUID, profile, start) of the
    units pods hold or are reserved: an instance asked for a pod that another pod took is
    asked anew; one made but not advertised yet (neither free nor held) stays asked."""
    fleet = _Fleet.of(gpus)
    by_pod = {p.uid: p for p in pending}
    free_left = {n: list(us) for n, us in free.items()}
    present = {(g.uuid, p, s) for g in gpus for p, s in g.instances}
    out: list[WantedInstance] = []
    kept: dict[str, list[WantedInstance]] = {}

    # 1. what earlier rounds asked for pods still pending, where it still stands
    for w in previous:
        pod = by_pod.get(w.pod_uid)
        gpu = fleet.gpus.get(w.gpu)
        if pod is None or gpu is None or gpu.node != w.node or not pod.may_run_on(w.node):
            continue
        if w.placement in present:
            if w.placement in held:
                continue  # another pod holds it now: this pod needs another
            unit = next((u for u in free_left.get(w.node, ()) if _unit_key(u) == w.placement),
                        None)
            if unit is not None:  # else not advertised yet: it is still this pod's
                free_left[w.node].remove(unit)
        elif fleet.can_add(gpu, w.profile, w.start):
            fleet.add(gpu.uuid, w.profile, w.start)
        else:
            continue
        kept.setdefault(w.pod_uid, []).append(w)

    # 2. the rest, oldest pod first
    for pod in pending:
        mine = kept.get(pod.uid, [])
        needs = Counter(pod.profiles)
        needs.subtract(Counter(w.profile for w in mine))
        if any(n < 0 for n in needs.values()):  # asks fewer than before: keep what fits
            mine = _trim(mine, Counter(pod.profiles))
            needs = Counter(pod.profiles)
            needs.subtract(Counter(w.profile for w in mine))
        needs = +needs
        if not needs:
            out.extend(mine)
            continue
        nodes = {mine[0].node} if mine else _nodes(pod, gpus, free_left)
        best: tuple[tuple[int, int], str, list[Unit], list[WantedInstance]] | None = None
        for node in sorted(nodes):
            got = _on_node(pod, node, needs, gpus, free_left, fleet)
            if got is None:
                continue
            taken, made, slices = got
            key = (-len(made), slices)
            # fewest new instances, then the least room lost, then the lowest name (the
            # first of the sorted nodes keeps a tie)
            if best is None or key > best[0]:
                best = (key, node, taken, made)
        if best is None:
            continue  # nothing can hold it now: it waits, as the scheduler says
        _, node, taken, made = best
        for u in taken:
            free_left[node].remove(u)
        for w in made:
            fleet.add(w.gpu, w.profile, w.start)
        out.extend(mine)
        out.extend(made)
    return out


def _trim(mine: list[WantedInstance], asks: Counter[str]) -> list[WantedInstance]:
    left = Counter(asks)
    out = []
    for w in mine:
        if left[w.profile] > 0:
            left[w.profile] -= 1
            out.append(w)
    return out


def _nodes(pod: PendingPod, gpus: Sequence[OnDemandGpu],
           free: Mapping[str, Sequence[Unit]]) -> set[str]:
    return {n for n in {g.node for g in gpus} | set(free) if pod.may_run_on(n)}


def _on_node(pod: PendingPod, node: str, needs: Counter[str], gpus: Sequence[OnDemandGpu],
             free: Mapping[str, Sequence[Unit]], fleet: _Fleet
             ) -> tuple[list[Unit], list[WantedInstance], int] | None:
    """What the pod's ``needs`` take on ``node``: free units, then new instances (and the
    usable memory slices they cost); None when the node cannot serve them all."""
    left = Counter(needs)
    taken: list[Unit] = []
    for u in free.get(node, ()):
        if u.profile is not None and left[u.profile] > 0 and pod.allows(u.model, u.gpu_uuid):
            left[u.profile] -= 1
            taken.append(u)
    mine = [g for g in gpus if g.node == node and pod.allows(g.model, g.uuid)]
    trial = _Fleet(fleet.gpus, {k: list(v) for k, v in fleet.layout.items()})
    made: list[WantedInstance] = []
    slices = 0
    for name in sorted(left.elements()):
        got = trial.choose_on(mine, name)
        if got is None:
            return None
        (lost, _), gpu, start = got
        slices += lost
        trial.add(gpu.uuid, name, start)
        made.append(WantedInstance(node, gpu.uuid, gpu.index, name, start, pod.key, pod.uid,
                                   gpu.partition))
    return taken, made, slices
