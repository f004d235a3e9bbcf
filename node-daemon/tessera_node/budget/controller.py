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

from tessera_node.budget.fairshare import Claim, FairShare, Grant, Sample
from tessera_node.budget.formats import BudgetEntry, BudgetFile
from tessera_node.budget.ledger import LedgerReader, LedgerView
from tessera_node.budget.ratelaw import Observation, RateLaw
from tessera_node.budget.tokenlaw import TokenLaw, TokenSample
from tessera_node.metrics import CoreOwner, observe_core_shares
from tessera_node.procfs import identity as proc_identity

IDENTITY_TTL_S = 1.0
RATE_STEP = 0.005
"""Relative rate change below which the budget file is not rewritten."""

Identity = tuple[int, int, int]
"""(PID inside the process's own namespace, start ticks, that namespace's inode): one
process, in any namespace (``tessera_node.procfs``)."""


def live_identities(led: LedgerView) -> set[Identity]:
    """The identities of a ledger's live processes (a slot written by a library that did not
    record its namespace carries 0 there)."""
    return {s.identity for s in led.slots if s.alive and s.start_ticks}


def named(ident: Identity | None, ids: set[Identity] | frozenset[Identity]) -> bool:
    """Whether a process's identity is one of ``ids`` (namespace unknown: 0 in ``ids``)."""
    return ident is not None and (ident in ids or (ident[0], ident[1], 0) in ids)


class Identities:
    """``proc_identity`` per host PID, read from /proc once and kept while it names a live
    ledger slot (an identity names one process, and a slot is live only while its process
    is, so that PID is still that process); an identity that names no live slot is read
    again once it is ``IDENTITY_TTL_S`` old (the PID may be another process's now)."""

    def __init__(self) -> None:
        self._seen: dict[int, tuple[float, Identity | None]] = {}

    def __call__(self, pid: int, live: frozenset[Identity] | set[Identity] = frozenset()
                 ) -> Identity | None:
        now = time.monotonic()
        hit = self._seen.get(pid)
        if hit is not None and (named(hit[1], live) or hit[0] > now):
            return hit[1]
        ident = proc_identity(pid)
        self._seen[pid] = (now + IDENTITY_TTL_S, ident)
        if len(self._seen) > 4096:
            self._seen = {p: v for p, v in self._seen.items() if v[0] > now}
        return ident


def attribute(
    led: LedgerView,
    busy_by_pid: dict[int, float],
    identity: Callable[[int], Identity | None] = proc_identity,
) -> float:
    """Busy share of a container's processes. NVML reports host PIDs; the ledger holds PIDs
    as the container sees them, their start time and their PID namespace, which together
    name the same process from every namespace."""
    ids = live_identities(led)
    plain = {s.pid for s in led.slots if s.alive and not s.start_ticks}
    total = 0.0
    for pid, busy in busy_by_pid.items():
        if named(identity(pid), ids) or pid in plain:
            total += busy
    return total


class UtilizationSource(Protocol):
    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        """Busy fraction per PID over the window (start, end) in wall-clock seconds that the
        newest samples cover, or ({}, None) when there is nothing new."""
        ...


class ReaderUtilization:
    """The daemon's NVML reader's per-process utilisation of one GPU (by index), since the
    last sample seen: the same answers as :class:`NvmlUtilization` through the reader's
    lock, so a MIG change that pauses NVML pauses the controller's reads too."""

    def __init__(self, reader: ProcessUtilization, index: int) -> None:
        self._reader = reader
        self._index = index
        self._last_us = 0

    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        got = self._reader.process_utilization(self._index, self._last_us)
        if got is None:
            return {}, None
        busy, newest = got
        first, start = self._last_us == 0, self._last_us
        self._last_us = max(self._last_us, newest)
        if first or self._last_us <= start:
            return {}, None  # the first answer covers an unknown span: only a baseline
        return {pid: pct / 100.0 for pid, pct in busy.items()}, (start / 1e6, newest / 1e6)


class ProcessUtilization(Protocol):
    def process_utilization(self, index: int, since_us: int
                            ) -> tuple[dict[int, float], int] | None: ...


class NvmlUtilization:
    """``nvmlDeviceGetProcessUtilization`` since the last sample seen."""

    def __init__(self, device: int | str) -> None:
        import pynvml

        self._nvml: Any = pynvml
        pynvml.nvmlInit()
        self._handle = (pynvml.nvmlDeviceGetHandleByIndex(device) if isinstance(device, int)
                        else pynvml.nvmlDeviceGetHandleByUUID(device))
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
    weight: float = 1.0  # its GPUQuota's weight
    lend: bool = True  # False: its GPUQuota opted out of lending and borrowing
    owner: CoreOwner | None = None  # its pod and GPUQuota, for the metrics
    readings: deque[tuple[float, float, int]] = field(default_factory=lambda: deque(maxlen=64))
    """(wall time, tokens taken, waits for tokens) at each step."""
    _parsed: tuple[int, list[BudgetEntry]] | None = None
    _reader: LedgerReader | None = None

    def reader(self) -> LedgerReader:
        if self._reader is None:
            self._reader = LedgerReader(self.ledger)
        return self._reader

    def entries(self) -> list[BudgetEntry]:
        """The budget file's entries now (parsed again only when its generation moved); the
        list is shared: copy it before changing it."""
        gen = self.budget.generation
        if self._parsed is None or self._parsed[0] != gen:
            self._parsed = (gen, self.budget.read().entries)
        return self._parsed[1]

    def tokens_at(self, t: float) -> float | None:
        """Tokens taken by wall time t, interpolated between readings."""
        r = self.readings
        if not r or t < r[0][0]:
            return None
        if t >= r[-1][0]:
            return r[-1][1]
        t1, v1 = r[-1][0], r[-1][1]
        for i in range(len(r) - 2, -1, -1):  # newest first: t is a recent time
            t0, v0, _ = r[i]
            if t0 <= t:
                return v0 if t1 == t0 else v0 + (v1 - v0) * (t - t0) / (t1 - t0)
            t1, v1 = t0, v0
        return r[0][1]

    def waited_since(self, t: float) -> bool:
        """Whether it waited for tokens between the last reading at or before t and now."""
        r = self.readings
        for i in range(len(r) - 1, -1, -1):
            if r[i][0] <= t:
                return r[-1][2] > r[i][2]
        return False


@dataclass
class Controller:
    """One GPU or MIG instance. ``source`` None: no per-process utilisation (a MIG instance),
    the token law runs instead of the rate law."""

    source: UtilizationSource | None
    tenants: list[Tenant]
    device: str = "0"  # for the metrics' labels
    law: RateLaw = field(default_factory=RateLaw)
    fair: FairShare = field(default_factory=FairShare)
    tokens: TokenLaw = field(default_factory=TokenLaw)
    last: float | None = None
    identities: Identities = field(default_factory=Identities)
    cpu_s: float = 0.0
    """CPU time spent in periods (reading, deciding, writing, metrics), since start."""
    views: dict[str, LedgerView] = field(default_factory=dict)
    """This period's ledgers, by container."""

    def step(self) -> dict[str, dict[str, float]]:
        now = time.time()
        self.views = {}
        for t in self.tenants:
            with contextlib.suppress(OSError, ValueError, IndexError):  # no process joined yet
                view = t.reader().read(only=t.entry)
                dev = view.devices[t.entry]
                t.readings.append((now, dev.tokens, dev.waits))
                self.views[t.name] = view
        claims: dict[str, Claim] = {}
        for t in self.tenants:
            with contextlib.suppress(OSError, ValueError):
                entries = t.entries()
                cores = entries[t.entry].cores if t.entry < len(entries) else None
                if cores is not None:
                    claims[t.name] = Claim(min(100.0, cores) / 100.0, t.weight, t.lend)
        for name in set(self.law.tenants) - set(claims):
            self.law.remove(name)
        report = (self._step_tokens(now, claims) if self.source is None
                  else self._step_busy(claims))
        self.last = now
        return report

    def _step_busy(self, claims: dict[str, Claim]) -> dict[str, dict[str, float]]:
        assert self.source is not None
        busy_by_pid, window = self.source.sample()
        if window is None:
            for name, c in claims.items():
                if name not in self.law.tenants:
                    self.law.set_target(name, c.budget)
            return {}  # nothing measured: rates stay as they are
        observations: dict[str, Observation] = {}
        samples: dict[str, Sample] = {}
        live = set().union(*(live_identities(v) for v in self.views.values()))
        idents = {pid: self.identities(pid, live) for pid in busy_by_pid}  # once per period
        for t in self.tenants:
            if t.name not in claims:
                continue
            led = self.views.get(t.name)
            if led is None:
                continue
            a, b = t.tokens_at(window[0]), t.tokens_at(window[1])
            if a is None or b is None:
                continue
            busy = attribute(led, busy_by_pid, idents.get)
            observations[t.name] = Observation(
                busy=busy, tokens=max(0.0, b - a), seconds=window[1] - window[0]
            )
            samples[t.name] = Sample(use=busy, throttled=t.waited_since(window[0]),
                                     launched=b - a > 0)
        gpu = sum(busy_by_pid.values())
        grants = self.fair.step(claims, samples, saturated=gpu >= self.law.saturated_at)
        for name, g in grants.items():
            self.law.set_target(name, min(1.0, g.share))
        rates = self.law.step(observations, gpu_busy=gpu)
        spent = {n: o.tokens for n, o in observations.items()}
        return self._publish(claims, grants, rates, samples, spent, self.law.burst,
                             window[1] - window[0])

    def _step_tokens(self, now: float, claims: dict[str, Claim]) -> dict[str, dict[str, float]]:
        if self.last is None:
            return {}
        token_samples: dict[str, TokenSample] = {}
        for t in self.tenants:
            if t.name not in claims:
                continue
            a, b = t.tokens_at(self.last), t.tokens_at(now)
            if a is None or b is None:
                continue
            token_samples[t.name] = TokenSample(max(0.0, b - a), now - self.last,
                                                t.waited_since(self.last))
        wanting = self.tokens.observe(token_samples)
        uses = self.tokens.uses(token_samples)
        samples = {n: Sample(use=uses[n], throttled=n in wanting,
                             launched=token_samples[n].tokens > 0) for n in token_samples}
        grants = self.fair.step(claims, samples)
        rates = self.tokens.rates({n: g.share for n, g in grants.items()})
        spent = {n: s.tokens for n, s in token_samples.items()}
        return self._publish(claims, grants, rates, samples, spent, self.tokens.burst,
                             now - self.last)

    def _publish(
        self,
        claims: dict[str, Claim],
        grants: dict[str, Grant],
        rates: dict[str, float],
        samples: dict[str, Sample],
        spent: dict[str, float],
        burst: Callable[[float], float],
        seconds: float,
    ) -> dict[str, dict[str, float]]:
        report: dict[str, dict[str, float]] = {}
        for t in self.tenants:
            g = grants.get(t.name)
            if g is None or t.name not in rates:
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                # read again right before writing: only rate and burst are the controller's
                # (a resize may have rewritten the rest since the period began)
                e = t.entries()[t.entry]
                if abs(rates[t.name] - e.rate) > RATE_STEP * max(e.rate, 1.0):
                    # a change below RATE_STEP is noise in the cost estimate: no write, no
                    # generation bump for every process of the container to notice
                    entries = list(t.entries())
                    entries[t.entry] = replace(e, rate=rates[t.name], burst=burst(rates[t.name]))
                    t.budget.update(entries)
            s = samples.get(t.name)
            report[t.name] = {
                "target": claims[t.name].budget, "share": g.share, "lent": g.lent,
                "borrowed": g.borrowed, "rate": rates[t.name],
            }
            if s is not None:
                report[t.name]["busy"] = s.use
                report[t.name]["tokens"] = spent.get(t.name, 0.0)
                report[t.name]["throttled"] = float(s.throttled)
                report[t.name]["seconds"] = seconds
        return report

    def period(self) -> dict[str, dict[str, float]]:
        """One period and its metrics, its CPU time counted in ``cpu_s``."""
        cpu0 = time.thread_time()
        report = self.step()
        observe_core_shares(self.device, {t.name: t.owner or CoreOwner(container=t.name)
                                          for t in self.tenants}, report)
        self.cpu_s += time.thread_time() - cpu0
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
            report = self.period()
            if on_step:
                on_step(time.monotonic() - start, report)
            delay = next_t - time.monotonic()
            if delay > 0:
                time.sleep(delay)


def parse_container(spec: str) -> Tenant:
    name, budget, ledger = spec.split(":", 2)
    return Tenant(name=name, budget=BudgetFile(budget), ledger=Path(ledger))


def utilization_source(device: str) -> UtilizationSource | None:
    """NVML per-process utilisation of a GPU (index or ``GPU-`` UUID); None for a MIG device
    (``MIG-`` UUID), where NVML has none and the controller runs on token counts."""
    if device.upper().startswith("MIG-"):
        return None
    return NvmlUtilization(int(device) if device.isdigit() else device)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tessera_node.budget.controller")
    ap.add_argument("--device", default="0",
                    help="the GPU (NVML index or GPU- UUID) or MIG instance (MIG- UUID)")
    ap.add_argument("--container", action="append", default=[], metavar="NAME:BUDGET:LEDGER")
    ap.add_argument("--weight", action="append", default=[], metavar="NAME=WEIGHT",
                    help="a container's GPUQuota weight (1 when absent)")
    ap.add_argument("--no-lend", action="append", default=[], metavar="NAME",
                    help="a container whose GPUQuota neither lends nor borrows")
    ap.add_argument("--entry", type=int, default=0, help="budget entry of this GPU")
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--log", action="store_true", help="print one JSON line per step")
    ap.add_argument("--quota", action="append", default=[], metavar="NAME=QUOTA",
                    help="a container's GPUQuota (namespace/name), for the metrics")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus metrics (lent/borrowed core time, shares) here")
    args = ap.parse_args(argv)
    tenants = [parse_container(s) for s in args.container]
    weights = dict(w.split("=", 1) for w in args.weight)
    for t in tenants:
        t.entry = args.entry
        t.weight = float(weights.get(t.name, 1))
        t.lend = t.name not in args.no_lend
    quotas = dict(q.split("=", 1) for q in args.quota)
    for t in tenants:
        ns, _, quota = quotas.get(t.name, "").rpartition("/")
        t.owner = CoreOwner(namespace=ns, container=t.name, quota=quota)
    ctl = Controller(utilization_source(args.device), tenants, device=args.device)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)

    def log(t: float, report: dict[str, dict[str, float]]) -> None:
        if args.log:
            print(json.dumps({"t": round(t, 3), "cpu": round(ctl.cpu_s, 5), **report}),
                  flush=True)

    with contextlib.suppress(KeyboardInterrupt):
        ctl.run(args.interval, args.duration, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
