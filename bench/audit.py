"""The node daemon's audit, on a simulated node of 8 H100s, ratios from one run.

    python bench/audit.py [--processes 24] [--passes 30]

Real processes (``sim/tests/workload.py``, each holding device memory) in real pod cgroups,
one tessera container each in the registry with its budget file. Measured in the same run:

1. one audit pass (NVML read, budget files and ledgers, /proc of every process, the pure
   decisions, the per-container metrics; nothing over budget, so no API call) against the
   honest baseline: the NVML read of the whole node that every pass starts with (and that
   the daemon's own poll makes anyway) — the ratio is what the audit adds on top;
2. the same with every process foreign (an empty registry): every decision "foreign", the
   confirmation state one entry per process (findings left unconfirmed within the run, so
   no Event is posted: the API server is not part of the figure);
3. CPU share of a core at the default interval (10 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import ssl
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "e2e"), str(REPO / "sim")]

from tessera.api.budget import PerShareBudget  # noqa: E402
from tessera.api.names import VGPU  # noqa: E402
from tessera.kube.client import Credentials, Kube  # noqa: E402
from tessera_e2e.gpubed.daemons import SimNode  # noqa: E402
from tessera_e2e.gpubed.workloads import Cgroups, Workload, require  # noqa: E402
from tessera_node.audit.runner import AuditRunner  # noqa: E402
from tessera_node.budget.formats import BudgetEntry, BudgetFile  # noqa: E402
from tessera_node.device.nvml import NvmlReader  # noqa: E402
from tessera_node.deviceplugin.registry import SetUpContainer  # noqa: E402
from tessera_node.settings import DEFAULTS  # noqa: E402
from tessera_sim import BUILD_DIR  # noqa: E402

MIB = 1 << 20


def cpu_median(fn, passes: int) -> float:  # type: ignore[no-untyped-def]
    """Median CPU seconds of this process per call (the machine is shared: not wall time)."""
    out = []
    for _ in range(passes):
        t0 = time.process_time()
        fn()
        out.append(time.process_time() - t0)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=24)
    ap.add_argument("--passes", type=int, default=30)
    args = ap.parse_args()
    require()
    tmp = Path(tempfile.mkdtemp(prefix="bench-audit-"))
    sim = SimNode(tmp / "sim", "bench", ["H100-80GB"] * 8)
    os.environ["TESSERA_SIM_NODE"] = sim.env["TESSERA_SIM_NODE"]
    gpus = [w.rstrip(")") for w in sim.smi("-L").stdout.split() if w.startswith("GPU-")]
    cg = Cgroups()
    workloads, containers = [], []
    try:
        for i in range(args.processes):
            uid, cid = str(uuid.uuid4()), uuid.uuid4().hex * 2
            gpu = gpus[i % len(gpus)]
            state = tmp / f"c{i}"
            (state / "run").mkdir(parents=True)
            with BudgetFile(state / "budget") as b:
                b.update([BudgetEntry(0, gpu, memory=256 * MIB, cores=25)])
            containers.append(SetUpContainer(
                key=state.name, pod_uid=uid, namespace="bench", pod=f"pod-{i}",
                container="app", resource=VGPU, units=(gpu,), gpus=(gpu,),
                budget=PerShareBudget(shares=1, memory_bytes=256 * MIB, cores=25),
                refused=None, budget_file=str(state / "budget"),
                ledger_dir=str(state / "run"), container_id=cid))
            workloads.append(Workload(sim.env, cg.container(uid, cid), "hold", "128",
                                      device=gpu))
        reader = NvmlReader(str(BUILD_DIR))
        kube = Kube(Credentials("https://127.0.0.1:1", ssl.create_default_context(), {}))

        def audit_with(set_up: list[SetUpContainer]) -> tuple[float, int, int]:
            # never confirmed within the run: the decisions, not the Events, are measured
            runner = AuditRunner(kube, "bench", lambda: set_up, reader, 10.0,
                                 confirm=args.passes + 1, own_pid=0)
            loop = asyncio.new_event_loop()
            try:
                seconds = cpu_median(lambda: loop.run_until_complete(runner.audit_once()),
                                     args.passes)
            finally:
                loop.close()
            assert runner.last is not None
            return seconds, len(runner.last.over), len(runner.last.foreign)

        nvml = cpu_median(reader.read, args.passes)
        owned, over, foreign = audit_with(containers)
        assert over == 0 and foreign == 0, (over, foreign)
        alien, _, foreign = audit_with([])
        assert foreign == args.processes
        reader.close()
        print(f"node: 8 simulated H100s, {args.processes} processes holding 128 MiB each, "
              f"each in its own pod cgroup; medians of {args.passes} passes, CPU time")
        print(f"NVML read of the node (baseline): {nvml * 1e3:.2f} ms")
        print(f"audit pass, {args.processes} tessera containers: {owned * 1e3:.2f} ms "
              f"= {owned / nvml:.2f}x the NVML read")
        print(f"audit pass, every process foreign: {alien * 1e3:.2f} ms "
              f"= {alien / nvml:.2f}x the NVML read")
        print(f"CPU share at --audit-interval {DEFAULTS.audit_interval_s:g} s: "
              f"{owned / DEFAULTS.audit_interval_s * 100:.3f} % of a core")
    finally:
        for w in workloads:
            w.stop()
        cg.remove()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
