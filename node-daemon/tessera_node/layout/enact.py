"""Who carries a plan out: :class:`SmiEnactor` changes MIG layouts with ``nvidia-smi`` only.

For one GPU, in a worker thread: read the GPU (NVML) and the pods holding its devices, plan
(:func:`tessera_node.layout.plan.plan`, pure), run the plan's first command (one
``nvidia-smi`` per step kind, :mod:`.batch`), and again, until the plan is empty (verified:
NVML shows the layout) or says why nothing can be done now.  Devices a command takes away
are withdrawn from what the node advertises first, and the GPU is read once more before the
command runs.  A GPU reset runs with the daemon's own NVML closed.  Every command holds the
GPU's host lock (:mod:`tessera_node.device.hostlock`).

:class:`NoEnactment` acts on nothing and says why (beside another MIG manager, in tests).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from tessera_node import metrics
from tessera_node.device.hostlock import GPULocks, LockTimeout
from tessera_node.device.nvml import DeviceError, GPUReader
from tessera_node.device.smi import TIMEOUT_EXIT, USAGE_EXIT, NvidiaSmi, SmiResult
from tessera_node.device.state import GPUState
from tessera_node.layout import commands
from tessera_node.layout.advertise import Advertiser, NothingAdvertised
from tessera_node.layout.holders import DeviceHolders, NoHolders
from tessera_node.layout.plan import COMMAND_FAILED, REBOOT_REQUIRED, GPUPlan, Outcome, plan

log = logging.getLogger("tessera_node.enact")

MAX_COMMANDS = 32
"""Commands one apply may run before it gives up (a plan needs at most seven)."""


class Enactor(Protocol):
    def prepare(self) -> None:
        """Check the tools it needs (blocking; at start, and again while refusing)."""
        ...

    def refusal(self) -> str | None:
        """Why it cannot act at all now (None: it can); asked before any plan is queued."""
        ...

    def apply(self, plan: GPUPlan) -> Outcome:
        """Carry ``plan`` out (blocking: runs in a worker thread); never raises."""
        ...


class NoEnactment:
    """Acts on nothing and says so."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def prepare(self) -> None:
        return None

    def refusal(self) -> str | None:
        return self.reason

    def apply(self, plan: GPUPlan) -> Outcome:
        return Outcome("Pending", self.reason)


def placement_support(path: str, rc: int, output: str) -> str | None:
    """Why ``nvidia-smi`` cannot take explicit placements, from its answer to
    ``nvidia-smi mig -lgipp`` (pure; None: it can)."""
    if rc == TIMEOUT_EXIT:
        return f"cannot run nvidia-smi: {output[:300]}"
    if rc == USAGE_EXIT or "Invalid combination" in output:
        return (f"{path} does not know MIG placements (`nvidia-smi mig -lgipp`: "
                f"{' '.join(output.split())[:200]}), so it cannot create instances at "
                "explicit start slots (`-cgi <profile>:<start>`, newer drivers only); the "
                "driver would choose the slots, so tessera-node cannot guarantee minimal "
                "disruption and changes no MIG layout")
    return None


class SmiEnactor:
    def __init__(self, smi: NvidiaSmi, reader: GPUReader, locks: GPULocks,
                 holders: DeviceHolders | None = None, advertiser: Advertiser | None = None,
                 *, recheck_s: float, allow_reset: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.smi = smi
        self.reader = reader
        self.locks = locks
        self.holders: DeviceHolders = holders or NoHolders()
        self.advertiser: Advertiser = advertiser or NothingAdvertised()
        self.allow_reset = allow_reset
        self.recheck_s = recheck_s
        self.clock = clock
        self._refusal: str | None = "nvidia-smi not checked yet"
        self._checked_at: float | None = None
        self._check_lock = threading.Lock()

    # -- the tool ------------------------------------------------------------------------------

    def prepare(self) -> None:
        with self._check_lock:
            now = self.clock()
            if self._refusal is None or (self._checked_at is not None
                                         and now - self._checked_at < self.recheck_s):
                return
            self._checked_at = now
            r = self.call("check", None, None, "mig", "-lgipp")
            self._refusal = placement_support(self.smi.path, r.rc, r.output)
            if self._refusal is not None:
                log.error("MIG layouts will not be changed", extra={"why": self._refusal})

    def refusal(self) -> str | None:
        return self._refusal

    def call(self, kind: str, gpu: int | None, lock_fd: int | None, *args: str) -> SmiResult:
        r = self.smi.call(*args, lock_fd=lock_fd, gpu=gpu)
        metrics.SMI_COMMANDS.labels(kind, "ok" if r.rc == 0 else "error").inc()
        metrics.SMI_SECONDS.labels(kind).observe(r.seconds)
        return r

    # -- one GPU -------------------------------------------------------------------------------

    def read(self, index: int) -> tuple[GPUState | None, Mapping[str, Sequence[str]]]:
        snapshot = self.reader.read()
        holders = self.holders.holders()
        return next((g for g in snapshot.gpus if g.index == index), None), holders

    def apply(self, plan: GPUPlan) -> Outcome:
        started = self.clock()
        stats = {"commands": 0, "smi_s": 0.0}
        try:
            outcome = self._apply(plan, stats)
        except (DeviceError, OSError, LockTimeout) as exc:
            outcome = Outcome("Failed", f"GPU {plan.index}: {exc}", COMMAND_FAILED)
        seconds = self.clock() - started
        metrics.MIG_APPLIES.labels(outcome.phase).inc()
        metrics.MIG_APPLY_SECONDS.labels(outcome.phase).observe(seconds)
        log.info("MIG apply finished", extra={
            "gpu": plan.index, "partition": plan.target.partition,
            "target": plan.target.summary(), "phase": outcome.phase,
            "detail": outcome.message, "commands": stats["commands"],
            "seconds": round(seconds, 4), "smiSeconds": round(stats["smi_s"], 4)})
        return outcome

    def _apply(self, wanted: GPUPlan, stats: dict[str, float]) -> Outcome:
        withdrawn: set[str] = set()
        gpu_uuid = ""
        try:
            for _ in range(2 * MAX_COMMANDS):
                gpu, holders = self.read(wanted.index)
                if gpu is None:
                    return Outcome("Failed", f"GPU {wanted.index} not found by NVML")
                gpu_uuid = gpu.uuid
                p = plan(wanted.target, gpu, holders, self.allow_reset)
                if p.done:
                    return Outcome("Ready")
                if p.phase is not None:
                    return Outcome(p.phase, p.message, p.reason)
                cmd = commands.next_command(p)
                assert cmd is not None
                if not set(cmd.devices) <= withdrawn:
                    self.advertiser.withdraw(gpu.uuid, cmd.devices)
                    withdrawn |= set(cmd.devices)
                    continue  # read again: nothing may have started on them meanwhile
                if stats["commands"] >= MAX_COMMANDS:
                    break
                failed = self._run(cmd, stats)
                if failed is not None:
                    return failed
            return Outcome("Failed", f"GPU {wanted.index}: no progress after "
                           f"{MAX_COMMANDS} nvidia-smi commands", COMMAND_FAILED)
        finally:
            if stats["commands"] and gpu_uuid:
                self.advertiser.changed(gpu_uuid)

    def _run(self, cmd: commands.Command, stats: dict[str, float]) -> Outcome | None:
        """Run one command; the outcome when it failed."""
        with self.locks.held(cmd.gpu) as fd:
            if cmd.action == "reset-gpu":
                with self.reader.paused():  # a reset refuses while clients hold the GPU
                    r = self.call(cmd.action, cmd.gpu, fd, *cmd.args)
            else:
                r = self.call(cmd.action, cmd.gpu, fd, *cmd.args)
        stats["commands"] += 1
        stats["smi_s"] += r.seconds
        if r.rc != 0:
            return Outcome("Failed", f"GPU {cmd.gpu}: {commands.failure_text(cmd, r.rc, r.output)}",
                           commands.failure_reason(r.output))
        if cmd.action in ("enable-mig", "disable-mig") and commands.pending_needs_reboot(r.output):
            return Outcome("Failed", f"GPU {cmd.gpu}: the MIG mode change waits for a reboot "
                           f"(`{cmd}`: GPU requires reset; a passthrough VM?)", REBOOT_REQUIRED)
        return None
