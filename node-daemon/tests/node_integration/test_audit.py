"""The audit on a simulated GPU node against the real API server: real processes using the
simulator's libcuda (one under libtessera, with its ledger), placed in real cgroups named as
the kubelet names a pod's and a container's, real Pod and GPUQuota objects; the runner with
the daemon's own pod-bound token (so its RBAC is the chart's)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest

from tessera.api.budget import PerShareBudget
from tessera.api.names import API_VERSION, VGPU
from tessera.kube.client import Kube, load_credentials
from tessera_e2e.gpubed.daemons import SimNode, create_node, daemon_kubeconfig
from tessera_e2e.gpubed.workloads import LIBTESSERA, Cgroups, Workload, require
from tessera_e2e.operator.replicas import wait_until
from tessera_node.audit.runner import REASON_FOREIGN, REASON_OVER_BUDGET, AuditRunner
from tessera_node.budget.formats import BudgetEntry, BudgetFile
from tessera_node.device.nvml import NvmlReader
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_sim import BUILD_DIR

from .conftest import StartDaemon

MIB = 1 << 20

pytestmark = pytest.mark.integration


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    require()
    c = Cgroups()
    yield c
    c.remove()


def _pod(chart: Any, ns: str, name: str, node: str) -> str:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": "app", "image": "workload:dev"},
                                    {"name": "side", "image": "workload:dev"}]}}
    out = chart.kubectl("create", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    got = chart.kubectl("get", "pod", name, "-n", ns, "-o", "jsonpath={.metadata.uid}")
    return str(got.stdout.strip())


def _quota(chart: Any, ns: str, over: str, foreign: str) -> None:
    body = {"apiVersion": API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": "team", "namespace": ns},
            "spec": {"hard": {"memory": "100Gi"},
                     "enforcement": {"overBudget": over, "foreignProcesses": foreign}}}
    out = chart.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr


def _events(chart: Any, ns: str, name: str, reason: str) -> list[str]:
    out = chart.kubectl("get", "events", "-n", ns, "--field-selector",
                        f"involvedObject.name={name},reason={reason}", "-o", "json")
    assert out.returncode == 0, out.stderr
    return [e["message"] for e in json.loads(out.stdout)["items"]
            if (e.get("source") or {}).get("component") == "tessera-node"]


def _metric(name: str, **labels: str) -> float | None:
    for line in generate_latest().decode().splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line
                                               for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_over_budget_and_foreign_processes_reported_then_stopped(
        chart: Any, namespace: str, cgroups: Cgroups, tmp_path: Path) -> None:
    node = f"nd-{uuid.uuid4().hex[:8]}"
    create_node(chart.kubectl, node)
    kubeconfig = daemon_kubeconfig(chart.kubectl, chart.kubeconfig, tmp_path, node)
    sim = SimNode(tmp_path / "sim", node, ["H100-80GB", "A100-40GB:mig"])
    assert sim.smi("mig", "-i", "1", "-cgi", "1g.5gb", "-C").returncode == 0
    lines = sim.smi("-L").stdout.split()
    gpu0 = next(w for w in lines if w.startswith("GPU-")).rstrip(")")
    mig = next(w for w in lines if w.startswith("MIG-")).rstrip(")")
    os.environ["TESSERA_SIM_NODE"] = sim.env["TESSERA_SIM_NODE"]  # for NVML in this process

    uid_a, uid_b = _pod(chart, namespace, "trainer", node), _pod(chart, namespace, "rogue", node)
    _quota(chart, namespace, "Report", "Report")
    cid_app = "a" * 64
    state = tmp_path / "containers" / "trainer-app"
    (state / "run").mkdir(parents=True)
    budget = BudgetFile(state / "budget")
    budget.update([BudgetEntry(0, gpu0, memory=512 * MIB, cores=25)])
    registry = [SetUpContainer(
        key=state.name, pod_uid=uid_a, namespace=namespace, pod="trainer", container="app",
        resource=VGPU, units=(gpu0,), gpus=(gpu0,),
        budget=PerShareBudget(shares=1, memory_bytes=512 * MIB, cores=25), refused=None,
        budget_file=str(state / "budget"), ledger_dir=str(state / "run"),
        container_id=cid_app)]
    workloads: list[Workload] = []
    try:
        # the tessera container: under libtessera (its ledger), 300 MiB, kernels held to a
        # launch rate so that they wait for tokens
        app = Workload(sim.env, cgroups.container(uid_a, cid_app), "tenant", "300", "150",
                       device=gpu0, extra_env={
                           "LD_PRELOAD": str(LIBTESSERA), "TESSERA_MEMORY_LIMIT": "1Gi",
                           "TESSERA_CORE_RATE": "100", "TESSERA_LEDGER":
                           str(state / "run" / "ledger")})
        # a process of the same container that goes around libtessera (no preload, not in
        # the ledger): its cgroup makes it the container's all the same
        bypass = Workload(sim.env, cgroups.container(uid_a, cid_app), "hold", "100",
                          device=gpu0)
        workloads += [app, bypass]
        # a GPU obtained around the device plugin: the pod's other container, on the MIG
        # instance; and a process on the host, in no pod
        rogue = Workload(sim.env, cgroups.container(uid_b, "b" * 64), "hold", "100",
                         device=mig)
        host = Workload(sim.env, None, "hold", "64", device=gpu0)
        workloads += [rogue, host]

        async def scenario() -> None:
            kube = Kube(load_credentials(str(kubeconfig)), user_agent="tessera-node")
            reader = NvmlReader(str(BUILD_DIR))
            runner = AuditRunner(kube, node, lambda: registry, reader, interval_s=0.5,
                                 own_pid=0)
            try:
                await _scenario(chart, namespace, node, runner, budget, gpu0, mig,
                                [app, bypass], rogue, host)
            finally:
                reader.close()
                await kube.close()

        asyncio.run(scenario())
    finally:
        for w in workloads:
            w.stop()
        os.environ.pop("TESSERA_SIM_NODE", None)


async def _scenario(chart: Any, ns: str, node: str, runner: AuditRunner, budget: BudgetFile,
                    gpu0: str, mig: str, mine: list[Workload], rogue: Workload,
                    host: Workload) -> None:
    mine = sorted(mine, key=lambda w: w.pid)
    labels_mine = ", ".join(w.label for w in mine)
    labels = {"namespace": ns, "pod": "trainer", "container": "app", "gpu": gpu0}
    # 1. within budget: no finding; the container's figures are served
    first = await runner.audit_once()
    assert first is not None and first.over == ()
    # its kernels ran before it said ready: NVML saw it busy (the first audit reads every
    # sample NVML keeps, the last 10 s)
    util = _metric("tessera_container_utilization_percent", **labels)
    assert util is not None and util > 0
    await runner.audit_once()
    assert _metric("tessera_container_utilization_percent", **labels) == 0  # idle since
    assert _metric("tessera_container_memory_used_bytes", **labels) == 400 * MIB
    assert _metric("tessera_container_memory_budget_bytes", **labels) == 512 * MIB
    assert _metric("tessera_container_core_budget_percent", **labels) == 25
    waits = _metric("tessera_container_token_wait_seconds_count", **labels)
    assert waits is not None and waits > 0, "held to 100 launches/s, its launches waited"
    assert _metric("tessera_container_over_budget", **labels) == 0

    # 2. the foreign processes: both listed (confirmed in two audits), one Event each on the
    # Node, the rogue one naming its pod; Report: both still run
    assert _metric("tessera_node_foreign_gpu_processes", gpu=mig) == 1
    assert _metric("tessera_node_foreign_gpu_memory_bytes", gpu=mig) == 100 * MIB
    assert _metric("tessera_node_foreign_gpu_processes", gpu=gpu0) == 1
    node_events = _events(chart, "default", node, REASON_FOREIGN)
    assert len(node_events) == 2, node_events
    rogue_msg = next(m for m in node_events if f"pid {rogue.pid} " in m)
    assert f"in pod {ns}/rogue holds 100 MiB of GPU memory on {mig}" in rogue_msg
    assert "reported only" in rogue_msg
    host_msg = next(m for m in node_events if f"pid {host.pid} " in m)
    assert "outside any pod" in host_msg and "reported only" in host_msg
    await runner.audit_once()
    assert len(_events(chart, "default", node, REASON_FOREIGN)) == 2  # deduplicated
    assert rogue.proc.poll() is None and host.proc.poll() is None

    # 3. the budget lowered below what the container holds: over budget, reported on its pod
    budget.update([BudgetEntry(0, gpu0, memory=256 * MIB, cores=25)])
    await runner.audit_once()
    assert _events(chart, ns, "trainer", REASON_OVER_BUDGET) == []  # seen once: not yet
    await runner.audit_once()
    over = _events(chart, ns, "trainer", REASON_OVER_BUDGET)
    assert over == [f"container app holds 400 MiB of GPU memory on {gpu0}, over its budget of "
                    f"256 MiB (NVML per-process figures: {labels_mine}); reported "
                    "only (GPUQuota enforcement.overBudget is not Stop)"], over
    assert _metric("tessera_container_over_budget", **labels) == 1
    await runner.audit_once()
    assert len(_events(chart, ns, "trainer", REASON_OVER_BUDGET)) == 1
    assert all(w.proc.poll() is None for w in mine)

    # 4. the quota says Stop: the next audit kills both, and says so; the host process
    # (no namespace, no quota) is never stopped
    _quota(chart, ns, "Stop", "Stop")
    await runner.audit_once()
    assert [w.proc.wait(10) for w in mine] == [-signal.SIGKILL] * 2
    assert rogue.proc.wait(10) == -signal.SIGKILL
    over = _events(chart, ns, "trainer", REASON_OVER_BUDGET)
    assert len(over) == 2, over  # the report, then the stop (Events list in no set order)
    assert sum(m.endswith(f"stopped (SIGKILL): {labels_mine}") for m in over) == 1, over
    stopped = [m for m in _events(chart, "default", node, REASON_FOREIGN) if "stopped" in m]
    assert len(stopped) == 1 and f"pid {rogue.pid} " in stopped[0], stopped
    assert host.proc.poll() is None

    # 5. gone: no finding; a container's series go with it once the registry drops it
    await runner.audit_once()
    assert runner.last is not None and runner.last.over == ()
    assert [p.pid for p in runner.last.foreign] == [host.pid]
    assert _metric("tessera_container_memory_used_bytes", **labels) == 0
    runner.containers = list  # the registry dropped it
    await runner.audit_once()
    assert _metric("tessera_container_memory_budget_bytes", **labels) is None


def test_the_daemon_audits_its_node(chart: Any, start_daemon: StartDaemon) -> None:
    """``tessera-node run`` runs the audit: with no container set up by tessera yet, a process
    using a GPU of its node is foreign: served as a metric, one Event on the Node."""
    require()
    d = start_daemon(["H100-80GB"], extra=["--audit-interval", "0.5"])
    gpu = next(w for w in d.sim.smi("-L").stdout.split() if w.startswith("GPU-")).rstrip(")")
    w = Workload(d.sim.env, None, "hold", "128", device=gpu)
    try:
        wait_until("the foreign process served", lambda: d.metric(
            "tessera_node_foreign_gpu_memory_bytes", gpu=gpu) == 128 * MIB, 30)
        msgs = wait_until("its Event", lambda: _events(chart, "default", d.node,
                                                       REASON_FOREIGN), 30)
        assert len(msgs) == 1 and msgs[0].startswith(f"{w.label} outside any pod holds "
                                                     f"128 MiB of GPU memory on {gpu}")
        assert (d.metric("tessera_node_audit_runs_total", result="ok") or 0) >= 2
    finally:
        w.stop()
    wait_until("gone from the metrics", lambda: d.metric(
        "tessera_node_foreign_gpu_processes", gpu=gpu) is None, 30)
    assert len(_events(chart, "default", d.node, REASON_FOREIGN)) == 1
