"""Keeps the kubelet's PodResources ``List`` away from the kubelet's allocations in flight.

A ``List`` makes the kubelet rebuild its table of allocated devices from the allocations it
has recorded (``UpdateAllocatedDevices``). The kubelet records an allocation only once the
plugin's ``Allocate`` has returned, so a rebuild that runs while a container's devices are
being allocated (from the kubelet's choice of devices, after ``GetPreferredAllocation``, to
just after ``Allocate`` returns) forgets them, and the kubelet can then hand the same
devices to the next pod (kubernetes/kubernetes#137534, open in 1.34). Two containers on one
device ID would share one budget file and ledger (docs/node-daemon.md, "Why Get, not List").

tessera-node asks the kubelet with ``Get`` (which rebuilds nothing) wherever the kubelet has
it; where it does not, every ``List`` it makes goes through this gate: it waits while a
``GetPreferredAllocation`` or ``Allocate`` is being answered and for ``settle_s`` after,
and those calls wait while a ``List`` is in flight. The kubelet calls ``Allocate`` right
after ``GetPreferredAllocation``; ``window_s`` closes the gap when it never does.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class AllocationGate:
    def __init__(self, settle_s: float = 0.2, window_s: float = 2.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settle_s = settle_s
        self.window_s = window_s
        self.clock = clock
        self._cond = threading.Condition()
        self._answering = 0
        self._quiet_from = 0.0
        self._listing = False

    @contextmanager
    def answering(self, then_allocate: bool) -> Iterator[None]:
        """Around the answer to ``GetPreferredAllocation`` (``then_allocate``: the kubelet's
        ``Allocate`` follows) or ``Allocate``. Waits at most ``window_s`` for a ``List`` in
        flight (the kubelet's own timeout on it bounds it anyway)."""
        with self._cond:
            self._cond.wait_for(lambda: not self._listing, self.window_s)
            self._answering += 1
        try:
            yield
        finally:
            with self._cond:
                self._answering -= 1
                quiet = self.clock() + (self.window_s if then_allocate else self.settle_s)
                self._quiet_from = quiet if not then_allocate else max(self._quiet_from, quiet)
                self._cond.notify_all()

    @contextmanager
    def listing(self, max_wait_s: float) -> Iterator[None]:
        """Around a ``List``; TimeoutError when allocations went on for ``max_wait_s``."""
        deadline = self.clock() + max_wait_s
        with self._cond:
            while self._answering or self.clock() < self._quiet_from:
                now = self.clock()
                if now >= deadline:
                    raise TimeoutError(
                        f"the kubelet allocated devices for {max_wait_s:g} s without a pause")
                wait = min(deadline, max(self._quiet_from, now + 0.01)) - now
                self._cond.wait(wait)
            self._listing = True
        try:
            yield
        finally:
            with self._cond:
                self._listing = False
                self._cond.notify_all()
