"""The core controllers without the rest of the daemon (bare metal, tests, benchmarks)::

    python -m tessera_node.cores.standalone --device 0|GPU-…|MIG-… \\
        --container a:/srv/a/budget:/srv/a/ledger --container b:/srv/b/budget:/srv/b/ledger \\
        [--weight NAME=W] [--no-lend NAME] [--quota NAME=NS/QUOTA] [--interval S] \\
        [--duration S] [--log] [--metrics-port P] [--driver-root DIR]

It runs the daemon's own loop (:class:`~tessera_node.cores.runner.CoreControl`, its pacing,
its NVML reader :class:`~tessera_node.device.nvml.NvmlReader`, its plan of which containers
share a device) over the containers named here instead of those the device plugin set up:
what a benchmark measures with it is what the daemon runs. Each container's budget is entry
0 of its budget file; a ledger's file is named ``ledger``, as the device plugin makes it.
With ``--log`` every period prints one JSON line: ``t`` (seconds since start), ``cpu`` (the
controllers' CPU seconds inside their periods since start) and, per container, the period's
report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera.api.budget import PerShareBudget
from tessera.api.names import VGPU
from tessera_node.budget.formats import read_budget_file
from tessera_node.budget.writer import LEDGER
from tessera_node.cores.runner import CoreControl
from tessera_node.device.nvml import NvmlReader
from tessera_node.device.state import DeviceSnapshot
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_node.settings import DEFAULTS


@dataclass(frozen=True)
class Named:
    """One ``--container NAME:BUDGET:LEDGER`` with its weight, lending and quota."""

    name: str
    budget_file: str
    ledger: str
    weight: int = 1
    lend: bool = True
    quota: str | None = None
    """``namespace/name`` of its GPUQuota, for the metrics."""


def unit_of(device: str, snapshot: DeviceSnapshot) -> tuple[str, int, str]:
    """(unit UUID, its GPU's NVML index, the GPU's UUID) of ``device``: an NVML index, a
    ``GPU-`` UUID or a ``MIG-`` UUID."""
    for g in snapshot.gpus:
        if device in (str(g.index), g.uuid):
            return g.uuid, g.index, g.uuid
        for i in g.instances:
            if i.uuid and device == i.uuid:
                return i.uuid, g.index, g.uuid
    raise ValueError(f"no GPU or MIG instance {device} on this node")


def set_up(c: Named, unit: str, gpu: str) -> SetUpContainer:
    """The container as the device plugin's registry would hold it (budget from entry 0)."""
    if Path(c.ledger).name != LEDGER:
        raise ValueError(f"container {c.name}: its ledger file must be named {LEDGER!r}")
    entries = read_budget_file(c.budget_file).entries
    entry = entries[0] if entries else None
    budget = PerShareBudget(shares=1, memory_bytes=(entry.memory or 0) if entry else 0,
                            cores=(entry.cores if entry and entry.cores is not None else 100))
    ns = (c.quota or "").rpartition("/")[0]
    return SetUpContainer(
        key=c.name, pod_uid="", namespace=ns, pod="", container=c.name, resource=VGPU,
        units=(unit,), gpus=(gpu,), budget=budget, refused=None, budget_file=c.budget_file,
        ledger_dir=str(Path(c.ledger).parent), quota=c.quota, weight=c.weight,
        lending=c.lend)


def parse(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[Named]]:
    ap = argparse.ArgumentParser(prog="python -m tessera_node.cores.standalone")
    ap.add_argument("--device", default="0",
                    help="the GPU (NVML index or GPU- UUID) or MIG instance (MIG- UUID)")
    ap.add_argument("--container", action="append", default=[], metavar="NAME:BUDGET:LEDGER")
    ap.add_argument("--weight", action="append", default=[], metavar="NAME=WEIGHT",
                    help="a container's GPUQuota weight (1 when absent)")
    ap.add_argument("--no-lend", action="append", default=[], metavar="NAME",
                    help="a container whose GPUQuota neither lends nor borrows")
    ap.add_argument("--quota", action="append", default=[], metavar="NAME=QUOTA",
                    help="a container's GPUQuota (namespace/name), for the metrics")
    ap.add_argument("--interval", type=float, default=DEFAULTS.core_interval_s,
                    help="the period in seconds (the daemon's --core-interval)")
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--log", action="store_true", help="print one JSON line per period")
    ap.add_argument("--metrics-port", type=int, default=None,
                    help="serve Prometheus metrics (lent/borrowed core time, shares) here")
    ap.add_argument("--driver-root", default=DEFAULTS.driver_root,
                    help="where the NVIDIA driver's files are (libnvidia-ml.so.1 below it)")
    args = ap.parse_args(argv)
    weights = dict(w.split("=", 1) for w in args.weight)
    quotas = dict(q.split("=", 1) for q in args.quota)
    named = []
    for spec in args.container:
        name, budget, ledger = spec.split(":", 2)
        named.append(Named(name, budget, ledger, int(weights.get(name, 1)),
                           name not in args.no_lend, quotas.get(name)))
    return args, named


async def run(args: argparse.Namespace, named: Sequence[Named]) -> None:
    reader = NvmlReader(args.driver_root)
    try:
        unit, index, gpu = unit_of(args.device, await asyncio.to_thread(reader.read))
        containers = [set_up(c, unit, gpu) for c in named]
        cores = CoreControl(lambda: containers, lambda: {unit: index}, reader, args.interval)
        start = time.monotonic()

        def log(reports: dict[str, dict[str, dict[str, float]]]) -> None:
            if args.log:
                print(json.dumps({"t": round(time.monotonic() - start, 3),
                                  "cpu": round(cores.cpu_s, 5), **reports.get(unit, {})}),
                      flush=True)

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(args.duration):
                await cores.run(log)
    finally:
        reader.close()


def main(argv: Sequence[str] | None = None) -> int:
    args, named = parse(argv)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(args, named))
    return 0


if __name__ == "__main__":
    sys.exit(main())
