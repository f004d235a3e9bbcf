"""A plan's steps as ``nvidia-smi`` invocations (pure): one per GPU per step kind.

``nvidia-smi`` takes a list for every MIG command (``-gi 7,8``, ``-cgi 1g.10gb:0,1g.10gb:1``),
so the steps of one kind on one GPU make one command, not one per instance.  Only the first
command of a plan is ever run before reading the GPU again: the next plan, from what NVML
shows then, decides the next command (which is what makes a crash between two commands
harmless).  Every GPU instance is created at the planner's start slot, never where the
driver would put it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tessera_node.layout.plan import COMMAND_FAILED, ORDER, REBOOT_REQUIRED, Action, GPUPlan


@dataclass(frozen=True)
class Command:
    gpu: int
    action: Action
    args: tuple[str, ...]
    """nvidia-smi's arguments."""
    devices: tuple[str, ...] = ()
    """Advertised devices it takes away."""

    def __str__(self) -> str:
        return "nvidia-smi " + " ".join(self.args)


def commands(plan: GPUPlan) -> list[Command]:
    """Every command of the plan, in the order they run: one per step kind."""
    out = []
    i = str(plan.index)
    for action in ORDER:
        steps = [s for s in plan.steps if s.action == action]
        if not steps:
            continue
        ids = ",".join(str(s.gi_id) for s in steps)
        args: tuple[str, ...]
        if action == "enable-mig":
            args = ("-i", i, "-mig", "1")
        elif action == "disable-mig":
            args = ("-i", i, "-mig", "0")
        elif action == "reset-gpu":
            args = ("-r", "-i", i)
        elif action == "destroy-ci":
            args = ("mig", "-i", i, "-gi", ids, "-dci")
        elif action == "destroy-gi":
            args = ("mig", "-i", i, "-gi", ids, "-dgi")
        elif action == "create-gi":
            args = ("mig", "-i", i, "-cgi", ",".join(f"{s.profile}:{s.start}" for s in steps))
        else:
            args = ("mig", "-i", i, "-gi", ids, "-cci")
        devices = tuple(dict.fromkeys(d for s in steps for d in s.devices))
        out.append(Command(plan.index, action, args, devices))
    return out


def next_command(plan: GPUPlan) -> Command | None:
    cmds = commands(plan)
    return cmds[0] if cmds else None


PENDING = re.compile(r"MIG mode is in pending \w+ state for GPU [^:]+:[^:]*:[^:]*:(?P<why>.*)")
RESET_REQUIRED_TEXT = "GPU requires reset"


def failure_reason(output: str) -> str:
    """The report's reason for a failed command (or a mode change the driver left pending
    because only a reboot finishes it: ``RESET_REQUIRED``, passthrough VMs)."""
    return REBOOT_REQUIRED if RESET_REQUIRED_TEXT in output else COMMAND_FAILED


def pending_needs_reboot(output: str) -> bool:
    """``-mig`` succeeded but left the mode pending with ``GPU requires reset``."""
    return any(m.group("why").strip() == RESET_REQUIRED_TEXT
               for m in (PENDING.search(line) for line in output.splitlines()) if m)


def failure_text(command: Command, rc: int, output: str) -> str:
    """What the node entry says about a failed command: the command and the tool's words."""
    words = " ".join(line.strip() for line in output.strip().splitlines() if line.strip())
    return f"`{command}` failed (exit {rc}): {words[:400] or 'no output'}"
