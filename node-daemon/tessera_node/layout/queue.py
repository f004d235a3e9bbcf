"""The per-GPU queue of MIG plans: one worker per GPU, the latest plan wins.

Acting on a GPU can take long (waiting for it to go idle, a MIG mode change); one GPU's work
must not hold up another's, and a plan that changed while the GPU was busy replaces the
queued one instead of running after it.  A plan already carried out for the same target is
not submitted again, so a resync acts on nothing new; one that did not finish (an
nvidia-smi failure) is tried again after ``retry_s`` (``--retry-interval``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from tessera_node.layout.enact import Enactor
from tessera_node.layout.plan import GPUPlan, Outcome

log = logging.getLogger("tessera_node.work")


class PlanQueue:
    def __init__(self, enactor: Enactor, on_done: Callable[[], None], retry_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.enactor = enactor
        self.on_done = on_done
        self.retry_s = retry_s
        self.clock = clock
        self.outcomes: dict[int, tuple[GPUPlan, Outcome, float]] = {}
        """The last plan each GPU's worker finished, what came of it, and when."""
        self._running: dict[int, GPUPlan] = {}
        self._pending: dict[int, GPUPlan] = {}
        self._wake: dict[int, asyncio.Event] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}

    def submit(self, plan: GPUPlan) -> None:
        last = self.outcomes.get(plan.index)
        if last is not None and last[0] == plan and (
                last[1].done or self.clock() - last[2] < self.retry_s):
            return
        if plan in (self._pending.get(plan.index), self._running.get(plan.index)):
            return
        self._pending[plan.index] = plan
        if plan.index not in self._workers:
            self._wake[plan.index] = asyncio.Event()
            self._workers[plan.index] = asyncio.create_task(
                self._worker(plan.index), name=f"gpu-{plan.index}")
        self._wake[plan.index].set()

    def outcome(self, plan: GPUPlan) -> Outcome | None:
        """What came of exactly this plan (None: not carried out yet)."""
        last = self.outcomes.get(plan.index)
        return last[1] if last is not None and last[0] == plan else None

    def forget(self, keep: set[int]) -> None:
        """Drop what is known about GPUs that have nothing to do (no partition wants
        anything of them, or their plan is done or waits): a plan coming back later runs."""
        for index in set(self.outcomes) - keep:
            del self.outcomes[index]

    async def _worker(self, index: int) -> None:
        wake = self._wake[index]
        while True:
            await wake.wait()
            wake.clear()
            plan = self._pending.pop(index, None)
            if plan is None:
                continue
            self._running[index] = plan
            try:
                outcome = await asyncio.to_thread(self.enactor.apply, plan)
            except Exception as exc:  # an enactor must not end the worker
                log.exception("enactment failed", extra={"gpu": index})
                outcome = Outcome("Failed", f"enactment failed: {exc}")
            finally:
                self._running.pop(index, None)
            self.outcomes[index] = (plan, outcome, self.clock())
            if not outcome.done:  # try again later (the reconciler submits it again)
                asyncio.get_running_loop().call_later(self.retry_s, self.on_done)
            self.on_done()

    async def close(self) -> None:
        for t in self._workers.values():
            t.cancel()
        for t in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._workers.clear()
