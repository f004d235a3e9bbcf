"""MIG on demand for pods (the device-plugin path), the rules (pure): which instances the
operator asks of this node are made, and which that no pod holds or needs are destroyed once
idle a while.

The operator's placement service writes what it asks into each GPUPartition's
``status.demand`` (:mod:`tessera.placement.on_demand`: one instance per pending pod that no
instance can hold, at a GPU and start slot it chose). Only the operator may write a
partition's status, and an entry is honoured only on a GPU that partition owns here in
``migMode: OnDemand``, for a profile its bounds allow, at a start the GPU can take beside its
instances: whatever the entry says, nothing else is touched.

:func:`decide` (pure) says what to do on each pass:

* **make** each asked instance that is not there (or lacks its compute instance);
* **destroy** an instance of an on-demand GPU that nothing asks and nothing holds (no pod's
  placement record or kubelet allocation names it, no process runs on it) once it has been
  so for ``idle_s`` (the operator keeps an entry until its pod runs, so a pod being bound or
  admitted keeps its instance; the grace covers what the watches have not shown yet).

On a DRA node nothing is asked (the kubelet plugin makes a claim's instance at prepare) and
"held" is a prepared claim's: what is destroyed there is what no claim has, once the runner
has also found no claim allocated it.

:class:`tessera_node.layout.instances.DemandRunner` carries the work out in a thread,
through its ``InstanceMaker`` (the GPU's host lock, the command log, crash safety). An instance
to destroy is withdrawn from what the device plugin advertises first, and is checked again,
under the lock, right before the commands: a pod placed on it meanwhile keeps it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tessera.api.partition import demand_of
from tessera.dra.partitions import kept_whole
from tessera.mig.catalog import UnknownProfileError, profile
from tessera.mig.ondemand import candidates
from tessera.mig.planner import LayoutError
from tessera_node.device.state import DeviceSnapshot, GPUState, MigInstanceState, model_of
from tessera_node.layout.desired import GPUTarget

IDLE_S = 30.0
"""How long an instance nothing asks or holds stays before it is destroyed."""


@dataclass(frozen=True)
class MadeInstance:
    """A MIG instance made on demand: on GPU ``gpu`` (its UUID), ``profile`` at ``start``."""

    gpu: int
    gpu_uuid: str
    profile: str
    start: int

    def to_json(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "gpuUUID": self.gpu_uuid, "profile": self.profile,
                "start": self.start}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MadeInstance:
        return cls(int(data["gpu"]), str(data["gpuUUID"]), str(data["profile"]),
                   int(data["start"]))

    def __str__(self) -> str:
        return f"{self.profile} at slot {self.start} of GPU {self.gpu}"


def instance_at(gpu: GPUState, inst: MadeInstance) -> MigInstanceState | None:
    """The instance of ``gpu`` at ``inst``'s placement (profile and start), if any."""
    return next((i for i in gpu.instances
                 if (i.profile, i.start) == (inst.profile, inst.start)), None)


@dataclass(frozen=True)
class Asked:
    """An instance the operator asks of this node for a pod."""

    instance: MadeInstance
    pod: str
    partition: str


def asked_of(partitions: Iterable[Mapping[str, Any]], node: str) -> list[Asked]:
    """Every ``status.demand`` entry for ``node``."""
    return [Asked(MadeInstance(d.gpu_index, d.gpu, d.profile, d.start), d.pod, name)
            for name, d in demand_of(partitions) if d.node == node]


@dataclass(frozen=True)
class Work:
    make: tuple[Asked, ...] = ()
    destroy: tuple[MadeInstance, ...] = ()
    refused: tuple[str, ...] = ()
    """Why asked instances are not made (logged once each)."""

    def __bool__(self) -> bool:
        return bool(self.make or self.destroy)


def place_of(i: MadeInstance) -> tuple[str, str, int]:
    """(GPU UUID, profile, start): an instance's identity across reads."""
    return (i.gpu_uuid, i.profile, i.start)


def _why_not(a: Asked, gpu: GPUState | None, target: GPUTarget | None,
             present: Sequence[MigInstanceState], kept: bool) -> str | None:
    i = a.instance
    if gpu is None or target is None or target.on_demand is None:
        return f"{i} for {a.pod}: not a GPU of this node in migMode OnDemand"
    if target.partition != a.partition:
        return f"{i} for {a.pod}: GPU {gpu.index} is partition {target.partition}'s"
    if gpu.mig_mode != "enabled" or gpu.mig_pending:
        return None  # the plan enables MIG first; asked again after that
    bounds = target.on_demand
    if bounds.profiles and i.profile not in bounds.profiles:
        return f"{i} for {a.pod}: {a.partition} does not allow {i.profile}"
    if bounds.max_instances is not None and len(present) >= bounds.max_instances:
        return f"{i} for {a.pod}: {a.partition} allows at most {bounds.max_instances}"
    model = model_of(gpu)
    if model is None:
        return f"{i} for {a.pod}: GPU {gpu.index} is of a model tessera does not know"
    whole = bounds.whole_only(model.id) if kept else bounds
    if whole is None or (kept and i.profile not in whole.profiles):
        return (f"{i} for {a.pod}: GPU {gpu.index} is kept for whole-GPU work "
                f"({a.partition}'s keepWhole)")
    try:
        profile(model.id, i.profile)
        if i.start not in candidates(model.id, present, i.profile):
            return f"{i} for {a.pod}: slot {i.start} is not free for {i.profile}"
    except (UnknownProfileError, LayoutError, KeyError, ValueError) as exc:
        return f"{i} for {a.pod}: {exc}"
    return None


def decide(snapshot: DeviceSnapshot, targets: Mapping[str, GPUTarget], asked: Sequence[Asked],
           held: Callable[[MigInstanceState], bool], idle_since: dict[tuple[str, str, int],
                                                                    float],
           now: float, idle_s: float = IDLE_S) -> Work:
    """What to make and destroy now (``targets``: GPU UUID -> target, the node's GPUs in
    migMode OnDemand; ``held``: whether a pod holds an instance). ``idle_since`` is updated:
    when each unasked, unheld instance was first seen so."""
    make: list[Asked] = []
    refused: list[str] = []
    wanted: set[tuple[str, str, int]] = set()
    by_uuid = {g.uuid: g for g in snapshot.gpus}
    kept = kept_whole([(g.uuid, t.on_demand, not g.instances) for g in snapshot.gpus
                       if (t := targets.get(g.uuid)) is not None and t.on_demand is not None
                       and g.mig_mode == "enabled"])
    for a in asked:
        gpu = by_uuid.get(a.instance.gpu_uuid)
        if gpu is not None and gpu.index != a.instance.gpu:
            gpu = None
        present = list(gpu.instances) if gpu is not None else []
        have = instance_at(gpu, a.instance) if gpu is not None else None
        if have is not None:
            wanted.add(place_of(a.instance))
            if not have.has_compute_instance:
                make.append(a)
            continue
        why = _why_not(a, gpu, targets.get(a.instance.gpu_uuid), present,
                       a.instance.gpu_uuid in kept)
        if why is not None:
            refused.append(why)
        elif gpu is not None and gpu.mig_mode == "enabled" and not gpu.mig_pending:
            wanted.add(place_of(a.instance))
            make.append(a)
    destroy: list[MadeInstance] = []
    idle_now: set[tuple[str, str, int]] = set()
    for uuid in targets:
        gpu = by_uuid.get(uuid)
        if gpu is None or gpu.mig_mode != "enabled":
            continue
        for inst in gpu.instances:
            made = MadeInstance(gpu.index, gpu.uuid, inst.profile, inst.start)
            k = place_of(made)
            if k in wanted or inst.processes or held(inst):
                continue
            idle_now.add(k)
            since = idle_since.setdefault(k, now)
            if now - since >= idle_s:
                destroy.append(made)
    for k in list(idle_since):
        if k not in idle_now:
            del idle_since[k]
    return Work(tuple(make), tuple(destroy), tuple(refused))
