"""Work queued per GPU: one worker per GPU, the latest plan wins.

Acting on a GPU can take long (waiting for it to go idle, a MIG mode change); one GPU's work
must not hold up another's, and a plan that changed while the GPU was busy replaces the
queued one instead of running after it.  A plan already carried out (or refused) for the
same target is not submitted again, so a resync acts on nothing new.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from tessera_node.layout.enact import Enactor, Outcome
from tessera_node.layout.plan import GPUPlan

log = logging.getLogger("tessera_node.work")


class GPUWork:
    def __init__(self, enactor: Enactor, on_done: Callable[[], None]) -> None:
        self.enactor = enactor
        self.on_done = on_done
        self.outcomes: dict[int, tuple[GPUPlan, Outcome]] = {}
        """The last plan each GPU's worker finished and what came of it."""
        self._pending: dict[int, GPUPlan] = {}
        self._wake: dict[int, asyncio.Event] = {}
        self._workers: dict[int, asyncio.Task[None]] = {}

    def submit(self, plan: GPUPlan) -> None:
        last = self.outcomes.get(plan.index)
        if last is not None and last[0] == plan:
            return
        if self._pending.get(plan.index) == plan:
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
        """Drop what is known about GPUs no partition wants anything of any more."""
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
            try:
                outcome = await asyncio.to_thread(self.enactor.apply, plan)
            except Exception as exc:  # an enactor must not end the worker
                log.exception("enactment failed", extra={"gpu": index})
                outcome = Outcome(False, f"enactment failed: {exc}")
            self.outcomes[index] = (plan, outcome)
            self.on_done()

    async def close(self) -> None:
        for t in self._workers.values():
            t.cancel()
        for t in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._workers.clear()
