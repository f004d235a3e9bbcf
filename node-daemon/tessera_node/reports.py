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

from tessera.api.partition import GPUStatus, MigInstanceStatus, NodePartitionStatus
from tessera.kube.events import EventType
from tessera_node.device.state import DeviceSnapshot, GPUState
from tessera_node.findings import Finding
from tessera_node.inventory import model_of
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.enact import Outcome
from tessera_node.layout.plan import GPUPlan, plan


@dataclass(frozen=True)
class Situation:
    """Everything a report depends on besides the targets."""

    snapshot: DeviceSnapshot | None
    read_error: str | None = None
    findings: tuple[Finding, ...] = ()
    outcomes: Mapping[int, Outcome] = field(default_factory=dict)
    """What the enactor said about each GPU's current plan."""

    def outcome(self, index: int) -> Outcome | None:
        return self.outcomes.get(index)


def plans(targets: Mapping[str, Mapping[int, GPUTarget]], snapshot: DeviceSnapshot
          ) -> list[GPUPlan]:
    """The plan of every owned GPU NVML shows."""
    gpus = {g.index: g for g in snapshot.gpus}
    return [plan(t, gpus[i]) for owned in targets.values() for i, t in sorted(owned.items())
            if i in gpus]


def gpu_status(g: GPUState) -> GPUStatus:
    model = model_of(g)
    return GPUStatus(
        index=g.index, uuid=g.uuid, model=model.id if model else None,
        mig_enabled=g.mig_mode == "enabled",
        instances=[MigInstanceStatus(profile=i.profile, start=i.start, size=i.size,
                                     gi_id=i.gi_id, uuid=i.uuid or None,
                                     busy=bool(i.memory_used_bytes))
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
    todo = [p for p in (plan(t, gpus[i]) for i, t in sorted(owned.items())) if not p.done]
    status = [gpu_status(gpus[i]) for i in sorted(owned)]
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
    refusals = sorted({o.message for p in todo if (o := s.outcome(p.index)) and not o.done})
    reason = f" ({'; '.join(refusals)})" if refusals else ""
    return NodePartitionStatus(phase="Pending", observed_generation=generation, gpus=status,
                               message=f"{differences}{reason}")


def build(targets: Mapping[str, Mapping[int, GPUTarget]], s: Situation
          ) -> dict[str, NodePartitionStatus]:
    return {name: entry(owned, s) for name, owned in sorted(targets.items()) if owned}


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
