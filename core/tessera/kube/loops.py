"""Loops of the operator's event loop: how late it wakes (what work already on it would keep
a new arrival, an admission review, waiting), and the level-triggered work loop its
controllers run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Iterable
from typing import TypeVar

from tessera.kube.client import ApiError

log = logging.getLogger("tessera.loops")

K = TypeVar("K", bound=Hashable)


async def measure_lag(observe: Callable[[float], None], interval_s: float = 0.05) -> None:
    """Observe, every ``interval_s``, how late this loop woke."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))


async def work_off(dirty: set[K], wake: asyncio.Event, every_s: float, debounce_s: float,
                   everything: Callable[[], Iterable[K]], handle: Callable[[K], Awaitable[None]],
                   what: str) -> None:
    """Handle each key marked ``dirty`` (``wake`` set), ``debounce_s`` after the first mark
    (marks within it are handled together), and every key of ``everything()`` every
    ``every_s``.  A key whose handling fails on the API is marked again and retried 1 s
    later (level-triggered: it is handled from what is current then)."""
    loop = asyncio.get_running_loop()
    last_full = loop.time()
    while True:
        try:
            await asyncio.wait_for(wake.wait(), max(0.0, last_full + every_s - loop.time()))
            await asyncio.sleep(debounce_s)
        except TimeoutError:
            pass
        wake.clear()
        if loop.time() - last_full >= every_s:
            dirty.update(everything())
            last_full = loop.time()
        while dirty:
            key = dirty.pop()
            try:
                await handle(key)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning(f"{what} failed", extra={"key": str(key), "error": str(exc)})
                dirty.add(key)
                await asyncio.sleep(1.0)
