"""charts/tessera installed with the real helm (``tessera_e2e.controlplane.build.ensure_helm``)
onto a test bed cluster with real nodes: tessera's images are imported into every node's
containerd (never pulled), the nodes' simulated GPUs stand in for the driver.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.chart.render import CHART
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.nodes.config import CONTAINERD_SOCKET
from tessera_e2e.nodes.images import REPOSITORY, Image, import_images
from tessera_e2e.nodes.node import GPU_DIR

RELEASE = "tessera"
# What GPU feature discovery puts on a GPU node; the chart's default daemon affinity wants it.
GPU_NODE_LABEL = "nvidia.com/gpu.present=true"


def values_for_testbed(tag: str) -> dict[str, Any]:
    """Values that run the chart on the test bed: local images, the simulated driver."""
    return {
        "image": {"repository": REPOSITORY, "tag": tag, "pullPolicy": "Never"},
        "nodeDaemon": {
            # the node's simulated GPUs stand in for the driver; the test bed's containerd has
            # no NVIDIA toolkit, so Allocate mounts the simulator's libraries itself (`sim`)
            "driverRoot": GPU_DIR,
            "deviceVisibility": "sim",
            "simNode": f"{GPU_DIR}/node.conf",
        },
        # tessera-scheduler's pods would need the kube-scheduler image from a registry and
        # cluster DNS (the extender's URL is the Service's name): the test bed has neither,
        # so its placement tests run tessera-scheduler on the host, as the chart's
        # ServiceAccount with the chart's configuration (tessera_e2e.operator.scheduler)
        "placement": {"enabled": False},
    }


class Helm:
    """``helm`` against one cluster, with its own config/cache/data directories."""

    def __init__(self, binary: Path, cluster: LocalCluster, home: Path) -> None:
        self.binary = binary
        self.cluster = cluster
        self.env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig),
                    "HELM_CONFIG_HOME": str(home / "config"),
                    "HELM_CACHE_HOME": str(home / "cache"),
                    "HELM_DATA_HOME": str(home / "data")}

    def run(self, *args: str, values: Mapping[str, Any] | None = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            extra: list[str] = []
            if values is not None:
                yaml.safe_dump(dict(values), file)
                file.flush()
                extra = ["--values", file.name]
            return subprocess.run([str(self.binary), *args, *extra], env=self.env,
                                  capture_output=True, text=True, timeout=timeout, check=False)

    def install(self, namespace: str, values: Mapping[str, Any], *extra: str
                ) -> subprocess.CompletedProcess[str]:
        return self.run("install", RELEASE, str(CHART), "--namespace", namespace, "--wait",
                        "--timeout", "8m", *extra, values=values)

    def upgrade(self, namespace: str, values: Mapping[str, Any], *extra: str
                ) -> subprocess.CompletedProcess[str]:
        return self.run("upgrade", RELEASE, str(CHART), "--namespace", namespace, "--wait",
                        "--timeout", "8m", *extra, values=values)

    def uninstall(self, namespace: str) -> subprocess.CompletedProcess[str]:
        return self.run("uninstall", RELEASE, "--namespace", namespace, "--wait",
                        "--timeout", "5m")


def template(binary: Path, namespace: str, values: Mapping[str, Any] | None = None,
             *extra: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart (no cluster): its objects."""
    with tempfile.TemporaryDirectory(prefix="tessera-helm-") as home:
        env = {**os.environ, "HELM_CONFIG_HOME": home, "HELM_CACHE_HOME": home,
               "HELM_DATA_HOME": home}
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(dict(values or {}), file)
            file.flush()
            out = subprocess.run([str(binary), "template", RELEASE, str(CHART), "--namespace",
                                  namespace, "--values", file.name, *extra], env=env,
                                 capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"helm template: {out.stderr.strip()}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def import_into_nodes(cluster: LocalCluster, images: Mapping[str, Image]) -> None:
    for node in cluster.nodes:
        import_images(node.nsenter("-m"), cluster.containerd_bin / "ctr", CONTAINERD_SOCKET,
                      images)


def label_gpu_nodes(cluster: LocalCluster, names: Sequence[str]) -> None:
    for name in names:
        out = cluster.kubectl("label", "node", name, GPU_NODE_LABEL, "--overwrite")
        if out.returncode != 0:
            raise RuntimeError(f"labelling {name}: {out.stderr.strip()}")


def get_json(cluster: LocalCluster, *args: str) -> Any:
    out = cluster.kubectl("get", *args, "-o", "json")
    if out.returncode != 0:
        raise RuntimeError(f"kubectl get {' '.join(args)}: {out.stderr.strip()}")
    return json.loads(out.stdout)
