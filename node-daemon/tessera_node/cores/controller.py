"""One GPU's or MIG instance's core controller: one period reads what each container did,
decides each one's share of the device and writes the token rate that buys it into the
container's budget file.

Each container's target is the core budget (``cores``, percent) of its entry for this device
in its budget file; its processes are the live slots of its ledger. On a GPU, NVML's
per-process utilisation since the previous period (:mod:`.utilization`) is attributed to
containers (:mod:`.attribution`), and the rate law (:mod:`.ratelaw`) turns shares into rates;
in a MIG instance, where NVML measures nothing per process, the token law
(:mod:`.tokenlaw`) does, from the ledgers' token counts. The fair share (:mod:`.fairshare`)
decides the shares. Only ``rate`` and ``burst`` of an entry are the controller's; the rest of
the file is read again right before it is rewritten. The daemon's loop over every device is
:mod:`.runner`.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tessera_node import metrics
from tessera_node.budget.formats import BudgetEntry, BudgetFile
from tessera_node.budget.ledger import LedgerReader, LedgerView
from tessera_node.cores.attribution import Identities, attribute, live_identities
from tessera_node.cores.fairshare import Claim, FairShare, Grant, Sample
from tessera_node.cores.ratelaw import Observation, RateLaw
from tessera_node.cores.tokenlaw import TokenLaw, TokenSample
from tessera_node.cores.utilization import UtilizationSource
from tessera_node.metrics import CoreOwner, observe_core_shares

log = logging.getLogger("tessera_node.cores")

RATE_STEP = 0.005
"""Relative rate change below which the budget file is not rewritten."""


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
    write_error: str | None = None
    """Why its budget file could not be rewritten last time (logged once per reason)."""
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
            self._write_rate(t, rates[t.name], burst)
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

    def _write_rate(self, t: Tenant, rate: float, burst: Callable[[float], float]) -> None:
        """Rewrite the tenant's ``rate`` and ``burst`` (read again right before writing: only
        they are the controller's, and a resize may have rewritten the rest since the period
        began). A change below ``RATE_STEP`` is noise in the cost estimate: no write, no
        generation bump for every process of the container to notice. A file that cannot be
        rewritten keeps the rate written last; it is counted, logged once per reason, and
        tried again next period."""
        try:
            e = t.entries()[t.entry]
            if abs(rate - e.rate) > RATE_STEP * max(e.rate, 1.0):
                entries = list(t.entries())
                entries[t.entry] = replace(e, rate=rate, burst=burst(rate))
                t.budget.update(entries)
        except (OSError, ValueError, IndexError) as exc:
            metrics.ERRORS.labels("core-control").inc()
            why = f"{exc.__class__.__name__}: {exc}"
            if why != t.write_error:
                log.warning("budget file not rewritten: its rate stays", extra={
                    "unit": self.device, "container": t.name, "file": str(t.budget.path),
                    "error": why})
            t.write_error = why
            return
        if t.write_error is not None:
            log.info("budget file rewritten again", extra={"unit": self.device,
                                                           "container": t.name})
            t.write_error = None

    def period(self) -> dict[str, dict[str, float]]:
        """One period and its metrics."""
        report = self.step()
        observe_core_shares(self.device, {t.name: t.owner or CoreOwner(container=t.name)
                                          for t in self.tenants}, report)
        return report
