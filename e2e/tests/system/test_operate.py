"""What an operator of tessera sees, checked against a real run: the operator (two replicas)
and two tessera-node daemons on simulated GPU nodes, scraped by a real Prometheus.

- Argo CD's verdict (deploy/argocd/health.lua in Argo CD's gopher-lua) on the GPUPartition
  and GPUQuota objects the API server returns here: Healthy, Degraded, Progressing for a
  generation not yet observed, Progressing with the Ready condition's message;
- every Grafana dashboard query, its variables expanded (All and each value) and
  ``$__rate_interval`` replaced, returns series, except those on metrics still pending
  (``tessera_e2e.operate.dashboard.PENDING``), which must return none;
- "daemon down" (deploy/prometheus/tessera-rules.yaml, its ``for`` shortened to 2 s) fires
  for the daemon that is stopped, and only for it;
- the per-container panels and the audit's alerts on live data: on the first node a real
  process under the simulator's libcuda and libtessera (held to a launch rate, so that it
  waits for tokens) in cgroups named as the kubelet names a real Pod's and container's, with
  a budget below what it holds, audited by the daemon's ``AuditRunner`` with that container
  registered (without a kubelet the daemon's device plugin registers none; the daemon
  process there audits only at start, before the process exists) and served on a port of
  its own (job ``tessera-node-audit``) with the daemon's core control for that container
  (``CoreControl``: its lent/borrowed and share series); on each node a process outside
  any pod. "Container
  over budget" fires for that container and "GPU process outside tessera" for both nodes.

At the end the run's series for the dashboard's main panels (the daemon's stop included) are
saved (``dashboard-data.json`` in the test's temporary directory, or where
``TESSERA_DASHBOARD_DATA`` says) for ``deploy/grafana/render.py``, which draws the README's
picture from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, start_http_server

from tessera.api.budget import PerShareBudget
from tessera.api.names import API_VERSION, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera.kube.client import Kube, load_credentials
from tessera_e2e.controlplane.cluster import kubectl_json
from tessera_e2e.gpubed.daemons import NodeDaemonProcess, remove_sim_daemon, start_sim_daemon
from tessera_e2e.gpubed.workloads import LIBTESSERA, Cgroups, Workload, require
from tessera_e2e.operate import dashboard
from tessera_e2e.operate.argocd import HEALTH_SCRIPT, ensure_argocd_health, evaluate
from tessera_e2e.operate.prometheus import LocalPrometheus, scaled_rules
from tessera_e2e.operator.replicas import LocalOperators as Operators
from tessera_e2e.operator.replicas import free_port, wait_until
from tessera_e2e.paths import REPO
from tessera_node import metrics as node_metrics
from tessera_node.audit.runner import AuditRunner
from tessera_node.budget.formats import BudgetEntry, BudgetFile
from tessera_node.cores.runner import CoreControl
from tessera_node.device.nvml import NvmlReader
from tessera_node.deviceplugin.registry import SetUpContainer
from tessera_sim import BUILD_DIR

pytestmark = pytest.mark.integration

RULES = REPO / "deploy" / "prometheus" / "tessera-rules.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "tessera-dashboard.json"
SCRAPE_S = 1.0
INTERVAL_S = 15.0
"""Grafana's ``$__interval`` assumed for the check (its minimum for a 1 h range)."""
FAST = ["--resync-interval", "2", "--retry-interval", "1"]
MIB = 1 << 20
AUDITED = ("trainer", "app")
"""The pod and container the first node's audit knows as set up by tessera."""


@dataclass
class Audited:
    node: str
    gpu: str
    pod_uid: str
    foreign: list[Workload]
    """One process outside any pod per node."""


@dataclass
class Scene:
    cluster: Any
    ops: Operators
    prom: LocalPrometheus
    pool: str
    namespace: str
    daemons: list[NodeDaemonProcess]
    audited: Audited
    objects: dict[str, Any] = field(default_factory=dict)
    """Objects as the API server returned them, by what the test made of them."""
    started: float = field(default_factory=time.time)


def apply(cluster: Any, body: dict[str, Any], *verb: str) -> Any:
    """``kubectl <verb> -o json`` of ``body``: the object as the API server answered."""
    out = cluster.kubectl(*(verb or ("apply",)), "-f", "-", "-o", "json",
                          input=json.dumps(body))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def partition(name: str, pool: str, profiles: dict[str, int], gpus: list[int] | None = None
              ) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {"matchLabels": {"pool": pool}},
                            "layout": {"profiles": [{"name": k, "count": v}
                                                    for k, v in profiles.items()]}}
    if gpus is not None:
        spec["gpus"] = {"indices": gpus}
    return {"apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": name},
            "spec": spec}


def condition(obj: Any, typ: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == typ:
            return dict(c)
    return {}


def settled(cluster: Any, kind: str, name: str, ns: str | None, typ: str, status: str,
            reason: str | None = None, timeout: float = 60) -> Any:
    """The object once the operator observed its generation and ``typ`` is ``status``."""
    where = ["-n", ns] if ns else []

    def check() -> Any:
        obj = kubectl_json(cluster, "get", kind, name, *where)
        c = condition(obj, typ)
        ok = ((obj.get("status") or {}).get("observedGeneration") ==
              obj["metadata"]["generation"] and c.get("status") == status
              and (reason is None or c.get("reason") == reason))
        return obj if ok else None
    return wait_until(f"{kind} {name} {typ}={status}", check, timeout)


def pod(name: str, ns: str, memory_mib: int, cores: int) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {
                "limits": {VGPU_MEMORY: str(memory_mib), VGPU_CORES: str(cores)}}}]}}


def spare_gpu(d: NodeDaemonProcess) -> str:
    """The UUID of GPU 1: the partitions take GPU 0 (MIG mode changes wait for a GPU that
    no process uses)."""
    return [w for w in d.sim.smi("-L").stdout.split() if w.startswith("GPU-")][1].rstrip(")")


@contextlib.contextmanager
def audited_container(cluster: Any, prom: LocalPrometheus, daemons: list[NodeDaemonProcess],
                      ns: str, directory: Path) -> Iterator[Audited]:
    """The container ``AUDITED`` on the first node (over its budget), a process outside any
    pod on each node, and the first node's audit running and scraped (module docstring)."""
    require()
    d = daemons[0]
    gpu = spare_gpu(d)
    pod_name, container = AUDITED
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": pod_name, "namespace": ns},
            "spec": {"nodeName": d.node, "tolerations": [{"operator": "Exists"}],
                     "containers": [{"name": container, "image": "workload:dev"}]}}
    uid = apply(cluster, body, "create")["metadata"]["uid"]
    state = directory / "containers" / f"{pod_name}-{container}"
    (state / "run").mkdir(parents=True)
    BudgetFile(state / "budget").update([BudgetEntry(0, gpu, memory=256 * MIB, cores=25)])
    cid = "c" * 64
    registry = [SetUpContainer(
        key=state.name, pod_uid=uid, namespace=ns, pod=pod_name, container=container,
        resource=VGPU, units=(gpu,), gpus=(gpu,),
        budget=PerShareBudget(shares=1, memory_bytes=256 * MIB, cores=25), refused=None,
        budget_file=str(state / "budget"), ledger_dir=str(state / "run"), container_id=cid)]
    cgroups = Cgroups()
    workloads: list[Workload] = []
    stop = threading.Event()
    server = None
    previous_node = os.environ.get("TESSERA_SIM_NODE")
    os.environ["TESSERA_SIM_NODE"] = d.sim.env["TESSERA_SIM_NODE"]  # NVML in this process
    try:
        # 300 MiB held against a 256 MiB budget; 150 1-ms kernels at 100 launches/s wait
        workloads.append(Workload(d.sim.env, cgroups.container(uid, cid), "tenant", "300",
                                  "150", device=gpu, extra_env={
                                      "LD_PRELOAD": str(LIBTESSERA),
                                      "TESSERA_MEMORY_LIMIT": "1Gi", "TESSERA_CORE_RATE": "100",
                                      "TESSERA_LEDGER": str(state / "run" / "ledger")}))
        foreign = [Workload(x.sim.env, None, "hold", "64", device=spare_gpu(x))
                   for x in daemons]
        workloads += foreign

        async def audit() -> None:
            kube = Kube(load_credentials(str(d.kubeconfig)), user_agent="tessera-node")
            reader = NvmlReader(str(BUILD_DIR))
            runner = AuditRunner(kube, d.node, lambda: registry, reader, interval_s=1.0,
                                 own_pid=0)
            try:
                while not stop.is_set():
                    await runner.audit_once()
                    await asyncio.sleep(runner.interval_s)
            finally:
                reader.close()
                await kube.close()
        auditor = threading.Thread(target=asyncio.run, args=(audit(),), daemon=True)
        auditor.start()
        # the daemon's core control for that container: its lent/borrowed and share series
        set_up = SetUpContainer(
            key=state.name, pod_uid=uid, namespace=ns, pod=pod_name, container=container,
            resource=VGPU, units=(gpu,), gpus=(gpu,),
            budget=PerShareBudget(shares=1, memory_bytes=256 * MIB, cores=25), refused=None,
            budget_file=str(state / "budget"), ledger_dir=str(state / "run"), quota="team")

        def control() -> None:
            reader = NvmlReader(str(BUILD_DIR))
            cores = CoreControl(lambda: [set_up], lambda: {gpu: 1}, reader, 0.2)
            try:
                while not stop.wait(cores.interval_s):
                    cores.step()
            finally:
                reader.close()
        controller = threading.Thread(target=control, daemon=True)
        controller.start()
        served = CollectorRegistry()
        for c in (node_metrics.CONTAINERS, node_metrics.AUDIT_RUNS, node_metrics.AUDIT_STOPS,
                  node_metrics.AUDIT_FOREIGN, node_metrics.AUDIT_FOREIGN_BYTES,
                  node_metrics.CORE_LENT, node_metrics.CORE_BORROWED, node_metrics.CORE_BUSY,
                  node_metrics.CORE_BUDGET, node_metrics.CORE_SHARE):
            served.register(c)
        port = free_port()
        server, _ = start_http_server(port, "127.0.0.1", served)
        prom.set_targets("tessera-node-audit", {f"127.0.0.1:{port}": {"node": d.node}})
        yield Audited(d.node, gpu, uid, foreign)
        stop.set()
        auditor.join(10)
        controller.join(10)
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
        for w in workloads:
            w.stop()
        cgroups.remove()
        if previous_node is None:
            os.environ.pop("TESSERA_SIM_NODE", None)
        else:
            os.environ["TESSERA_SIM_NODE"] = previous_node


@pytest.fixture(scope="module")
def scene(cluster: Any, operators: Operators, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Scene]:
    operators.ensure_running()
    pool = f"op{int(time.time() * 1000) % 10**8}"
    directory = tmp_path_factory.mktemp("operate")
    daemons = []
    prom = LocalPrometheus(directory / "prometheus",
                           [scaled_rules(RULES, directory / "rules.yaml", "2s")],
                           scrape_interval_s=SCRAPE_S).start()
    ns = f"t-operate-{pool}"
    try:
        prom.set_targets("tessera-operator", {
            f"127.0.0.1:{r.health_port}": {"replica": name}
            for name, r in operators.replicas.items()})
        # the first node's daemon audits once, at start: the test's audit is that node's
        for audit_interval in ("3600", "1"):
            daemons.append(start_sim_daemon(cluster.kubectl, cluster.kubeconfig, directory,
                                            ["H100-80GB"] * 2, {"pool": pool},
                                            [*FAST, "--audit-interval", audit_interval]))
        prom.set_targets("tessera-node", {f"127.0.0.1:{d.port}": {"node": d.node}
                                          for d in daemons})
        assert cluster.kubectl("create", "namespace", ns).returncode == 0
        cluster.wait_for_service_account(ns)
        with audited_container(cluster, prom, daemons, ns, directory) as audited:
            yield Scene(cluster, operators, prom, pool, ns, daemons, audited)
    finally:
        for name in ("a", "b", "none"):
            cluster.kubectl("delete", "gpupartition", f"{pool}-{name}", "--ignore-not-found",
                            "--wait=false")
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
        for d in daemons:
            remove_sim_daemon(cluster.kubectl, d)
        prom.stop()


@pytest.fixture(scope="module")
def objects(scene: Scene) -> dict[str, Any]:
    """The GPUPartitions and the GPUQuota this run makes, as the API server returned them at
    each step that matters, by what the step was."""
    c, pool, ns = scene.cluster, scene.pool, scene.namespace
    seen: dict[str, Any] = {}
    # GPUPartitions: one applied on both nodes, one claiming GPUs the first holds, one
    # selecting no node; the first's answer to a create and to a spec change
    seen["partition created"] = apply(c, partition(f"{pool}-a", pool, {"1g.10gb": 7}, [0]),
                                      "create")
    seen["partition ready"] = settled(c, "gpupartition", f"{pool}-a", None, "Ready", "True")
    apply(c, partition(f"{pool}-b", pool, {"3g.40gb": 2}, [0]))
    seen["partition conflicting"] = settled(c, "gpupartition", f"{pool}-b", None, "Degraded",
                                            "True", "GPUClaimed")
    apply(c, partition(f"{pool}-none", f"{pool}-nowhere", {"7g.80gb": 1}))
    seen["partition selecting nothing"] = settled(c, "gpupartition", f"{pool}-none", None,
                                                  "Ready", "False", "NoNodesSelected")
    seen["partition changed"] = apply(c, partition(f"{pool}-a", pool, {"2g.20gb": 3}, [0]))
    # GPUQuota: created, counted, admitting one pod and refusing one, then lowered below use
    quota: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "GPUQuota",
             "metadata": {"name": "team", "namespace": ns},
             "spec": {"hard": {"memory": "4Gi", "cores": 100, "pods": 10}}}
    seen["quota created"] = apply(c, quota, "create")
    settled(c, "gpuquota", "team", ns, "Ready", "True")
    assert c.kubectl("create", "-f", "-", input=json.dumps(pod("fits", ns, 2048, 50))
                     ).returncode == 0

    def counted() -> Any:
        q = kubectl_json(c, "get", "gpuquota", "team", "-n", ns)
        return q if ((q.get("status") or {}).get("used") or {}).get("memory") == "2Gi" else None
    seen["quota counted"] = wait_until("used 2Gi", counted, 30)
    # once counted, tessera's webhook refuses (its message names the quota's hard; the
    # dashboard's refusals panel counts it); before, the API server's count of the managed
    # ResourceQuota would refuse it first, race-free but unseen by tessera's metrics
    refused = c.kubectl("create", "-f", "-", input=json.dumps(pod("too-big", ns, 4096, 10)))
    assert refused.returncode != 0 and "hard" in refused.stderr, refused.stderr
    quota["spec"]["hard"]["memory"] = "1Gi"
    apply(c, quota)
    seen["quota over hard"] = settled(c, "gpuquota", "team", ns, "Degraded", "True", "OverHard")
    scene.objects = seen
    return seen


def test_argocd_health_of_the_objects_the_api_server_returns(objects: dict[str, Any]
                                                             ) -> None:
    seen = objects
    verdicts = dict(zip(seen, evaluate(ensure_argocd_health(), HEALTH_SCRIPT, list(seen.values())),
                        strict=True))
    ready_msg = condition(seen["partition ready"], "Ready")["message"]
    assert verdicts == {
        "partition created": {"status": "Progressing",
                              "message": "waiting for the operator to observe generation 1"},
        "partition ready": {"status": "Healthy", "message": ready_msg},
        "partition conflicting": {
            "status": "Degraded",
            "message": condition(seen["partition conflicting"], "Degraded")["message"]},
        "partition selecting nothing": {
            "status": "Progressing",
            "message": "no node with matching GPUs matches the node selector"},
        "partition changed": {"status": "Progressing",
                              "message": "waiting for the operator to observe generation 2"},
        "quota created": {"status": "Progressing",
                          "message": "waiting for the operator to observe generation 1"},
        "quota counted": {"status": "Healthy",
                          "message": "usage is counted and enforced at admission"},
        "quota over hard": {
            "status": "Degraded",
            "message": condition(seen["quota over hard"], "Degraded")["message"]},
    }
    assert ready_msg == "all 2 selected nodes applied generation 1"
    assert "GPU 0" in verdicts["partition conflicting"]["message"]
    assert verdicts["quota over hard"]["message"].startswith("memory used 2Gi > hard 1Gi")
    # the quota over hard is still Ready: Degraded wins, as the mapping says
    assert condition(seen["quota over hard"], "Ready")["status"] == "True"


def expansions(scene: Scene, d: Any, expr: str) -> list[dict[str, str]]:
    """Each way a person can set the variables ``expr`` uses: all at "All", and each
    variable at each value this run made (the others at "All"), after checking that the
    variable's own query offers those values.  (Other tests' objects may share the API
    server: a namespace whose quota limits no memory rightly shows no memory panel.)"""
    ours = {"node": [d_.node for d_ in scene.daemons], "namespace": [scene.namespace]}
    used = [v for v in dashboard.variables(d) if v.name in dashboard.uses(expr)]
    every = {v.name: v.all_value or ".*" for v in used}
    out = [every]
    for v in used:
        offered = scene.prom.label_values(v.label, v.match)
        assert set(ours[v.name]) <= set(offered), (v, offered)
        out += [{**every, v.name: dashboard.regex_value([x])} for x in ours[v.name]]
    return out


def test_every_dashboard_query_returns_series(scene: Scene, objects: dict[str, Any]) -> None:
    prom = scene.prom
    d = json.loads(DASHBOARD.read_text())
    # MIG applies and admissions happened (``objects``); let the rate windows see them
    wait_until("two operator replicas and two daemons scraped", lambda: sorted(
        prom.targets_up("tessera-operator").values()) == [1.0, 1.0] and sorted(
        prom.targets_up("tessera-node").values()) == [1.0, 1.0], 30)
    time.sleep(dashboard.rate_interval(INTERVAL_S, SCRAPE_S) / 2)

    def check() -> list[str]:
        wrong = []
        for t in dashboard.targets(d):
            pending = dashboard.pending_in(t.expr)
            for values in expansions(scene, d, t.expr):
                expr = dashboard.expand(t.expr, values, interval_s=INTERVAL_S,
                                        scrape_s=SCRAPE_S)
                series = prom.query(expr)
                if pending and series:
                    wrong.append(f"{t.panel} [{t.ref}] returns series: {sorted(pending)} "
                                 "are exported now, take them off PENDING")
                elif not pending and not series:
                    wrong.append(f"{t.panel} [{t.ref}] returns nothing: {expr}")
        return wrong

    wrong = check()
    deadline = time.monotonic() + 30
    while wrong and time.monotonic() < deadline:  # scrapes of a loaded machine lag
        time.sleep(2)
        wrong = check()
    assert wrong == []
    # the quota panels show this run's numbers
    used = prom.query(f'max by (resource) (tessera_quota_used{{namespace="{scene.namespace}"}})')
    assert {s["metric"]["resource"]: float(s["value"][1]) for s in used} == {
        "memory": 2 * 2**30, "cores": 50, "pods": 1}
    refused = prom.query('sum(tessera_admission_seconds_count{result="denied"})')
    assert float(refused[0]["value"][1]) >= 1
    # and the per-container panels this run's container, as the audit saw it
    a, (pod_name, container) = scene.audited, AUDITED
    where = (f'{{namespace="{scene.namespace}", pod="{pod_name}", container="{container}", '
             f'node="{a.node}", gpu="{a.gpu}"}}')
    assert {n: [float(x["value"][1]) for x in prom.query(n + where)] for n in (
        "tessera_container_memory_used_bytes", "tessera_container_memory_budget_bytes",
        "tessera_container_core_budget_percent")} == {
        "tessera_container_memory_used_bytes": [300 * MIB],
        "tessera_container_memory_budget_bytes": [256 * MIB],
        "tessera_container_core_budget_percent": [25.0]}
    waits = prom.query(f"tessera_container_token_wait_seconds_count{where}")
    assert waits and float(waits[0]["value"][1]) > 0, "held to 100 launches/s, it waited"


def save_dashboard_data(scene: Scene, d: Any) -> None:
    """Range data of the main panels (every variable at All) for deploy/grafana/render.py."""
    start, end = scene.started, time.time()
    panels = []
    for title in ("Node daemons up", "MIG instances", "MIG apply outcomes", "Refusals",
                  "GPU memory: budgeted vs hard", "Cores: budgeted vs hard",
                  "Share of hard in use", "GPU memory used"):
        targets = [t for t in dashboard.targets(d) if t.panel == title]
        assert targets, title
        panels.append({"title": title, "targets": [{
            "expr": t.expr, "series": scene.prom.query_range(
                dashboard.expand(t.expr, {"node": ".*", "namespace": ".*"},
                                 interval_s=INTERVAL_S, scrape_s=SCRAPE_S),
                start, end, SCRAPE_S)} for t in targets]})
    data = {"start": start, "end": end, "panels": panels,
            "objects": {k: {"kind": v["kind"], "name": v["metadata"]["name"],
                            "conditions": (v.get("status") or {}).get("conditions") or []}
                        for k, v in scene.objects.items()}}
    out = Path(os.environ.get("TESSERA_DASHBOARD_DATA") or
               scene.prom.directory.parent / "dashboard-data.json")
    out.write_text(json.dumps(data))


def test_audit_alerts_fire_for_the_container_over_budget_and_the_foreign_processes(
        scene: Scene) -> None:
    prom, a = scene.prom, scene.audited

    def firing(name: str, count: int) -> list[dict[str, str]] | None:
        got = [x["labels"] for x in prom.alerts()
               if x["labels"]["alertname"] == name and x["state"] == "firing"]
        return got if len(got) >= count else None

    over = wait_until("TesseraContainerOverBudget firing",
                      lambda: firing("TesseraContainerOverBudget", 1), 60)
    assert over == [{"alertname": "TesseraContainerOverBudget", "severity": "critical",
                     "namespace": scene.namespace, "pod": AUDITED[0],
                     "container": AUDITED[1], "node": a.node, "gpu": a.gpu}]
    foreign = wait_until("TesseraForeignGpuProcess firing on both nodes",
                         lambda: firing("TesseraForeignGpuProcess", 2), 60)
    assert sorted((f["node"], f["gpu"]) for f in foreign) == sorted(
        (d.node, spare_gpu(d)) for d in scene.daemons)
    held = prom.query("tessera_node_foreign_gpu_memory_bytes")
    assert sorted(float(x["value"][1]) for x in held) == [64 * MIB, 64 * MIB]
    assert all(w.proc.poll() is None for w in a.foreign), "Report: nothing is stopped"


def test_daemon_down_fires_for_the_stopped_daemon(scene: Scene, objects: dict[str, Any]
                                                 ) -> None:
    prom = scene.prom
    stopped, alive = scene.daemons

    def firing() -> list[dict[str, Any]]:
        return [a for a in prom.alerts() if a["labels"]["alertname"] == "TesseraNodeDaemonDown"
                and a["state"] == "firing"]

    assert firing() == []
    stopped.stop()
    alerts = wait_until("TesseraNodeDaemonDown firing", firing, 30)
    assert [a["labels"]["node"] for a in alerts] == [stopped.node]
    assert alerts[0]["labels"]["severity"] == "critical"
    assert alerts[0]["annotations"]["summary"] == f"tessera-node on {stopped.node} is down"
    assert prom.targets_up("tessera-node") == {f"127.0.0.1:{stopped.port}": 0.0,
                                               f"127.0.0.1:{alive.port}": 1.0}
    # the only other alerts firing are the quota this run lowered below its use and the
    # audit's findings (a claimed GPU is the operator's refusal, not a failed apply; the
    # operator and its leader are up; every audit succeeds)
    others = {(a["labels"]["alertname"], a["labels"].get("namespace"),
               a["labels"].get("resource")) for a in prom.alerts() if a["state"] == "firing"}
    assert others == {("TesseraNodeDaemonDown", None, None),
                      ("TesseraQuotaNearHard", scene.namespace, "memory"),
                      ("TesseraContainerOverBudget", scene.namespace, None),
                      ("TesseraForeignGpuProcess", None, None)}
    save_dashboard_data(scene, json.loads(DASHBOARD.read_text()))
