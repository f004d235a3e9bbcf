"""How a process knows it is well, and says so on /healthz and /readyz.

Every long-running task (a watch, a control loop, a periodic re-apply) runs under
:func:`supervise`: an error is logged, counted and retried with backoff, so no single
object, outage or bug in one event ends the process.  What cannot heal by itself shows in
:class:`Health`: a task that stopped, or a watch that has not been able to follow its
objects for ``stuck_after_s``, makes /healthz answer 503 with the reason, so the liveness
probe restarts the process instead of it serving on, silently blind.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import Counter

log = logging.getLogger("tessera.health")

WATCH_ERRORS = Counter(
    "tessera_watch_errors_total",
    "Watch events or streams that could not be read or handled (logged; the watch goes on).",
    ["watch", "stage"])
TASK_FAILURES = Counter(
    "tessera_task_failures_total",
    "Times a long-running task failed and was restarted after a backoff.", ["task"])

BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
RECOVERED_AFTER_S = 5.0


@dataclass
class _State:
    failing_since: float | None = None
    error: str = ""
    synced: bool = False


@dataclass
class Health:
    """The state of each watch and supervised task of one process."""

    stuck_after_s: float = 60.0
    """A watch failing this long (or a task down this long) makes the process unhealthy."""
    _states: dict[str, _State] = field(default_factory=dict)
    _tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def ok(self, name: str, synced: bool = True) -> None:
        """``name`` is following its objects (a watch listed or an event came)."""
        state = self._states.setdefault(name, _State())
        if state.failing_since is not None:
            log.info("recovered", extra={"part": name, "was": state.error})
        state.failing_since, state.error = None, ""
        state.synced = state.synced or synced

    def failing(self, name: str, error: str) -> None:
        state = self._states.setdefault(name, _State())
        if state.failing_since is None:
            state.failing_since = time.monotonic()
        state.error = error[:300]

    def track(self, name: str, task: asyncio.Task[None]) -> None:
        self._tasks[name] = task

    def forget(self, *names: str) -> None:
        """Parts that stopped on purpose (leadership lost) no longer count."""
        for name in names:
            for key in (name, f"task {name}"):
                self._states.pop(key, None)
            self._tasks.pop(name, None)

    def problems(self, now: float | None = None) -> list[str]:
        now = time.monotonic() if now is None else now
        out = [f"{name}: stopped" for name, t in sorted(self._tasks.items()) if t.done()]
        for name, s in sorted(self._states.items()):
            if s.failing_since is not None and now - s.failing_since >= self.stuck_after_s:
                out.append(f"{name}: failing for {now - s.failing_since:.0f}s: {s.error}")
        return out

    def synced(self, name: str) -> bool:
        state = self._states.get(name)
        return state is not None and state.synced


async def supervise(name: str, run: Callable[[], Awaitable[None]],
                    health: Health | None = None) -> None:
    """Run ``run`` forever: after an error (or an unexpected return) log it, count it and
    start again after a backoff (1 s doubling to 30 s, reset after a minute of running).

    Its failures count in ``health`` as ``task NAME`` (apart from what ``run`` itself reports,
    e.g. a watch's own state), until it has run :data:`RECOVERED_AFTER_S` without failing.
    """
    key = f"task {name}"
    backoff = BACKOFF_FIRST_S
    loop = asyncio.get_running_loop()
    failed = False
    while True:
        started = time.monotonic()
        recovered = (loop.call_later(RECOVERED_AFTER_S, health.ok, key, False)
                     if health is not None and failed else None)
        try:
            await run()
            error = "returned"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one failure must not end the process: retry it
            error = f"{type(exc).__name__}: {exc}"
            log.exception("task failed; restarting", extra={"task": name})
        finally:
            if recovered is not None:
                recovered.cancel()
        failed = True
        TASK_FAILURES.labels(name).inc()
        if health is not None:
            health.failing(key, error)
        if time.monotonic() - started > 60:
            backoff = BACKOFF_FIRST_S
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, BACKOFF_MAX_S)
