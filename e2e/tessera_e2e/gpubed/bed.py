"""The GPU test bed: the test bed's real nodes with the operator and ``tessera-node`` running,
and the small helpers the tests that run GPU pods on them share: apply, wait for a pod's
phase, read its logs, a node's allocatable resources, a GPUQuota, a GPU pod's manifest.

``Bed`` works with either way of running tessera: ``gpu_bed`` here runs the operator and each
daemon as host processes (each daemon in its node's namespaces, as a DaemonSet pod would be;
a test can hold its PodResources connection), ``chart_bed.chart_bed`` installs the chart."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any, Generic, Protocol, TypeVar

from tessera.api.names import API_VERSION, MIG_PREFIX, VGPU, VGPU_CORES, VGPU_MEMORY
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.daemons import KubeletNodeDaemon, daemon_kubeconfig, node_json
from tessera_e2e.nodes.images import WORKLOAD
from tessera_e2e.operator.quotas import wait_admitting
from tessera_e2e.operator.replicas import LocalOperators, wait_until

SHARES = 10  # the daemon's default shares per GPU
BUDGET_WAIT_S = 8  # how long libtessera waits for a pending budget file
ANCHOR = {"name": "daemon", "image": WORKLOAD, "imagePullPolicy": "Never",
          "command": ["sleep", "86400"]}
"""The container of the pod each daemon's token is bound to."""


class NodeDaemon(Protocol):
    """``tessera-node`` on one real node, however it runs."""

    state_dir: Path
    """Its state directory as seen from the host (budget files under ``containers/``)."""

    def get(self, url: str) -> tuple[int, str]:
        """(HTTP status, body) of a GET on its metrics port; (0, why) when it is not up."""
        ...

    def log_records(self, since: float = 0.0) -> list[dict[str, Any]]: ...

    def smi(self, *args: str) -> CompletedProcess[str]:
        """nvidia-smi on its node, as an administrator would run it."""
        ...

    def restart(self) -> None:
        """Stop it and start it again; returns once it is ready."""
        ...


D = TypeVar("D", bound=NodeDaemon)


class Bed(Generic[D]):
    def __init__(self, cluster: LocalCluster, daemons: Mapping[str, D],
                 operators: LocalOperators | None = None) -> None:
        self.operators = operators
        self.cluster = cluster
        self.daemons = daemons

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        return self.cluster.kubectl(*args, input=input)

    def apply(self, namespace: str, manifest: dict[str, Any]) -> None:
        out = self.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
        assert out.returncode == 0, out.stderr

    def get(self, *args: str) -> Any:
        out = self.kubectl("get", *args, "-o", "json")
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        found: dict[str, Any] = self.get("pod", "-n", namespace, name)
        return found

    def wait_phase(self, namespace: str, name: str, phases: set[str],
                   timeout_s: float = 90) -> dict[str, Any]:
        found: dict[str, Any] = wait_until(
            f"pod {name} to be {sorted(phases)}",
            lambda: (p if (p := self.pod(namespace, name))["status"].get("phase") in phases
                     else None), timeout_s, 0.5)
        return found

    def assert_untouched(self, namespace: str, name: str) -> None:
        """The pod still runs, its container never restarted, and it still reaches its one
        GPU unit (``cuda-info`` in it sees one device)."""
        pod = self.pod(namespace, name)
        assert pod["status"]["phase"] == "Running", pod["status"]
        assert pod["status"]["containerStatuses"][0]["restartCount"] == 0, pod["status"]
        out = self.kubectl("exec", "-n", namespace, name, "--", "cuda-info")
        assert out.returncode == 0 and "devices 1" in out.stdout, out.stdout + out.stderr

    def logs(self, namespace: str, name: str, container: str | None = None) -> str:
        which = ["-c", container] if container else []
        return str(self.kubectl("logs", "-n", namespace, name, *which).stdout)

    def samples(self, node: str, name: str, namespace: str) -> list[tuple[str, float]]:
        """(pod label, value) of each sample of metric ``name`` in ``namespace`` on the
        node's tessera-node."""
        from prometheus_client.parser import text_string_to_metric_families

        status, text = self.daemons[node].get("/metrics")
        assert status == 200, text
        return [(s.labels.get("pod", ""), float(s.value))
                for f in text_string_to_metric_families(text) for s in f.samples
                if s.name == name and s.labels.get("namespace") == namespace]

    def core_busy(self, node: str, namespace: str) -> dict[str, float]:
        """Per pod, the GPU-seconds its containers kept their GPUs (or MIG instances) busy,
        as tessera-node's core controllers counted them."""
        out: dict[str, float] = {}
        for pod, v in self.samples(node, "tessera_container_core_busy_seconds_total",
                                   namespace):
            out[pod] = out.get(pod, 0.0) + v
        return out

    def busy_window(self, node: str, namespace: str, seconds: float
                    ) -> tuple[dict[str, float], float]:
        """Busy GPU-seconds per pod over the next ``seconds`` (what ``rate()`` over that
        window shows), and the wall time it took."""
        t0, a = time.monotonic(), self.core_busy(node, namespace)
        time.sleep(seconds)
        t1, b = time.monotonic(), self.core_busy(node, namespace)
        return {p: b[p] - a.get(p, 0.0) for p in b}, t1 - t0

    def gpu_memory_by_pod(self, node: str) -> dict[str, int]:
        """MiB of GPU memory held on the node, per pod UID, as NVML counts it: the node's
        ``nvidia-smi --query-compute-apps`` (host PIDs), each process's pod from its
        ``/proc/<pid>/cgroup`` (the kernel's word, as the audit reads it); processes in no
        pod under ``""``, processes gone since the query left out."""
        from tessera_node.device.cgroups import cgroup_owner

        out = self.daemons[node].smi("--query-compute-apps=pid,used_memory",
                                     "--format=csv,noheader,nounits")
        assert out.returncode == 0, out.stderr
        held: dict[str, int] = {}
        for line in out.stdout.splitlines():
            if not line.strip():
                continue
            pid, mib = (field.strip() for field in line.split(","))
            try:
                owner = cgroup_owner(Path(f"/proc/{pid}/cgroup").read_text())
            except OSError:
                continue
            key = owner.pod_uid if owner else ""
            held[key] = held.get(key, 0) + int(mib)
        return held

    def allocatable(self, node: str) -> dict[str, str]:
        alloc: dict[str, str] = node_json(self.kubectl, node)["status"].get("allocatable", {})
        return alloc

    def quota(self, namespace: str, hard: dict[str, Any] | None = None,
              max_: dict[str, Any] | None = None,
              enforcement: dict[str, str] | None = None,
              idle: dict[str, Any] | None = None) -> None:
        spec: dict[str, Any] = {"hard": hard or {"memory": "400Gi", "cores": 4000, "pods": 100},
                                "default": {"memory": "1Gi", "cores": 10},
                                "max": max_ or {"memory": "80Gi", "cores": 100}}
        if enforcement:
            spec["enforcement"] = enforcement
        if idle:
            spec["idle"] = idle
        self.apply(namespace, {"apiVersion": API_VERSION, "kind": "GPUQuota",
                               "metadata": {"name": "team"}, "spec": spec})
        wait_admitting(self.cluster, namespace)  # a quota admits nothing before that

    def resize(self, namespace: str, pod: str, *args: str) -> CompletedProcess[str]:
        return resize_pod(self.cluster.kubeconfig, namespace, pod, *args)

    def events(self, namespace: str, name: str, reason: str) -> list[str]:
        """The messages of tessera-node's Events with ``reason`` on the object ``name``."""
        out = self.kubectl("get", "events", "-n", namespace, "-o", "json", "--field-selector",
                           f"involvedObject.name={name},reason={reason}")
        assert out.returncode == 0, out.stderr
        return [e["message"] for e in json.loads(out.stdout)["items"]
                if (e.get("source") or {}).get("component") == "tessera-node"]

    def wait_partition_removed(self, name: str, node: str = "node-0") -> None:
        """After ``kubectl delete gpupartition name`` (deletionPolicy Reset): gone, and the
        node advertising its whole GPU again."""
        wait_until(f"partition {name} reset and gone", lambda: self.kubectl(
            "get", "gpupartition", name).returncode != 0, 180, 1)
        wait_until(f"{node} advertising its whole GPU again", lambda: (
            a if (a := self.allocatable(node)).get(VGPU) == str(SHARES)
            and not any(k.startswith(MIG_PREFIX) and v != "0" for k, v in a.items())
            else None), 60, 1)

    def restart_kubelet(self, node: str, device_plugin: bool = True) -> None:
        """Kill the node's kubelet and start it again; returns once tessera-node has served
        and registered its device plugin again and the node advertises its shares (without
        ``device_plugin``, a DRA node: at once, the caller waits for what it needs)."""
        restarted = time.time()
        self.cluster.node(node).restart_kubelet(kill=True)
        if not device_plugin:
            return
        d = self.daemons[node]
        wait_until("the daemon registering again", lambda: any(
            r.get("msg") == "serving and registering again"
            for r in d.log_records(restarted)), 60)
        wait_until(f"{node} advertising its shares again", lambda: self.allocatable(
            node).get(VGPU) == str(SHARES), 60, 1)

    def restart_daemon(self, node: str) -> None:
        """Stop ``tessera-node`` on the node and start it again; returns once it is
        ready."""
        self.daemons[node].restart()


def gpu_pod(name: str, command: str, limits: dict[str, str], node: str | None = "node-0",
            env: dict[str, str] | None = None,
            more: dict[str, tuple[str, dict[str, str]]] | None = None) -> dict[str, Any]:
    """A pod whose container ``main`` runs ``command``; ``more``: further containers, name ->
    (command, limits)."""
    containers = []
    for cname, (cmd, lim) in {"main": (command, limits), **(more or {})}.items():
        c: dict[str, Any] = {"name": cname, "image": WORKLOAD, "imagePullPolicy": "Never",
                             "command": ["sh", "-c", cmd], "resources": {"limits": lim}}
        if env:
            c["env"] = [{"name": k, "value": v} for k, v in env.items()]
        containers.append(c)
    spec: dict[str, Any] = {"containers": containers, "restartPolicy": "Never",
                            "terminationGracePeriodSeconds": 1}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def claim_pod(name: str, command: str, *, claim: str | None = None,
              template: str | None = None, node: str | None = "node-0") -> dict[str, Any]:
    """A pod whose container ``main`` runs ``command`` and uses one DRA claim, named
    (``claim``) or made from a ResourceClaimTemplate (``template``); ``node``: None for
    wherever the scheduler finds room."""
    ref = ({"resourceClaimName": claim} if claim is not None
           else {"resourceClaimTemplateName": template})
    spec: dict[str, Any] = {
        "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
        "resourceClaims": [{"name": "gpu", **ref}],
        "containers": [{"name": "main", "image": WORKLOAD, "imagePullPolicy": "Never",
                        "command": ["sh", "-c", command],
                        "resources": {"claims": [{"name": "gpu"}]}}]}
    if node:
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def resize_pod(kubeconfig: Path, namespace: str, pod: str, *args: str
               ) -> CompletedProcess[str]:
    """``tessera resize`` of a running pod, waiting up to 30 s for the outcome (exit 0:
    applied, 1: refused, the reason on stderr)."""
    return subprocess.run(
        [sys.executable, "-m", "tessera_operator.cli.main", "resize", pod, "-n", namespace,
         "--kubeconfig", str(kubeconfig), "--wait", "30", *args],
        capture_output=True, text=True, timeout=90)


def vgpu(memory_mib: int, cores: int = 50, shares: int = 1) -> dict[str, str]:
    return {VGPU: str(shares), VGPU_MEMORY: str(memory_mib), VGPU_CORES: str(cores)}


@contextlib.contextmanager
def gpu_bed(cluster: LocalCluster, logdir: Path,
            operators: tuple[str, ...] = ("op-a", "op-b"),
            daemon_args: tuple[str, ...] = (), operator_args: tuple[str, ...] = (),
            node_args: Mapping[str, tuple[str, ...]] | None = None
            ) -> Iterator[Bed[KubeletNodeDaemon]]:
    """The operator (replicas named ``operators``, with ``operator_args`` besides the test
    bed's) and one ready ``tessera-node`` per real node (with ``daemon_args``, and a node's
    own ``node_args`` after them: e.g. one node of DRA beside device-plugin ones); all
    stopped on exit."""
    assert cluster.pki is not None
    ops = LocalOperators(cluster.kubectl, cluster.kubeconfig, logdir, names=operators,
                         webhook_client_ca=cluster.pki.webhook_client_ca).setup()
    ops.extra += list(operator_args)
    daemons: dict[str, KubeletNodeDaemon] = {}
    try:
        ops.ensure_running()
        for node in cluster.nodes:
            kc = daemon_kubeconfig(cluster.kubectl, cluster.kubeconfig, logdir,
                                   node.name, container=ANCHOR)
            d = KubeletNodeDaemon(node, kc, logdir, [
                "--budget-wait", str(BUDGET_WAIT_S), "--audit-interval", "2", *daemon_args,
                *(node_args or {}).get(node.name, ())])
            daemons[node.name] = d
            d.start()
        for d in daemons.values():
            d.wait_ready()
        yield Bed(cluster, daemons, ops)
    finally:
        for d in daemons.values():
            d.stop()
        ops.stop_all()
        ops.uninstall_webhooks()
