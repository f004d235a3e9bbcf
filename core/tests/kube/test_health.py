"""Supervised tasks restart instead of ending the process; what cannot heal shows in health."""

from __future__ import annotations

import asyncio

import pytest

from tessera.kube import health as health_mod
from tessera.kube.health import TASK_FAILURES, Health, supervise


def test_a_watch_failing_longer_than_stuck_after_is_a_problem_until_it_recovers() -> None:
    h = Health(stuck_after_s=10)
    h.failing("quota-cache", "ClientConnectorError: refused")
    assert h.problems(now=_later(h, "quota-cache", 5)) == []
    (problem,) = h.problems(now=_later(h, "quota-cache", 11))
    assert problem.startswith("quota-cache: failing for 11s: ClientConnectorError")
    h.ok("quota-cache")
    assert h.problems() == [] and h.synced("quota-cache")


def _later(h: Health, name: str, seconds: float) -> float:
    since = h._states[name].failing_since
    assert since is not None
    return since + seconds


def test_a_stopped_task_is_a_problem_and_a_forgotten_one_is_not() -> None:
    async def main() -> None:
        h = Health()
        task: asyncio.Task[None] = asyncio.create_task(asyncio.sleep(0))
        h.track("pods", task)
        await task
        assert h.problems() == ["pods: stopped"]
        h.forget("pods")
        assert h.problems() == []
    asyncio.run(main())


def test_supervise_restarts_a_failing_task_and_never_raises(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(health_mod, "BACKOFF_FIRST_S", 0.01)
    runs = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) < 3:
            raise OSError("API server unreachable")
        await asyncio.sleep(3600)

    async def main() -> Health:
        h = Health(stuck_after_s=0)
        before = TASK_FAILURES.labels("flaky")._value.get()
        task = asyncio.create_task(supervise("flaky", flaky, h))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if len(runs) == 3:
                break
        assert not task.done()
        assert TASK_FAILURES.labels("flaky")._value.get() - before == 2
        task.cancel()
        return h

    h = asyncio.run(main())
    assert len(runs) == 3
    assert h.problems()[0].startswith("task flaky: failing")  # not yet running for 5 s


def test_a_task_that_never_failed_does_not_clear_what_its_watch_reports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A watch reports its own state under its name; the supervisor's recovery timer must
    not wipe it (a blind watch inside a healthy task is still blind)."""
    monkeypatch.setattr(health_mod, "RECOVERED_AFTER_S", 0.01)

    async def main() -> Health:
        h = Health(stuck_after_s=0)

        async def watch() -> None:
            h.failing("quota-cache", "ServerDisconnectedError")
            await asyncio.sleep(3600)

        task = asyncio.create_task(supervise("quota-cache", watch, h))
        await asyncio.sleep(0.1)
        task.cancel()
        return h

    (problem,) = asyncio.run(main()).problems()
    assert problem.startswith("quota-cache: failing")
