"""Nodes that stop: the node lifecycle controller evicts a stopped node's pods, and tearing the
test bed down (cleanly, or after its runner was SIGKILLed) leaves nothing behind.

Each test runs a cluster of its own (runs in tmp_path), so stopping nodes disturbs nobody.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tessera_e2e.controlplane.cache import Layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.processes import cmdline, is_running, process_start_time
from tessera_e2e.nodes.cgroups import hierarchies
from tessera_e2e.operator.replicas import wait_until

pytestmark = pytest.mark.integration

THIS_DIR = Path(__file__).resolve().parent




def _quiet(line: str) -> None:
    pass


def _namespace_inode(pid: int, kind: str) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/{kind}")
    except OSError:
        return ""


def _ticks_since_boot() -> int:
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def _all_pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


@dataclass
class Footprint:
    """What a running test bed has on the host; `left()` says what is still there."""

    run: str
    cgroups: list[str]
    pids: list[int]  # every process of every node: daemons, shims, containers
    namespaces: list[str]  # the nodes' and pods' network and mount namespaces
    links: list[str]
    pod_subnets: list[str]
    container_pids: list[int] = field(default_factory=list)
    taken_at: int = 0  # clock ticks since boot, as in /proc/<pid>/stat

    @classmethod
    def of(cls, cluster: LocalCluster) -> Footprint:
        assert cluster.run is not None and cluster.network is not None
        pids = [pid for node in cluster.nodes for pid in node.cgroup.pids()]
        daemons = {c.process.pid for node in cluster.nodes for c in node.daemons.values()}
        daemons |= {node.holder_pid for node in cluster.nodes}
        plan = cluster.network.plan
        return cls(
            run=str(cluster.run.path),
            cgroups=[node.cgroup.name for node in cluster.nodes],
            pids=pids,
            namespaces=sorted({_namespace_inode(pid, kind) for pid in pids
                               for kind in ("net", "mnt")} - {_namespace_inode(1, "net"),
                                                              _namespace_inode(1, "mnt"), ""}),
            links=[plan.bridge, *(plan.veth(node.index) for node in cluster.nodes)],
            pod_subnets=[plan.pod_subnet(node.index) for node in cluster.nodes],
            container_pids=[pid for pid in pids if pid not in daemons
                            and "containerd-shim" not in cmdline(pid)],
            taken_at=_ticks_since_boot(),
        )

    def left(self) -> list[str]:
        found = [f"process {pid} ({cmdline(pid)[:80]})" for pid in self.pids if is_running(pid)]
        found += [f"process {pid} naming the run ({cmdline(pid)[:80]})" for pid in _all_pids()
                  if self.run in cmdline(pid) and pid != os.getpid()]
        found += [f"cgroup {hierarchy / name}" for hierarchy in hierarchies()
                  for name in self.cgroups if (hierarchy / name).exists()]
        # A freed namespace's inode number can be reused by another program's new namespace:
        # only processes older than the footprint count.
        in_use = {_namespace_inode(pid, kind) for pid in _all_pids() for kind in ("net", "mnt")
                  if (process_start_time(pid) or self.taken_at + 1) <= self.taken_at}
        found += [f"namespace {ns} still in use" for ns in self.namespaces if ns in in_use]
        links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
        found += [f"interface {link}" for link in self.links if f" {link}:" in links
                  or f" {link}@" in links]
        routes = subprocess.run(["ip", "route"], capture_output=True, text=True).stdout
        found += [f"route {subnet}" for subnet in self.pod_subnets if subnet in routes]
        mounts = Path("/proc/self/mountinfo").read_text()
        found += ["a mount under the run directory"] if self.run in mounts else []
        rules = subprocess.run(["iptables-save"], capture_output=True, text=True).stdout
        found += [f"host iptables chain {line.split()[0]}" for line in rules.splitlines()
                  if line.startswith((":KUBE-", ":CNI-"))]
        found += [f"run directory {self.run}"] if Path(self.run).exists() else []
        return found


def _sleeper(namespace: str, name: str, node: str) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "nodeName": node, "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "sleep", "image": "tessera.local/workload:1",
                        "imagePullPolicy": "Never", "command": ["sleep", "3600"]}],
    }
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace}, "spec": spec}


def _run_pods(cluster: LocalCluster) -> None:
    """A pod on every node and a Service, so containers, pod networks and kube-proxy's
    iptables chains exist before teardown."""
    cluster.wait_for_service_account("default")
    for node in cluster.nodes:
        applied = cluster.kubectl("apply", "-f", "-",
                                  input=json.dumps(_sleeper("default", f"on-{node.name}",
                                                            node.name)))
        assert applied.returncode == 0, applied.stderr
    assert cluster.kubectl("create", "service", "clusterip", "probe",
                           "--tcp=80:8080").returncode == 0
    waited = cluster.kubectl("wait", "--for=condition=Ready", "pod", "--all", "--timeout=60s")
    assert waited.returncode == 0, waited.stderr


def test_a_stopped_node_is_unreachable_and_its_pods_are_evicted(
    bin_dir: Path, tmp_path: Path
) -> None:
    """The node lifecycle controller (grace period shortened to 20 s) marks the silent node
    Unknown and taints it NoExecute; its pods, tolerating that for 2 s, are evicted and the
    Deployment's replacement runs on the node that is left."""
    from test_nodes import spread  # same folder: pytest puts it on sys.path

    with LocalCluster(bin_dir, Layout(tmp_path), nodes=2, report=_quiet) as cluster:
        cluster.wait_for_service_account("default")
        labels = {"app": "spread"}
        tolerations = [{"key": f"node.kubernetes.io/{taint}", "operator": "Exists",
                        "effect": "NoExecute", "tolerationSeconds": 2}
                       for taint in ("unreachable", "not-ready")]
        deployment = {
            "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "spread"},
            "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "sleep", "image": "tessera.local/workload:1",
                                         "imagePullPolicy": "Never",
                                         "command": ["sleep", "3600"]}],
                         "terminationGracePeriodSeconds": 1, "tolerations": tolerations,
                         # one per node; a node tainted unreachable no longer counts
                         "topologySpreadConstraints": [
                             {**spread("spread")[0], "nodeTaintsPolicy": "Honor"}]}}},
        }
        assert cluster.kubectl("apply", "-f", "-", input=json.dumps(deployment)).returncode == 0
        assert cluster.kubectl("rollout", "status", "deployment/spread",
                               "--timeout=90s").returncode == 0

        def pods() -> list[dict[str, Any]]:
            items: list[dict[str, Any]] = json.loads(cluster.kubectl(
                "get", "pods", "-l", "app=spread", "-o", "json").stdout)["items"]
            return items

        victims = [p["metadata"]["name"] for p in pods() if p["spec"]["nodeName"] == "node-1"]
        assert len(victims) == 1, [p["spec"]["nodeName"] for p in pods()]

        cluster.node("node-1").stop()

        def node_unreachable() -> bool:
            node = json.loads(cluster.kubectl("get", "node", "node-1", "-o", "json").stdout)
            ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
            taints = {(t["key"], t["effect"]) for t in node["spec"].get("taints", [])}
            return ready["status"] == "Unknown" and (
                "node.kubernetes.io/unreachable", "NoExecute") in taints

        wait_until("node-1 to be Unknown and tainted unreachable", node_unreachable, 60)

        def evicted_and_replaced() -> bool:
            now = pods()
            victim = [p for p in now if p["metadata"]["name"] in victims]
            running_on_0 = [p for p in now if p["spec"].get("nodeName") == "node-0"
                            and p["status"].get("phase") == "Running"
                            and "deletionTimestamp" not in p["metadata"]]
            return all("deletionTimestamp" in p["metadata"] for p in victim) and \
                len(running_on_0) == 2

        wait_until("the pod on node-1 evicted, both replicas on node-0", evicted_and_replaced,
                   60)


def test_teardown_leaves_nothing_behind(bin_dir: Path, tmp_path: Path) -> None:
    cluster = LocalCluster(bin_dir, Layout(tmp_path), nodes=2, report=_quiet).start()
    try:
        _run_pods(cluster)
        footprint = Footprint.of(cluster)
        # It is there to be removed: containers, pod and node namespaces, mounts, rules.
        assert len(footprint.container_pids) >= 4, footprint  # two sandboxes + two sleeps
        assert len(footprint.namespaces) >= 6, footprint  # 2 nodes x (net, mnt) + pods
        assert footprint.left(), "nothing found while running: the check checks nothing"
        for node in cluster.nodes:
            assert ":KUBE-SERVICES" in node.exec_on_node("iptables-save").stdout
            assert node.exec_on_node("ip", "link", "show", "cni0").returncode == 0
            assert "overlay" in node.exec_on_node("cat", "/proc/self/mountinfo").stdout
    finally:
        cluster.stop()
    assert footprint.left() == []


RUNNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[3])
    from tessera_e2e.controlplane.cache import Layout
    from tessera_e2e.controlplane.cluster import LocalCluster
    from test_node_lifecycle import Footprint, _run_pods
    cluster = LocalCluster(Path(sys.argv[1]), Layout(Path(sys.argv[2])), nodes=1,
                           report=lambda line: None).start()
    _run_pods(cluster)
    daemons = [c.process.pid for c in cluster.components]
    daemons += [c.process.pid for n in cluster.nodes for c in n.daemons.values()]
    print(json.dumps({"footprint": Footprint.of(cluster).__dict__, "daemons": daemons}),
          flush=True)
    time.sleep(600)
""")


def test_after_the_runner_is_sigkilled_the_next_start_removes_its_nodes(
    bin_dir: Path, tmp_path: Path
) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    runner = subprocess.Popen(
        [sys.executable, "-c", RUNNER, str(bin_dir), str(tmp_path), str(THIS_DIR)],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert runner.stdout is not None
        line = runner.stdout.readline()
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait()
    assert line, "the runner did not start its cluster"
    started = json.loads(line)
    footprint = Footprint(**started["footprint"])
    wait_until("the runner's daemons to die with it (PDEATHSIG)",
               lambda: not any(is_running(pid) for pid in started["daemons"]), 10)
    # Containers and their shims are not children of the runner: they outlive it ...
    assert any(is_running(pid) for pid in footprint.container_pids), footprint
    # ... until the next start sweeps the killed run.
    with LocalCluster(bin_dir, Layout(tmp_path), controllers=False, report=_quiet):
        pass
    assert footprint.left() == []
