"""The daemon's core-control loop: one controller per GPU or MIG instance that holds a
core-budgeted container, following the containers the device plugin set up (also what the
standalone command, :mod:`.standalone`, and the benchmarks run).

Every ``interval`` (0.1 s): which containers share which unit (:func:`plan`, pure: from
the container registry, each container's budget file entry for that unit, its GPUQuota's
weight and lending), then one period of each unit's :class:`~tessera_node.cores.controller.
Controller` (read utilisation and ledgers, fair share, rewrite ``rate``/``burst``). A GPU's
controller reads NVML's per-process utilisation through the daemon's reader (so a MIG change
pausing NVML pauses it too); a MIG instance's runs on the ledgers' token counts (NVML says
nothing per process there). A controller's learnt state (cost per token, lending) lives as
long as its unit has containers; a container that ends leaves its controller and its
per-container series.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.api.names import VGPU
from tessera_node import metrics
from tessera_node.budget.formats import BudgetFile
from tessera_node.cores.controller import Controller, Tenant
from tessera_node.cores.utilization import ProcessUtilization, ReaderUtilization
from tessera_node.device.nvml import DeviceError
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_node.metrics import CoreOwner

log = logging.getLogger("tessera_node.cores.runner")


@dataclass(frozen=True)
class TenantSpec:
    """One container on one unit, as its controller needs it."""

    name: str
    """The container's allocation key (unique on the node)."""
    budget_file: str
    ledger: str
    entry: int
    """Its budget file's entry for this unit (the unit's position among its devices)."""
    weight: float
    lend: bool
    owner: CoreOwner


def plan(containers: Sequence[SetUpContainer], gpu_index: Mapping[str, int]
         ) -> dict[str, list[TenantSpec]]:
    """Unit UUID -> the containers its controller runs (pure). A unit gets a controller
    when at least one container there has a core budget below the whole unit; containers
    without a budget (refused) or on whole MIG instances (theirs alone) are not controlled.
    ``gpu_index``: the units known now (a unit gone from the node has no controller)."""
    out: dict[str, list[TenantSpec]] = {}
    for c in containers:
        if c.budget is None or c.refused is not None or c.resource != VGPU:
            continue
        for i, unit in enumerate(c.units):
            if unit not in gpu_index:
                continue
            out.setdefault(unit, []).append(TenantSpec(
                name=c.key, budget_file=c.budget_file,
                ledger=str(c.ledger), entry=i,
                weight=float(c.weight), lend=c.lending,
                owner=CoreOwner(c.namespace, c.pod, c.container, _quota_name(c.quota))))
    controlled = {c.key for c in containers
                  if c.budget is not None and c.resource == VGPU and c.budget.cores < 100}
    return {u: ts for u, ts in out.items() if any(t.name in controlled for t in ts)}


def _quota_name(quota: str | None) -> str:
    return (quota or "").rpartition("/")[2]


class CoreControl:
    """The node's controllers (I/O: budget files, ledgers, NVML through the reader)."""

    def __init__(self, containers: Callable[[], Sequence[SetUpContainer]],
                 units: Callable[[], Mapping[str, int]], reader: ProcessUtilization,
                 interval_s: float) -> None:
        self.containers = containers
        self.units = units
        self.reader = reader
        self.interval_s = interval_s
        self.controllers: dict[str, Controller] = {}
        self.cpu_s = 0.0
        """CPU time spent in the controllers' periods (reading, deciding, writing, metrics)
        since start: ``tessera_node_core_control_cpu_seconds_total``."""

    def step(self) -> dict[str, dict[str, dict[str, float]]]:
        """One period of every unit's controller (a worker thread); each unit's report (per
        controlled container: its target, share, lent, borrowed, rate and, where measured,
        busy share, tokens, whether it waited for them and the window's seconds)."""
        reports: dict[str, dict[str, dict[str, float]]] = {}
        wanted = plan(self.containers(), self.units())
        for unit in set(self.controllers) - set(wanted):
            self._retire(unit, self.controllers.pop(unit).tenants)
        for unit, specs in wanted.items():
            ctl = self.controllers.get(unit)
            if ctl is None:
                source = (None if unit.upper().startswith("MIG-")
                          else ReaderUtilization(self.reader, self.units()[unit]))
                ctl = self.controllers[unit] = Controller(source, [], device=unit)
                log.info("core controller started", extra={"unit": unit})
            self._sync(unit, ctl, specs)
            cpu0 = time.thread_time()
            try:
                reports[unit] = ctl.period()
            except (OSError, ValueError, DeviceError) as exc:
                metrics.ERRORS.labels("core-control").inc()
                log.warning("core controller period failed",
                            extra={"unit": unit, "error": str(exc)})
            finally:
                spent = time.thread_time() - cpu0
                self.cpu_s += spent
                metrics.CORE_CONTROL_CPU.inc(spent)
        metrics.CORE_CONTROLLED_UNITS.set(len(self.controllers))
        return reports

    def _sync(self, unit: str, ctl: Controller, specs: Sequence[TenantSpec]) -> None:
        have = {t.name: t for t in ctl.tenants}
        want = {s.name: s for s in specs}
        self._retire(unit, [t for n, t in have.items() if n not in want])
        tenants = []
        for name, s in want.items():
            t = have.get(name)
            if t is None or t.entry != s.entry or str(t.ledger) != s.ledger:
                t = Tenant(name=name, budget=BudgetFile(s.budget_file), ledger=Path(s.ledger),
                           entry=s.entry)
                metrics.core_series(unit, name, s.owner)  # its series from the start
            elif t.owner is not None and t.owner != s.owner:
                # a claim's pod seen only after the claim was prepared: its series move
                metrics.forget_core_container(unit, t.owner)
                metrics.core_series(unit, name, s.owner)
            t.weight, t.lend, t.owner = s.weight, s.lend, s.owner
            tenants.append(t)
        ctl.tenants = tenants

    def _retire(self, unit: str, tenants: Sequence[Tenant]) -> None:
        for t in tenants:
            with contextlib.suppress(OSError):
                t.reader().close()
            if t.owner is not None:
                metrics.forget_core_container(unit, t.owner)

    async def run(self, on_period: Callable[[dict[str, dict[str, dict[str, float]]]], None]
                  | None = None) -> None:
        """The supervised task: a period every ``interval_s``, in a worker thread;
        ``on_period`` is handed each period's reports (the standalone command logs them)."""
        next_t = time.monotonic()
        while True:
            reports = await asyncio.to_thread(self.step)
            if on_period is not None:
                on_period(reports)
            next_t += self.interval_s
            delay = next_t - time.monotonic()
            if delay < 0:  # overran (a slow NVML read): start again from now
                next_t, delay = time.monotonic(), 0.0
            await asyncio.sleep(delay)
