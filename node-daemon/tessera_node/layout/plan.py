"""From what a GPU is to what it should be: the steps, as data (pure).

Instances are changed with the operator's minimal-disruption planner
(:func:`tessera.mig.planner.plan`): current and wanted instances are compared as
(profile, start) pairs, the instances that can stay where they are stay (keeping their IDs
and UUIDs), the rest are destroyed, the missing ones created at explicit starts.  A GPU that
already matches gets no step, so acting is idempotent; verifying is planning again.

The plan is computed from a fresh read before every command, so it also decides what to do
after a crash: a GPU instance without its compute instance (killed between ``-cgi`` and
``-cci``) gets one if it stays and is destroyed if not, a pending MIG mode is finished (a
GPU reset) or taken back.  Nothing that is in use is ever destroyed or reset: an instance is
in use when NVML shows processes on it or a pod holds it (the kubelet's PodResources), and
the partition's ``disruptionPolicy`` decides between waiting (``WaitingForIdle``) and
refusing (``Failed``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from tessera.api.partition import NodePhase
from tessera.mig import planner
from tessera_node.device.state import GPUState, MigInstanceState, model_of
from tessera_node.layout.desired import GPUTarget, summary
from tessera_node.layout.holders import Holders

Action = Literal["enable-mig", "disable-mig", "reset-gpu", "destroy-ci", "destroy-gi",
                 "create-gi", "create-ci"]
ORDER: tuple[Action, ...] = ("destroy-ci", "destroy-gi", "disable-mig", "enable-mig",
                             "reset-gpu", "create-gi", "create-ci")
"""The order step kinds run in on one GPU."""

REBOOT_REQUIRED = "RebootRequired"
LAYOUT_DOES_NOT_FIT = "LayoutDoesNotFit"
IN_USE = "InUse"
RESET_PENDING = "ResetPending"
COMMAND_FAILED = "CommandFailed"


@dataclass(frozen=True)
class Step:
    action: Action
    profile: str = ""
    start: int | None = None
    gi_id: int | None = None
    devices: tuple[str, ...] = ()
    """The advertised devices (UUIDs) the step takes away: withdrawn before it runs."""


@dataclass(frozen=True)
class GPUPlan:
    index: int
    target: GPUTarget
    steps: tuple[Step, ...]
    actual: str
    """The GPU as it was when planned, in words (``1x3g.40gb``)."""
    phase: NodePhase | None = None
    """Set when nothing can be done now: ``WaitingForIdle``, ``Failed`` or ``Pending``."""
    message: str = ""
    """Why, naming the processes and pods in the way."""
    reason: str | None = None
    gpu_uuid: str = ""

    @property
    def done(self) -> bool:
        return not self.steps and self.phase is None

    @property
    def blocked(self) -> bool:
        return self.phase is not None

    def describe(self) -> str:
        return f"GPU {self.index}: has {self.actual}, wants {self.target.summary()}"


def actual_profiles(gpu: GPUState) -> tuple[str, ...]:
    return tuple(sorted(i.profile for i in gpu.instances))


def describe_gpu(gpu: GPUState) -> str:
    if gpu.mig_mode == "unsupported":
        return "no MIG"
    text = summary(gpu.mig_mode == "enabled", actual_profiles(gpu))
    if gpu.mig_pending is not None:
        text += f" (MIG {gpu.mig_pending} after a GPU reset)"
    return text



@dataclass(frozen=True)
class Outcome:
    """What came of carrying a plan out (the enactor's answer)."""

    phase: NodePhase
    """``Ready`` once NVML shows the target; otherwise what the node entry says."""
    message: str = ""
    reason: str | None = None

    @property
    def done(self) -> bool:
        return self.phase == "Ready"


def instance_users(gpu: GPUState, inst: MigInstanceState, holders: Holders) -> list[str]:
    """Who uses one instance: its processes, the pods holding it or its whole GPU."""
    pods = [*holders.get(inst.uuid, ()), *holders.get(gpu.uuid, ())] if inst.uuid else list(
        holders.get(gpu.uuid, ()))
    return [*inst.processes, *(f"pod {p}" for p in sorted(set(pods)))]


def gpu_users(gpu: GPUState, holders: Holders) -> list[str]:
    """Who uses the GPU at all (a mode change or reset disrupts every one of them)."""
    out = list(gpu.processes) + [f"pod {p}" for p in holders.get(gpu.uuid, ())]
    for i in gpu.instances:
        out += [u for u in instance_users(gpu, i, holders) if u not in out]
    return out


def plan(target: GPUTarget, gpu: GPUState, holders: Holders | None = None,
         allow_reset: bool = True) -> GPUPlan:
    """The steps that take ``gpu`` to ``target`` now, or why none can run now."""
    return _Planning(target, gpu, holders or {}).plan(allow_reset)


@dataclass(frozen=True)
class _Planning:
    target: GPUTarget
    gpu: GPUState
    holders: Holders

    def steps(self, *s: Step) -> GPUPlan:
        ordered = tuple(sorted(s, key=lambda x: ORDER.index(x.action)))
        return GPUPlan(self.gpu.index, self.target, ordered, describe_gpu(self.gpu),
                       gpu_uuid=self.gpu.uuid)

    def blocked(self, phase: NodePhase, message: str, reason: str) -> GPUPlan:
        if self.target.deleting and phase == "Pending":  # a Reset deletion must not hang
            phase, message = "Failed", f"{message}: the reset deletion cannot finish"
        return GPUPlan(self.gpu.index, self.target, (), describe_gpu(self.gpu), phase,
                       f"GPU {self.gpu.index}: {message}", reason, self.gpu.uuid)

    def in_use(self, users: Sequence[str], what: str) -> GPUPlan:
        names = "; ".join(users)
        if self.target.policy == "Refuse":
            return self.blocked("Failed", f"{what} is in use by {names}; disruptionPolicy "
                                "Refuse leaves it alone", IN_USE)
        return self.blocked("WaitingForIdle", f"{what} is in use by {names}; waiting for "
                            "it to go idle", IN_USE)

    def mode_action(self) -> Action:
        return "enable-mig" if self.target.mig_enabled else "disable-mig"

    def plan(self, allow_reset: bool) -> GPUPlan:
        target, gpu = self.target, self.gpu
        if gpu.mig_mode == "unsupported":
            if target.mig_enabled:
                return self.blocked("Failed", "this GPU does not support MIG",
                                    LAYOUT_DOES_NOT_FIT)
            return self.steps()
        want = "enabled" if target.mig_enabled else "disabled"
        verb = "enable" if target.mig_enabled else "disable"
        if gpu.mig_mode != want:
            if gpu.instances:  # MIG off: every instance goes first
                return self.instances(())
            users = gpu_users(gpu, self.holders)
            if gpu.mig_pending == want:  # the driver waits for a GPU reset (Ampere)
                if users:
                    return self.in_use(users, f"the GPU (MIG {want} is pending a reset)")
                if not allow_reset:
                    return self.blocked(
                        "Pending", f"MIG {want} is pending a GPU reset, and GPU resets are "
                        "off on this node (--allow-gpu-reset false)", RESET_PENDING)
                return self.steps(Step("reset-gpu", devices=(gpu.uuid,)))
            if users:
                return self.in_use(users, f"the GPU (to {verb} MIG)")
            return self.steps(Step(self.mode_action(), devices=(gpu.uuid,)))
        if gpu.mig_pending is not None:  # a change to the wrong mode is pending: take it back
            return self.steps(Step(self.mode_action()))
        if not target.mig_enabled:
            return self.steps()
        if target.on_demand is not None:
            # the claims' instances: each stays as it is, even one without its compute
            # instance (being made now, or a daemon killed mid-command: the kubelet
            # plugin's prepare, asked again, completes it; a second -cci would race)
            p = self.instances(actual_profiles(gpu))
            return replace(p, steps=tuple(s for s in p.steps if s.action != "create-ci"))
        return self.instances(target.profiles)

    def instances(self, wanted: Sequence[str]) -> GPUPlan:
        """Destroy and create instances so that the GPU holds ``wanted`` (MIG enabled)."""
        gpu, holders = self.gpu, self.holders
        model = model_of(gpu)
        if model is None:
            return self.blocked("Failed", f"{gpu.name} is not in tessera's model table",
                                LAYOUT_DOES_NOT_FIT)
        current = [planner.Instance(i.profile, i.start,
                                    bool(instance_users(gpu, i, holders)))
                   for i in gpu.instances]
        try:
            p = planner.plan(model.id, current, list(wanted), planner.DisruptionPolicy.WAIT)
        except ValueError as exc:  # LayoutError, UnknownProfileError: the planner's reason
            return self.blocked("Failed", str(exc), LAYOUT_DOES_NOT_FIT)
        by_place = {(i.profile, i.start): i for i in gpu.instances}
        if p.waiting_for:
            users = []
            for b in p.waiting_for:
                inst = by_place[(b.profile, b.start)]
                users.append(f"{', '.join(instance_users(gpu, inst, holders))} "
                             f"on {inst.profile}@{inst.start}")
            return self.in_use(users, f"an instance the layout {summary(True, wanted)} "
                               "replaces")
        out: list[Step] = []
        for s in p.steps:
            if s.action == "destroy":
                inst = by_place[(s.profile, s.start)]
                gone = (inst.uuid,) if inst.uuid else ()
                if inst.has_compute_instance:
                    out.append(Step("destroy-ci", s.profile, s.start, inst.gi_id, gone))
                out.append(Step("destroy-gi", s.profile, s.start, inst.gi_id, gone))
            else:
                out.append(Step("create-gi", s.profile, s.start))
        kept = {(k.profile, k.start) for k in p.kept}
        out += [Step("create-ci", i.profile, i.start, i.gi_id) for i in gpu.instances
                if (i.profile, i.start) in kept and not i.has_compute_instance]
        return self.steps(*out)
