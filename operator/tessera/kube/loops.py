"""Event loops in threads of their own, and handing a coroutine to another thread's loop.

The operator can answer admission reviews on a loop of its own
(``--admission-loop=thread``, :mod:`tessera.webhooks.server`), so that a review does not wait
behind whatever runs on the main loop.  An API client
(:class:`tessera.kube.client.Kube`) belongs to the loop that made it; work for it from
another loop is handed over with :func:`on_loop`.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

T = TypeVar("T")



class Runner(Protocol):
    """Runs a coroutine on some event loop and gives its result to the caller's."""

    def __call__(self, coro: Coroutine[Any, Any, T], /) -> Awaitable[T]: ...



def on_loop(loop: asyncio.AbstractEventLoop) -> Runner:
    """A runner for coroutines that must run on ``loop`` (awaited from another loop)."""
    async def run(coro: Coroutine[Any, Any, T]) -> T:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))
    return run


class LoopThread:
    """An event loop running in a daemon thread of its own."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            self.loop.close()

    def start(self, switch_interval_s: float | None = None) -> LoopThread:
        """Start the thread (and, when given, set the interpreter's switch interval: how
        long one thread may run Python while another waits for the interpreter)."""
        if switch_interval_s is not None:
            sys.setswitchinterval(switch_interval_s)
        self._thread.start()
        return self

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on this thread's loop; its result, awaited from the caller's."""
        return await on_loop(self.loop)(coro)

    async def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the loop (what still runs there is dropped) and wait for the thread."""
        if self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(self._thread.join, timeout_s)


async def measure_lag(observe: Callable[[float], None], interval_s: float = 0.05) -> None:
    """Observe, every ``interval_s``, how late this loop woke: how long work already on it
    would keep a new arrival (an admission review) waiting."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))
