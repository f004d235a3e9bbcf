"""Stopping a server that others hold kept-alive connections to, without failing a request.

A client (the API server calling a webhook) keeps HTTP/1.1 connections open and sends the
next request on one of them. A server that closes such a connection while the client writes
a request on it fails that request (the client reads EOF, and it does not retry a POST). So a
stop is drained first: for ``seconds`` the process goes on serving while ``draining`` is
true (readiness fails, and every answer closes its connection, which the client then does
not reuse); only then does it stop. By then the clients have moved to the other replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

log = logging.getLogger("tessera.shutdown")


class Drain:
    def __init__(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a drain takes seconds >= 0, got {seconds}")
        self.seconds = seconds
        self.draining = False
        self._timer: asyncio.TimerHandle | None = None

    def stop(self, stop: Callable[[], object]) -> None:
        """A request to stop (each SIGTERM or SIGINT), in the event loop: the first starts
        the drain and ``stop`` runs when it is over; another, or a drain of 0 s, stops at
        once."""
        if self.draining or self.seconds == 0:
            if self._timer is not None:
                self._timer.cancel()
            stop()
            return
        self.draining = True
        log.info("stopping: serving %.1f s more, closing each connection after its answer",
                 self.seconds)
        self._timer = asyncio.get_running_loop().call_later(self.seconds, stop)


__all__ = ["Drain"]
