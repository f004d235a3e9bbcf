"""What the daemon reports for each GPUPartition on its Node, and the Events worth posting
(pure).

An entry is written only when its content changes: an entry equal to the one on the Node
but for ``lastUpdateTime`` keeps the old one, so a resync writes nothing.  Entries of
partitions that no longer own a GPU here (deleted, deselected, lost to an older partition)
are dropped.  Never a false Ready: an entry is Ready only when every GPU the partition owns
here already has its layout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from tessera.api.partition import GPUStatus, MigInstanceStatus, NodePartitionStatus, NodePhase
from tessera.kube.events import EventType
from tessera_node.device.state import DeviceSnapshot, GPUState, model_of
from tessera_node.layout.desired import GPUTarget, Misfit
from tessera_node.layout.holders import Holders
from tessera_node.layout.plan import LAYOUT_DOES_NOT_FIT, GPUPlan, Outcome, plan
from tessera_node.node.findings import Finding


@dataclass(frozen=True)
class Situation:
    """Everything a report depends on besides the targets."""

    snapshot: DeviceSnapshot | None
    read_error: str | None = None
    findings: tuple[Finding, ...] = ()
    outcomes: Mapping[int, Outcome] = field(default_factory=dict)
    """What the enactor said about each GPU's current plan."""
    holders: Holders = field(default_factory=dict)
    """Pods holding devices (the kubelet's PodResources)."""
    allow_reset: bool = True
    made_for: Mapping[str, str] = field(default_factory=dict)
    """MIG device UUID -> the claim (namespace/name) it was made for (migMode OnDemand)."""
    made_for_pods: Mapping[str, str] = field(default_factory=dict)
    """MIG device UUID -> the pod (namespace/name) it was made for (migMode OnDemand, device
    plugin)."""

    def pods_on(self, gpu: GPUState) -> dict[str, str]:
        """MIG device UUID -> the pod an instance of ``gpu`` is held by (the kubelet's
        word), else the pod it was made for."""
        out = {}
        for i in gpu.instances:
            if not i.uuid:
                continue
            held = [p for p in self.holders.get(i.uuid, ()) if "/" in p]
            pod = held[0] if held else self.made_for_pods.get(i.uuid)
            if pod:
                out[i.uuid] = pod
        return out

    def outcome(self, index: int) -> Outcome | None:
        return self.outcomes.get(index)


def plans(targets: Mapping[str, Mapping[int, GPUTarget]], snapshot: DeviceSnapshot,
          holders: Holders | None = None, allow_reset: bool = True) -> list[GPUPlan]:
    """The plan of every owned GPU NVML shows."""
    gpus = {g.index: g for g in snapshot.gpus}
    return [plan(t, gpus[i], holders, allow_reset) for owned in targets.values()
            for i, t in sorted(owned.items()) if i in gpus]


SEVERITY: tuple[NodePhase, ...] = ("Applying", "Pending", "WaitingForIdle", "Failed")
"""Of several GPUs not Ready, the entry takes the phase of the worst."""


def gpu_phase(p: GPUPlan, s: Situation) -> tuple[NodePhase, str, str | None]:
    """One GPU that is not done: its phase, what to say and the reason."""
    o = s.outcome(p.index)
    if p.phase is not None:  # nothing can be done now: the plan says why
        return p.phase, p.message, p.reason
    if o is not None and not o.done:  # also while it is retried: no flapping
        said = o.message if o.message.startswith(f"GPU {p.index}:") else (
            f"{p.describe()} ({o.message})")
        return o.phase, said, o.reason
    return "Applying", p.describe(), None


def gpu_status(g: GPUState, made_for: Mapping[str, str] | None = None,
               pods: Mapping[str, str] | None = None) -> GPUStatus:
    """``made_for``: MIG UUID -> the claim it was made for; ``pods``: -> the pod."""
    model = model_of(g)
    made_for = made_for or {}
    pods = pods or {}
    return GPUStatus(
        index=g.index, uuid=g.uuid, model=model.id if model else None,
        mig_enabled=g.mig_mode == "enabled",
        instances=[MigInstanceStatus(profile=i.profile, start=i.start, size=i.size,
                                     gi_id=i.gi_id, uuid=i.uuid or None,
                                     busy=bool(i.memory_used_bytes),
                                     claim=made_for.get(i.uuid) if i.uuid else None,
                                     pod=pods.get(i.uuid) if i.uuid else None)
                   for i in g.instances])


def entry(owned: Mapping[int, GPUTarget], s: Situation) -> NodePartitionStatus:
    """One partition's entry, without ``lastUpdateTime``."""
    generation = next(iter(owned.values())).generation
    if s.snapshot is None:
        return NodePartitionStatus(phase="Failed", observed_generation=generation,
                                   message=f"cannot read the GPUs: {s.read_error}")
    gpus = {g.index: g for g in s.snapshot.gpus}
    missing = sorted(i for i in owned if i not in gpus)
    if s.read_error is not None or missing:
        why = (f"cannot read the GPUs: {s.read_error}" if s.read_error else
               f"GPU {', '.join(map(str, missing))} not found by NVML")
        return NodePartitionStatus(phase="Failed", observed_generation=generation,
                                   message=why)
    wrong = [f.message for f in s.findings
             if f.kind in ("ProfileMismatch", "UnknownModel") and f.gpu in owned]
    other_manager = [f.message for f in s.findings if f.kind == "OtherMigManager"]
    todo = [p for p in (plan(t, gpus[i], s.holders, s.allow_reset)
                        for i, t in sorted(owned.items())) if not p.done]
    status = [gpu_status(gpus[i], s.made_for, s.pods_on(gpus[i]) if t.on_demand else None)
              for i, t in sorted(owned.items())]
    if wrong:
        return NodePartitionStatus(phase="Failed", observed_generation=generation,
                                   message="; ".join(wrong), gpus=status)
    if not todo:
        return NodePartitionStatus(phase="Ready", observed_generation=generation, gpus=status)
    differences = "; ".join(p.describe() for p in todo)
    if other_manager:
        return NodePartitionStatus(
            phase="Failed", observed_generation=generation, gpus=status,
            message=f"{differences}. tessera-node leaves MIG to the other MIG manager on this "
                    f"node ({'; '.join(other_manager)})")
    phases = [gpu_phase(p, s) for p in todo]
    worst = max(SEVERITY.index(ph) for ph, _, _ in phases)
    phase = SEVERITY[worst]
    if phase == "Applying":
        message = differences
    else:
        message = "; ".join(dict.fromkeys(m for ph, m, _ in phases if ph == phase))
    reason = next((r for ph, _, r in phases if ph == phase and r), None)
    return NodePartitionStatus(phase=phase, observed_generation=generation, gpus=status,
                               message=message, reason=reason)


def misfit_entry(m: Misfit) -> NodePartitionStatus:
    return NodePartitionStatus(phase="Failed", observed_generation=m.generation,
                               message="; ".join(m.reasons), reason=LAYOUT_DOES_NOT_FIT)


def build(targets: Mapping[str, Mapping[int, GPUTarget]], s: Situation,
          misfits: Mapping[str, Misfit] | None = None) -> dict[str, NodePartitionStatus]:
    """One entry per partition owning a GPU here; a partition whose layout does not fit a
    GPU here that it selects is Failed with the planner's reason (even beside GPUs that
    apply: one entry per node)."""
    out = {name: entry(owned, s) for name, owned in sorted(targets.items()) if owned}
    for name, m in sorted((misfits or {}).items()):
        out[name] = misfit_entry(m)
    return out


def merge(old: Mapping[str, NodePartitionStatus], new: Mapping[str, NodePartitionStatus],
          now: datetime) -> dict[str, NodePartitionStatus]:
    """``new`` with each unchanged entry's old ``lastUpdateTime`` kept (so nothing to write),
    changed entries stamped ``now``; partitions not in ``new`` are gone."""
    out = {}
    for name, entry_ in new.items():
        prev = old.get(name)
        if prev is not None and prev.model_copy(update={"last_update_time": None}) == entry_:
            out[name] = prev
        else:
            out[name] = entry_.model_copy(update={"last_update_time": now})
    return out


@dataclass(frozen=True)
class ReportEvent:
    partition: str
    type: EventType
    reason: str
    message: str


def events(node: str, old: Mapping[str, NodePartitionStatus],
           new: Mapping[str, NodePartitionStatus]) -> Sequence[ReportEvent]:
    """One Event per entry whose phase or generation changed, or whose failure reason did
    (the Node keeps the last written entries, so neither a resync nor a restart repeats one;
    a Pending entry whose detail moves on is not news)."""
    out = []
    for name, e in sorted(new.items()):
        prev = old.get(name)
        if prev is not None and (prev.phase, prev.observed_generation) == (
                e.phase, e.observed_generation) and (
                e.phase != "Failed" or prev.message == e.message):
            continue
        if e.phase == "Ready":
            out.append(ReportEvent(name, "Normal", "NodeReady",
                                   f"node {node}: layout of generation "
                                   f"{e.observed_generation} in place"))
        else:
            out.append(ReportEvent(name, "Normal" if e.phase == "Applying" else "Warning",
                                   f"Node{e.phase}", f"node {node}: {e.message or e.phase}"))
    return out
