"""tessera installed by ``helm install`` of charts/tessera onto a cluster of real nodes, and
the steps the chart tests share: tessera's images built (``tessera_images``) and imported into
every node's containerd, the release namespace prepared (PodSecurity ``privileged``, the API
server's webhook client CA), the release installed and waited for until the operator is 2/2
Ready and a daemon is Ready on every node.

``chart_bed`` is the GPU test bed (``gpu_bed.Bed``) on such an install: the operator and
``tessera-node`` run as the chart's Deployment and DaemonSet pods, with the images the test bed
builds, and the node daemons are reached as a user reaches them (their pods' metrics port,
``kubectl logs``, deleting a pod to restart one).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.chart.helm import (
    Helm,
    get_json,
    import_into_nodes,
    label_gpu_nodes,
    values_for_testbed,
)
from tessera_e2e.chart.render import CHART
from tessera_e2e.chart.tessera_images import ensure_tessera_images
from tessera_e2e.controlplane.build import ensure_containerd, ensure_helm
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed
from tessera_e2e.gpubed.daemons import http_get, json_records, node_smi
from tessera_e2e.nodes.images import Image
from tessera_e2e.nodes.node import Node
from tessera_e2e.operator.replicas import OPERATOR_NS, wait_until
from tessera_e2e.paths import REPO

NS = OPERATOR_NS  # the release namespace
TAG = "0.1.0"
LIBTESSERA_BUILD = REPO / "hook" / "build"
WEBHOOK_CLIENT_CONFIGMAP = "tessera-webhook-client"
DAEMON_SELECTOR = "app.kubernetes.io/component=node-daemon"
OPERATOR_SELECTOR = "app.kubernetes.io/component=operator"
READY_TIMEOUT_S = 240
DAEMON_VALUES = yaml.safe_load((CHART / "values.yaml").read_text())["nodeDaemon"]
"""The chart's defaults for the node daemon (its state directory, metrics port)."""


def say(line: str) -> None:
    """A timing or progress line (stderr: `pytest -s` shows it; e2e/README.md's figures)."""
    print(f"[chart] {line}", file=sys.stderr, flush=True)


def build_images(hook_builds: Mapping[str, Path]) -> dict[str, Image]:
    """Both of tessera's images for each tag (``tag -> the hook build whose libtessera the
    node image carries``), built or found in the cache."""
    python = REPO / ".venv" / "bin" / "python"
    images: dict[str, Image] = {}
    for tag, hook_build in hook_builds.items():
        began = time.monotonic()
        built = ensure_tessera_images(default_layout(), python, hook_build, tag)
        images.update({ref: b.image for ref, b in built.items()})
        say(f"images {tag}: " + ", ".join(f"{ref} {b.size_bytes / 2**20:.0f} MiB "
                                          f"({b.seconds:.0f}s)" for ref, b in built.items())
            + f"; {time.monotonic() - began:.1f}s")
    return images


@contextlib.contextmanager
def chart_cluster(bin_dir: Path, helm_home: Path, hook_builds: Mapping[str, Path],
                  keep_logs: Callable[[], bool] = lambda: False
                  ) -> Iterator[tuple[LocalCluster, Helm]]:
    """helm built, tessera's images built for ``hook_builds``' tags, a cluster of two real
    nodes with the images imported into each (nothing installed yet); stopped on exit, its
    component logs kept when ``keep_logs()`` says so. Raises ControlPlaneError when helm or
    containerd cannot be built."""
    started = time.monotonic()
    helm_binary = ensure_helm()
    ensure_containerd()
    say(f"helm ready in {time.monotonic() - started:.1f}s")
    images = build_images(hook_builds)
    cluster = LocalCluster(bin_dir, nodes=2, report=say).start()
    try:
        began = time.monotonic()
        import_into_nodes(cluster, images)
        say(f"images imported into {len(cluster.nodes)} nodes in "
            f"{time.monotonic() - began:.1f}s")
        yield cluster, Helm(helm_binary, cluster, helm_home)
    except BaseException:
        cluster.stop(keep_logs=True)
        raise
    cluster.stop(keep_logs=keep_logs())


def _kubectl(cluster: LocalCluster, *args: str, input: str | None = None
             ) -> subprocess.CompletedProcess[str]:
    out = cluster.kubectl(*args, input=input)
    if out.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr.strip()}")
    return out


def release_values(cluster: LocalCluster, tag: str = TAG) -> dict[str, Any]:
    """The release namespace prepared and the values that run the chart on the test bed:
    the nodes carry GPU feature discovery's label, the namespace states the PodSecurity level
    the daemon needs (privileged, hostPID), and the operator takes admission reviews only
    from the API server (its webhook client CA in a ConfigMap)."""
    label_gpu_nodes(cluster, [node.name for node in cluster.nodes])
    _kubectl(cluster, "create", "namespace", NS)
    _kubectl(cluster, "label", "namespace", NS, "pod-security.kubernetes.io/enforce=privileged")
    assert cluster.pki is not None
    _kubectl(cluster, "create", "configmap", WEBHOOK_CLIENT_CONFIGMAP, "-n", NS,
             f"--from-file=ca.crt={cluster.pki.webhook_client_ca}")
    values = values_for_testbed(tag)
    values["operator"] = {"webhookClient": {"caConfigMap": WEBHOOK_CLIENT_CONFIGMAP}}
    return values


def ready(pod: Mapping[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in (pod.get("status") or {}).get("conditions", []))


def daemon_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    """The DaemonSet's pods that are not terminating."""
    pods = get_json(cluster, "pods", "-n", NS, "-l", DAEMON_SELECTOR)["items"]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def operator_pods(cluster: LocalCluster) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = get_json(cluster, "pods", "-n", NS, "-l",
                                           OPERATOR_SELECTOR)["items"]
    return found


def deployment_ready(cluster: LocalCluster) -> bool:
    """The operator Deployment rolled out: its 2 replicas updated and Ready."""
    d = get_json(cluster, "deployment", "tessera-operator", "-n", NS)
    s = d.get("status") or {}
    return bool(s.get("readyReplicas") == 2 and s.get("updatedReplicas") == 2
                and s.get("replicas") == 2 and s.get("observedGeneration") ==
                d["metadata"]["generation"])


def wait_daemons_ready(cluster: LocalCluster,
                       also: Callable[[dict[str, Any]], bool] = lambda _: True) -> None:
    """A Ready daemon on every node (helm's ``--wait`` counts a DaemonSet ready with
    ``maxUnavailable`` pods not ready, so this waits for all), each passing ``also``."""
    count = len(cluster.nodes)
    wait_until("a Ready daemon on every node", lambda: (lambda pods: len(pods) == count and all(
        ready(p) and also(p) for p in pods))(daemon_pods(cluster)), READY_TIMEOUT_S, 1)


def install(cluster: LocalCluster, helm: Helm, values: Mapping[str, Any]) -> float:
    """``helm install --wait``, then every daemon Ready: the seconds to Ready."""
    started = time.monotonic()
    out = helm.install(NS, values)
    if out.returncode != 0:
        raise RuntimeError(f"helm install: {out.stderr}{out.stdout}")
    say(f"helm install --wait returned: {time.monotonic() - started:.1f}s")
    wait_daemons_ready(cluster)
    seconds = time.monotonic() - started
    say(f"helm install to Ready (operator 2/2, daemons on {len(cluster.nodes)} nodes): "
        f"{seconds:.1f}s")
    return seconds


class ChartDaemon:
    """``tessera-node`` as the chart's DaemonSet runs it on one node, seen from outside as
    its user sees it: its pod's metrics port, ``kubectl logs``, the state directory on the
    host, ``nvidia-smi`` on the host; restarted by deleting its pod."""

    def __init__(self, cluster: LocalCluster, node: Node) -> None:
        self.cluster = cluster
        self.node = node.name
        self.real = node
        self.state_dir = node.host_path(DAEMON_VALUES["stateDir"])
        self.port = int(DAEMON_VALUES["metricsPort"])
        self._pod: dict[str, Any] | None = None

    def pod(self) -> dict[str, Any]:
        """The daemon's pod on this node (the one found last, until a restart)."""
        if self._pod is None:
            pods = [p for p in daemon_pods(self.cluster) if p["spec"].get("nodeName") ==
                    self.node and (p.get("status") or {}).get("podIP")]
            if len(pods) != 1:
                raise RuntimeError(f"expected one running daemon pod on {self.node}, found "
                                   f"{[p['metadata']['name'] for p in pods]}")
            self._pod = pods[0]
        return self._pod

    def get(self, url: str) -> tuple[int, str]:
        """(HTTP status, body) of a GET on the daemon pod's metrics port; (0, why) when it
        does not answer."""
        return http_get(self.pod()["status"]["podIP"], self.port, url)

    def log_records(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The daemon pod's JSON log lines logged at or after ``since`` (``[]`` while the
        kubelet cannot be asked, e.g. right after it restarted)."""
        out = self.cluster.kubectl("logs", "-n", NS, self.pod()["metadata"]["name"])
        return json_records(out.stdout if out.returncode == 0 else "", since)

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return node_smi(self.real, *args)

    def restart(self) -> None:
        """Delete the daemon's pod; returns once the DaemonSet's new pod on this node is
        Ready."""
        old = self.pod()["metadata"]
        _kubectl(self.cluster, "delete", "pod", "-n", NS, old["name"])
        self._pod = None

        def replaced() -> dict[str, Any] | None:
            for p in daemon_pods(self.cluster):
                if p["spec"].get("nodeName") == self.node and p["metadata"]["uid"] != old[
                        "uid"] and ready(p):
                    return p
            return None

        self._pod = wait_until(f"a new Ready daemon pod on {self.node}", replaced,
                               READY_TIMEOUT_S, 1)


@contextlib.contextmanager
def chart_bed(bin_dir: Path, workdir: Path, keep_logs: Callable[[], bool] = lambda: False
              ) -> Iterator[Bed[ChartDaemon]]:
    """A two-node cluster of its own with tessera installed by ``helm install`` of
    charts/tessera (tag ``TAG``, the checkout's libtessera in the node image), everything
    Ready; the GPU test bed on it."""
    with chart_cluster(bin_dir, workdir / "helm", {TAG: LIBTESSERA_BUILD},
                       keep_logs) as (cluster, helm):
        install(cluster, helm, release_values(cluster))
        yield Bed(cluster, {node.name: ChartDaemon(cluster, node) for node in cluster.nodes})
