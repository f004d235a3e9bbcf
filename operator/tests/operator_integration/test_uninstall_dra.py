"""The uninstall hook's DRA part against the real API server: it stops every node daemon
DaemonSet it is given (with DRA pools, ``tessera-node-dra`` beside ``tessera-node``), and
then deletes the ResourceSlices of tessera's driver, every node's, and no other driver's.
Before, ``tessera-node-dra`` went on running after ``helm uninstall`` and its slices stayed
for the scheduler to allocate to claims no node would prepare."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tessera.api.names import DRA_DRIVER
from tessera.kube.client import Kube, load_credentials
from tessera_operator.uninstall.run import Targets, delete_resource_slices, stop_workloads

from .harness import kubectl_json

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

OTHER = "nic.example.com"


def daemonset(ns: str, name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {"apiVersion": "apps/v1", "kind": "DaemonSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"nodeSelector": {"tessera.test/none": "none"},
                         "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]}}}}


def deployment(ns: str, name: str) -> dict[str, Any]:
    body = daemonset(ns, name)
    body["kind"] = "Deployment"
    return body


def resource_slice(name: str, driver: str, node: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu0"}]}}


def test_uninstall_stops_every_daemonset_and_deletes_only_tessera_s_slices(
        cluster: Any, namespace: str) -> None:
    ns = namespace
    made = [daemonset(ns, "tessera-node"), daemonset(ns, "tessera-node-dra"),
            deployment(ns, "tessera-scheduler"),
            resource_slice("uninstall-a", DRA_DRIVER, "uninstall-node-a"),
            resource_slice("uninstall-b", DRA_DRIVER, "uninstall-node-b"),
            resource_slice("uninstall-nic", OTHER, "uninstall-node-a")]
    for body in made:
        out = cluster.kubectl("create", "-f", "-", input=json.dumps(body))
        assert out.returncode == 0, out.stderr

    async def run() -> tuple[int, int]:
        kube = Kube(load_credentials(str(cluster.kubeconfig)))
        try:
            stopped = await stop_workloads(kube, Targets(
                namespace=ns,  # the operator's is not there: nothing to stop
                deployments=("tessera-operator", "tessera-scheduler"),
                daemonsets=("tessera-node", "tessera-node-dra"), leases=(), secrets=()), 60)
            return stopped, await delete_resource_slices(kube)
        finally:
            await kube.close()
    try:
        stopped, slices = asyncio.run(run())
        assert (stopped, slices) == (3, 2)
        assert kubectl_json(cluster, "get", "daemonsets", "-n", ns)["items"] == []
        assert kubectl_json(cluster, "get", "deployments", "-n", ns)["items"] == []
        left = {s["metadata"]["name"] for s in kubectl_json(
            cluster, "get", "resourceslices")["items"]
            if s["metadata"]["name"].startswith("uninstall-")}
        assert left == {"uninstall-nic"}
    finally:
        cluster.kubectl("delete", "resourceslice", "uninstall-a", "uninstall-b",
                        "uninstall-nic", "--ignore-not-found")
