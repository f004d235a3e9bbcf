"""Node daemon benchmark: 50 tessera-node processes on 50 simulated nodes of 8 H100s each,
against the local control plane (etcd + kube-apiserver only: nothing else writes Nodes).

1. time from starting all 50 daemons to every Node carrying its full inventory;
2. one daemon idle for 60 s (partitions settled, resync every 5 s, NVML read every second):
   its CPU (utime+stime from /proc) and peak RSS (goals: < 1 % of a core, < 80 MiB), and
   its writes in that minute (goal: 0) -- counted twice: its own write counter and its
   Node's resourceVersion (no other writer runs);
3. the partition changed to seven 1g.10gb instances per GPU (MIG enabled, 7 GIs, 7 CIs on
   each of 400 GPUs): per node the time from the change to its daemon's write of the Ready
   entry (its log; the bench also waits to see every entry Ready through the API) (p50/p99),
   split into the time inside nvidia-smi (the slowest GPU's commands: GPUs run in
   parallel) and the daemon's own (the rest: watch, NVML reads, planning, writes);
   nvidia-smi invocations and API writes per node for the change.

Each daemon authenticates with a token bound to a pod on its Node, as in a DaemonSet, so the
chart's node-restriction policy is evaluated on every write.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "e2e"), str(REPO / "sim"), str(REPO / "core"),
                str(REPO / "operator"),
                str(REPO / "node-daemon")]

from tessera.api.names import ANNOTATION_GPUS, ANNOTATION_PARTITION_STATUS  # noqa: E402
from tessera_e2e.controlplane.build import build_inputs  # noqa: E402
from tessera_e2e.controlplane.cache import default_layout  # noqa: E402
from tessera_e2e.controlplane.cluster import LocalCluster  # noqa: E402
from tessera_e2e.gpubed.daemons import (  # noqa: E402
    NodeDaemonProcess,
    SimNode,
    create_node,
    daemon_kubeconfig,
)
from tessera_e2e.operator.replicas import install, wait_until  # noqa: E402

NODES = int(os.environ.get("NODES", "50"))
GPUS = 8
IDLE_S = 60.0
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> int:
    layout = default_layout()
    cluster = LocalCluster(layout.bin_dir(build_inputs().pins), layout, controllers=False,
                           report=lambda line: None).start()
    work = Path(tempfile.mkdtemp(prefix="tessera-bench-node-"))
    daemons: list[NodeDaemonProcess] = []
    try:
        install(cluster.kubectl)
        for i in range(NODES):
            node = f"bench-{i:02d}"
            create_node(cluster.kubectl, node, {"pool": "bench"})
            kc = daemon_kubeconfig(cluster.kubectl, cluster.kubeconfig, work, node)
            daemons.append(NodeDaemonProcess(
                node, SimNode(work / "sim", node, ["H100-80GB"] * GPUS), kc, work,
                ["--poll-interval", "1", "--resync-interval", "5", "--stuck-after", "60"]))

        def published() -> int:
            out = cluster.kubectl("get", "nodes", "-l", "pool=bench", "-o", "json")
            items = json.loads(out.stdout)["items"] if out.returncode == 0 else []
            return sum(len(json.loads((n["metadata"].get("annotations") or {}).get(
                ANNOTATION_GPUS, "[]"))) == GPUS for n in items)

        def restart_exited() -> bool:
            """A daemon that exited at start (its free port taken meanwhile by another
            process of this busy machine) is started again on a new port."""
            for k, d in enumerate(daemons):
                if d.proc is not None and d.proc.poll() is not None:
                    print(f"{d.node}: daemon exited at start, restarted", flush=True)
                    daemons[k] = NodeDaemonProcess(d.node, d.sim, d.kubeconfig, work,
                                                   d.extra)
                    daemons[k].start_async()
            return False

        started = time.monotonic()
        for d in daemons:  # all at once: no waiting for each one's port
            d.start_async()
        wait_until("every inventory", lambda: restart_exited() or published() == NODES,
                   600, 0.25)
        all_published = time.monotonic() - started
        print(f"{NODES} daemons x {GPUS} GPUs: all inventories published "
              f"{all_published:.1f} s after start", flush=True)

        part = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
                "metadata": {"name": "bench-whole"},
                "spec": {"nodeSelector": {"matchLabels": {"pool": "bench"}},
                         "layout": {"migMode": "Disabled"}}}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(part))
        one = daemons[0]
        wait_until("reports", lambda: "bench-whole" in json.loads(cluster.kubectl(
            "get", "node", one.node, "-o", "json").stdout)["metadata"]["annotations"].get(
            ANNOTATION_PARTITION_STATUS, ""), 120)
        time.sleep(10)  # the other daemons' reports settle too
        assert one.proc is not None
        pid = one.proc.pid

        def rv() -> str:
            return str(json.loads(cluster.kubectl("get", "node", one.node, "-o", "json")
                                  .stdout)["metadata"]["resourceVersion"])

        def writes() -> float:
            return sum(one.metric("tessera_node_api_writes_total", kind=k) or 0
                       for k in ("node", "event"))
        rv0, w0, c0, t0 = rv(), writes(), cpu_seconds(pid), time.monotonic()
        peak = rss_mib(pid)
        while time.monotonic() - t0 < IDLE_S:
            time.sleep(1)
            peak = max(peak, rss_mib(pid))
        cpu = (cpu_seconds(pid) - c0) / (time.monotonic() - t0)
        rv1, w1 = rv(), writes()
        print(f"one daemon idle {IDLE_S:.0f} s: CPU {cpu * 100:.2f} % of a core "
              f"(goal < 1 %), peak RSS {peak:.1f} MiB (goal < 80 MiB), writes "
              f"{w1 - w0:.0f} by its counter, Node resourceVersion "
              f"{'unchanged' if rv0 == rv1 else f'{rv0} -> {rv1}'} (goal 0)", flush=True)
        ok = cpu < 0.01 and peak < 80 and w1 == w0 and rv0 == rv1
        return 0 if apply_seven_1g(cluster, daemons, part) and ok else 1
    finally:
        for d in daemons:
            d.stop()
        cluster.stop()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def apply_seven_1g(cluster: LocalCluster, daemons: list[NodeDaemonProcess],
                   part: dict[str, Any]) -> bool:
    """Step 3: the layout change, timed per node."""
    writes0 = {d.node: sum(d.metric("tessera_node_api_writes_total", kind=k) or 0
                           for k in ("node", "event")) for d in daemons}
    part["spec"]["layout"] = {"profiles": [{"name": "1g.10gb", "count": 7}]}
    t0 = time.time()
    cluster.kubectl("apply", "-f", "-", input=json.dumps(part))
    ready: dict[str, float] = {}
    deadline = time.monotonic() + 900
    while len(ready) < len(daemons) and time.monotonic() < deadline:
        time.sleep(0.5)
        try:  # 400 GPUs' nvidia-smi at once load the machine: a slow answer is no failure
            out = cluster.kubectl("get", "nodes", "-l", "pool=bench", "-o", "json")
        except subprocess.TimeoutExpired:
            continue
        now = time.time()
        for n in json.loads(out.stdout)["items"] if out.returncode == 0 else []:
            name = n["metadata"]["name"]
            raw = (n["metadata"].get("annotations") or {}).get(ANNOTATION_PARTITION_STATUS)
            e = json.loads(raw or "{}").get("bench-whole") or {}
            if (name not in ready and e.get("phase") == "Ready"
                    and e.get("observedGeneration") == 2):
                ready[name] = now - t0
    if len(ready) < len(daemons):
        print(f"only {len(ready)} of {len(daemons)} nodes Ready", flush=True)
        return False
    smi_s, own_s, invocations, writes = [], [], [], []
    for d in daemons:
        recs = d.log_records(t0)
        # when the daemon wrote its Ready entry (its log, not when this loop saw it: under
        # load kubectl answers late): the first Ready write after an Applying one
        phases = [(r["ts"], r["reports"].get("bench-whole")) for r in recs
                  if r.get("msg") == "node updated" and isinstance(r.get("reports"), dict)]
        applying = next(ts for ts, ph in phases if ph == "Applying")
        ready[d.node] = next(ts for ts, ph in phases if ph == "Ready" and ts > applying) - t0
        applied = [r for r in recs if r.get("msg") == "MIG apply finished"]
        node_smi = max(float(r["smiSeconds"]) for r in applied)
        smi_s.append(node_smi)
        own_s.append(ready[d.node] - node_smi)
        invocations.append(sum(1 for r in recs if r.get("msg") == "nvidia-smi done"
                               and "-lgipp" not in r.get("argv", [])))
        writes.append(sum(d.metric("tessera_node_api_writes_total", kind=k) or 0
                          for k in ("node", "event")) - writes0[d.node])
    lat = list(ready.values())
    print(f"7x1g.10gb applied on {len(daemons)} nodes x {GPUS} GPUs: apply -> Ready "
          f"p50 {pct(lat, .5):.1f} s, p99 {pct(lat, .99):.1f} s; inside nvidia-smi "
          f"(slowest GPU) p50 {pct(smi_s, .5):.1f} s, p99 {pct(smi_s, .99):.1f} s; "
          f"daemon's own p50 {pct(own_s, .5):.1f} s, p99 {pct(own_s, .99):.1f} s",
          flush=True)
    print(f"per node and change: nvidia-smi invocations {statistics.mean(invocations):.1f} "
          f"(min {min(invocations)}, max {max(invocations)}; {GPUS} GPUs x -mig 1, -cgi, "
          f"-cci), API writes {statistics.mean(writes):.1f} (min {min(writes):.0f}, max "
          f"{max(writes):.0f})", flush=True)
    return True


if __name__ == "__main__":
    raise SystemExit(main())
