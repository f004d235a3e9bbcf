"""How late the event loop wakes: what work already on it would keep a new arrival (an
admission review) waiting."""

from __future__ import annotations

import asyncio
from collections.abc import Callable


async def measure_lag(observe: Callable[[float], None], interval_s: float = 0.05) -> None:
    """Observe, every ``interval_s``, how late this loop woke."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval_s
        await asyncio.sleep(interval_s)
        observe(max(0.0, loop.time() - due))
