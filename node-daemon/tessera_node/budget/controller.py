"""Per-GPU core-share controller: NVML per-process utilisation in, token rates out.

Standalone use (bare metal, tests, benchmarks)::

    python -m tessera_node.budget.controller --device 0 \\
        --container a:/srv/a/budget:/srv/a/ledger --container b:/srv/b/budget:/srv/b/ledger

Each container's target is the core budget (``cores``, percent) of entry ``--entry`` in its
budget file; its processes are the live slots of its ledger. NVML reports host PIDs; the
controller (in the host PID namespace) matches each to a slot by the PID the process sees
itself as (innermost ``NSpid``) and its start time, from ``/proc``. Every interval it reads
NVML's per-process utilisation since the previous interval, attributes it to containers,
runs the rate law and rewrites ``rate``/``burst`` of that entry in each budget file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from tessera_node.budget.formats import BudgetFile
from tessera_node.budget.ledger import LedgerView, read_ledger
from tessera_node.budget.ratelaw import Observation, RateLaw


def proc_identity(pid: int) -> tuple[int, int] | None:
    """(PID inside the process's own namespace, start ticks) of a host PID, from /proc."""
    try:
        start = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        inner = pid
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                inner = int(line.split()[-1])
        return inner, start
    except (OSError, ValueError, IndexError):
        return None


def attribute(led: LedgerView, busy_by_pid: dict[int, float]) -> float:
    """Busy share of a container's processes. NVML reports host PIDs; the ledger holds PIDs
    as the container sees them plus their start time, which names the same process in every
    PID namespace."""
    ids = {(s.pid, s.start_ticks) for s in led.slots if s.alive and s.start_ticks}
    plain = {s.pid for s in led.slots if s.alive and not s.start_ticks}
    total = 0.0
    for pid, busy in busy_by_pid.items():
        ident = proc_identity(pid)
        if (ident is not None and ident in ids) or pid in plain:
            total += busy
    return total


class UtilizationSource(Protocol):
    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        """Busy fraction per PID over the window (start, end) in wall-clock seconds that the
        newest samples cover, or ({}, None) when there is nothing new."""
        ...


class NvmlUtilization:
    """``nvmlDeviceGetProcessUtilization`` since the last sample seen."""

    def __init__(self, index: int) -> None:
        import pynvml

        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._last_us = 0

    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        try:
            samples = self._nvml.nvmlDeviceGetProcessUtilization(self._handle, self._last_us)
        except self._nvml.NVMLError as exc:
            if getattr(exc, "value", None) == self._nvml.NVML_ERROR_NOT_FOUND:
                return {}, None
            raise
        first = self._last_us == 0
        start = self._last_us
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = out.get(int(s.pid), 0.0) + float(s.smUtil) / 100.0
            self._last_us = max(self._last_us, int(s.timeStamp))
        if first or self._last_us <= start:
            return {}, None  # the first answer covers an unknown span: only a baseline
        return out, (start / 1e6, self._last_us / 1e6)


@dataclass
class Tenant:
    name: str
    budget: BudgetFile
    ledger: Path
    entry: int = 0
    readings: deque[tuple[float, float]] = field(default_factory=lambda: deque(maxlen=64))

    def tokens_at(self, t: float) -> float | None:
        """Tokens taken by wall time t, interpolated between readings."""
        r = self.readings
        if not r or t < r[0][0]:
            return None
        for (t0, v0), (t1, v1) in zip(r, list(r)[1:], strict=False):
            if t0 <= t <= t1:
                return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
        return r[-1][1]


class Controller:
    def __init__(
        self, source: UtilizationSource, tenants: list[Tenant], law: RateLaw | None = None
    ) -> None:
        self.source = source
        self.tenants = tenants
        self.law = law or RateLaw()

    def step(self) -> dict[str, dict[str, float]]:
        now = time.time()
        for t in self.tenants:
            with contextlib.suppress(OSError, ValueError):  # no process has joined yet
                t.readings.append((now, read_ledger(t.ledger).devices[t.entry].tokens))
        busy_by_pid, window = self.source.sample()
        observations: dict[str, Observation] = {}
        report: dict[str, dict[str, float]] = {}
        for t in self.tenants:
            entries = t.budget.read().entries
            target = entries[t.entry].cores if t.entry < len(entries) else None
            if target is None:
                self.law.remove(t.name)
                continue
            self.law.set_target(t.name, min(100.0, target) / 100.0)
            if window is None:
                continue
            try:
                led = read_ledger(t.ledger)
            except (OSError, ValueError):
                continue
            a, b = t.tokens_at(window[0]), t.tokens_at(window[1])
            if a is None or b is None:
                continue
            spent = max(0.0, b - a)
            busy = attribute(led, busy_by_pid)
            observations[t.name] = Observation(
                busy=busy, tokens=spent, seconds=window[1] - window[0]
            )
            report[t.name] = {"busy": busy, "tokens": spent, "target": target / 100.0}
        if window is None:
            return report  # nothing measured: rates stay as they are
        rates = self.law.step(observations, gpu_busy=sum(busy_by_pid.values()))
        for t in self.tenants:
            if t.name not in rates:
                continue
            entries = t.budget.read().entries
            e = entries[t.entry]
            entries[t.entry] = replace(e, rate=rates[t.name], burst=self.law.burst(rates[t.name]))
            t.budget.update(entries)
            report.setdefault(t.name, {})["rate"] = rates[t.name]
        return report

    def run(
        self,
        interval: float,
        duration: float | None = None,
        on_step: Callable[[float, dict[str, dict[str, float]]], None] | None = None,
    ) -> None:
        start = time.monotonic()
        next_t = start
        while duration is None or time.monotonic() - start < duration:
            next_t += interval
            report = self.step()
            if on_step:
                on_step(time.monotonic() - start, report)
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def parse_container(spec: str) -> Tenant:
    name, budget, ledger = spec.split(":", 2)
    return Tenant(name=name, budget=BudgetFile(budget), ledger=Path(ledger))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera_node.budget.controller")
    ap.add_argument("--device", type=int, default=0, help="NVML index of the GPU")
    ap.add_argument("--container", action="append", default=[], metavar="NAME:BUDGET:LEDGER")
    ap.add_argument("--entry", type=int, default=0, help="budget entry of this GPU")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--log", action="store_true", help="print one JSON line per step")
    args = ap.parse_args(argv)
    tenants = [parse_container(s) for s in args.container]
    for t in tenants:
        t.entry = args.entry
    ctl = Controller(NvmlUtilization(args.device), tenants)

    def log(t: float, report: dict[str, dict[str, float]]) -> None:
        if args.log:
            print(json.dumps({"t": round(t, 3), **report}), flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        ctl.run(args.interval, args.duration, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
