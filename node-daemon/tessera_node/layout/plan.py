"""From what a GPU is to what it should be: the steps, as data (pure).

Like NVIDIA's mig-parted, a GPU whose instances differ from the target in any way is
rebuilt whole (destroy every instance, create the target's), which is simple to verify and
leaves no half-matching placements; a GPU that already matches gets no step at all, so
acting is idempotent.  Verifying is planning again: an empty plan means done.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tessera_node.device.state import GPUState
from tessera_node.layout.desired import GPUTarget, summary

Action = Literal["enable-mig", "disable-mig", "destroy-instance", "create-instance"]


@dataclass(frozen=True)
class Step:
    action: Action
    profile: str = ""
    gi_id: int | None = None


@dataclass(frozen=True)
class GPUPlan:
    index: int
    target: GPUTarget
    steps: tuple[Step, ...]
    actual: str
    """The GPU as it was when planned, in words (``1x3g.40gb``)."""

    @property
    def done(self) -> bool:
        return not self.steps

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


def plan(target: GPUTarget, gpu: GPUState) -> GPUPlan:
    steps: list[Step] = []
    enabled = gpu.mig_mode == "enabled"
    if not target.mig_enabled:
        if enabled:
            steps += [Step("destroy-instance", i.profile, i.gi_id) for i in gpu.instances]
            steps.append(Step("disable-mig"))
        elif gpu.mig_pending == "enabled":
            steps.append(Step("disable-mig"))
    else:
        if not enabled:
            steps.append(Step("enable-mig"))
        elif actual_profiles(gpu) != target.profiles:
            steps += [Step("destroy-instance", i.profile, i.gi_id) for i in gpu.instances]
        if not enabled or actual_profiles(gpu) != target.profiles:
            steps += [Step("create-instance", p) for p in target.profiles]
    return GPUPlan(gpu.index, target, tuple(steps), describe_gpu(gpu))
