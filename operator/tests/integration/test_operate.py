"""What an operator of tessera sees, checked against a real run: the operator (two replicas)
and two tessera-node daemons on simulated GPU nodes, scraped by a real Prometheus.

- Argo CD's verdict (deploy/argocd/health.lua in Argo CD's gopher-lua) on the GPUPartition
  and GPUQuota objects the API server returns here: Healthy, Degraded, Progressing for a
  generation not yet observed, Progressing with the Ready condition's message;
- every Grafana dashboard query, its variables expanded (All and each value) and
  ``$__rate_interval`` replaced, returns series, except those on metrics still pending
  (``tessera_e2e.dashboard.PENDING``), which must return none;
- "daemon down" (deploy/prometheus/tessera-rules.yaml, its ``for`` shortened to 2 s) fires
  for the daemon that is stopped, and only for it.

At the end the run's series for the dashboard's main panels (the daemon's stop included) are
saved (``dashboard-data.json`` in the test's temporary directory, or where
``TESSERA_DASHBOARD_DATA`` says) for ``deploy/grafana/render.py``, which draws the README's
picture from them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import API_VERSION, VGPU_CORES, VGPU_MEMORY
from tessera_e2e import dashboard
from tessera_e2e.argocd import HEALTH_SCRIPT, ensure_argocd_health, evaluate
from tessera_e2e.node_daemons import NodeDaemonProcess, remove_sim_daemon, start_sim_daemon
from tessera_e2e.prometheus import LocalPrometheus, scaled_rules

from .conftest import Operators
from .harness import REPO, kubectl_json, wait_until

pytestmark = pytest.mark.integration

RULES = REPO / "deploy" / "prometheus" / "tessera-rules.yaml"
DASHBOARD = REPO / "deploy" / "grafana" / "tessera-dashboard.json"
SCRAPE_S = 1.0
INTERVAL_S = 15.0
"""Grafana's ``$__interval`` assumed for the check (its minimum for a 1 h range)."""
FAST = ["--resync-interval", "2", "--retry-interval", "1"]


@dataclass
class Scene:
    cluster: Any
    ops: Operators
    prom: LocalPrometheus
    pool: str
    namespace: str
    daemons: list[NodeDaemonProcess]
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
        for _ in range(2):
            daemons.append(start_sim_daemon(cluster.kubectl, cluster.kubeconfig, directory,
                                            ["H100-80GB"] * 2, {"pool": pool}, FAST))
        prom.set_targets("tessera-node", {f"127.0.0.1:{d.port}": {"node": d.node}
                                          for d in daemons})
        assert cluster.kubectl("create", "namespace", ns).returncode == 0
        cluster.wait_for_service_account(ns)
        yield Scene(cluster, operators, prom, pool, ns, daemons)
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
    refused = c.kubectl("create", "-f", "-", input=json.dumps(pod("too-big", ns, 4096, 10)))
    assert refused.returncode != 0 and "hard" in refused.stderr, refused.stderr

    def counted() -> Any:
        q = kubectl_json(c, "get", "gpuquota", "team", "-n", ns)
        return q if ((q.get("status") or {}).get("used") or {}).get("memory") == "2Gi" else None
    seen["quota counted"] = wait_until("used 2Gi", counted, 30)
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
    # the only other alert firing is the quota this run lowered below its use (a claimed GPU
    # is the operator's refusal, not a failed apply; the operator and its leader are up)
    others = {(a["labels"]["alertname"], a["labels"].get("namespace"),
               a["labels"].get("resource")) for a in prom.alerts() if a["state"] == "firing"}
    assert others == {("TesseraNodeDaemonDown", None, None),
                      ("TesseraQuotaNearHard", scene.namespace, "memory")}
    save_dashboard_data(scene, json.loads(DASHBOARD.read_text()))
