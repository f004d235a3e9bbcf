"""Real nodes run plain pods: kubelet + containerd + runc + kube-proxy, two nodes, one session.

Every pod uses the locally built `tessera.local/workload:1` image with imagePullPolicy Never
(nothing can be pulled here). Tests that stop a node or the whole test bed are in
test_node_lifecycle.py, on clusters of their own.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tessera_e2e.controlplane.build import build_inputs
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.pins import load_containerd_version
from tessera_e2e.nodes.images import WORKLOAD
from tessera_e2e.nodes.node import GPU_DIR
from tessera_e2e.operator.replicas import wait_until

pytestmark = pytest.mark.integration

NODE_NAMES = ["node-0", "node-1"]


def apply(cluster: LocalCluster, namespace: str, manifest: dict[str, Any]) -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(manifest))
    assert result.returncode == 0, result.stderr


def get(cluster: LocalCluster, namespace: str, *what: str) -> dict[str, Any]:
    result = cluster.kubectl("get", "-n", namespace, *what, "-o", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def container(name: str, command: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": WORKLOAD, "imagePullPolicy": "Never",
            "command": ["sh", "-c", command], **extra}


def pod(name: str, command: str, node: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"containers": [container(name, command)], "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1,
                 **({"nodeName": node} if node else {}), **spec},
    }


def spread(app: str) -> list[dict[str, Any]]:
    """One pod per node: the scheduler must put them on different nodes."""
    return [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
             "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {"matchLabels": {"app": app}}}]


def wait_phase(cluster: LocalCluster, namespace: str, name: str, phases: set[str],
               timeout_s: float = 60) -> dict[str, Any]:
    def phase() -> dict[str, Any] | None:
        got = get(cluster, namespace, "pod", name)
        return got if got["status"].get("phase") in phases else None

    found: dict[str, Any] = wait_until(f"pod {name} to be {sorted(phases)}", phase, timeout_s)
    return found


@pytest.mark.oldest_kubernetes
def test_nodes_are_ready_with_their_own_address_runtime_and_version(
    node_cluster: LocalCluster,
) -> None:
    nodes = json.loads(node_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert sorted(n["metadata"]["name"] for n in nodes) == NODE_NAMES
    assert node_cluster.network is not None
    for node in nodes:
        index = NODE_NAMES.index(node["metadata"]["name"])
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == node_cluster.network.plan.node_ip(index)
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == build_inputs().pins.kubernetes
        runtime = "containerd://" + load_containerd_version().lstrip("v")
        assert info["containerRuntimeVersion"] == runtime
        ready = next(c for c in node["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
    for local in node_cluster.nodes:
        # Pods and nodes reach each other and the API server, and nothing beyond this machine.
        routes = local.exec_on_node("ip", "route").stdout
        assert "default" not in routes and local.ip in routes, routes
        assert local.exec_on_node("hostname").stdout.strip() == local.name


def test_each_node_has_its_own_device_plugin_folder_and_simulated_gpus(
    node_cluster: LocalCluster, node_namespace: str
) -> None:
    """The kubelet's fixed registration socket exists once per node, in the node's own mount
    namespace; a dynamically linked CUDA program in a pod gets libcuda.so.1 from what the
    node mounts and sees that node's GPUs."""
    sockets = set()
    for node in node_cluster.nodes:
        listed = node.exec_on_node("ls", "-i", "/var/lib/kubelet/device-plugins/kubelet.sock")
        assert listed.returncode == 0, listed.stderr
        sockets.add(listed.stdout.split()[0])  # the inode: two distinct files
        assert node.host_path("/var/lib/kubelet/device-plugins/kubelet.sock").is_socket()
    assert len(sockets) == len(NODE_NAMES)

    node_cluster.wait_for_service_account(node_namespace)
    expected = {"node-0": "H100", "node-1": "A100"}
    for node_name in NODE_NAMES:
        name = f"cuda-{node_name}"
        manifest = pod(name, "cuda-info", node_name)
        manifest["spec"]["containers"][0].update(
            env=[{"name": "TESSERA_SIM_NODE", "value": f"{GPU_DIR}/node.conf"}],
            volumeMounts=[{"name": "driver", "mountPath": "/usr/local/nvidia/lib64",
                           "readOnly": True},
                          {"name": "gpu", "mountPath": GPU_DIR}],
        )
        manifest["spec"]["volumes"] = [
            {"name": "driver", "hostPath": {"path": f"{GPU_DIR}/lib", "type": "Directory"}},
            {"name": "gpu", "hostPath": {"path": GPU_DIR, "type": "Directory"}},
        ]
        apply(node_cluster, node_namespace, manifest)
    for node_name in NODE_NAMES:
        name = f"cuda-{node_name}"
        done = wait_phase(node_cluster, node_namespace, name, {"Succeeded", "Failed"})
        logs = node_cluster.kubectl("logs", "-n", node_namespace, name).stdout
        assert done["status"]["phase"] == "Succeeded", logs
        assert "devices 1" in logs and expected[node_name] in logs, logs

    no_driver = pod("cuda-without-driver", "cuda-info", "node-0")
    apply(node_cluster, node_namespace, no_driver)
    failed = wait_phase(node_cluster, node_namespace, "cuda-without-driver",
                        {"Succeeded", "Failed"})
    logs = node_cluster.kubectl("logs", "-n", node_namespace, "cuda-without-driver").stdout
    assert failed["status"]["phase"] == "Failed"
    assert "libcuda.so.1" in logs, logs  # the image carries no driver library


def test_a_deployment_and_a_job_run_on_both_nodes(
    node_cluster: LocalCluster, node_namespace: str
) -> None:
    node_cluster.wait_for_service_account(node_namespace)
    labels = {"app": "sleeper"}
    apply(node_cluster, node_namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "sleeper"},
        "spec": {"replicas": 2, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"containers": [container("sleeper", "exec sleep 3600")],
                     "terminationGracePeriodSeconds": 1,
                     "topologySpreadConstraints": spread("sleeper")}}}},
    )
    job_labels = {"app": "counter"}
    apply(node_cluster, node_namespace, {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "counter"},
        "spec": {"completions": 2, "parallelism": 2, "backoffLimit": 0, "template": {
            "metadata": {"labels": job_labels},
            "spec": {"restartPolicy": "Never",
                     "containers": [container("counter", "echo counted on $(hostname)")],
                     "topologySpreadConstraints": spread("counter")}}}},
    )
    done = node_cluster.kubectl("wait", "-n", node_namespace, "--for=condition=Complete",
                                "job/counter", "--timeout=90s")
    assert done.returncode == 0, done.stderr
    available = node_cluster.kubectl("rollout", "status", "-n", node_namespace,
                                     "deployment/sleeper", "--timeout=90s")
    assert available.returncode == 0, available.stderr
    for app in ("sleeper", "counter"):
        pods = get(node_cluster, node_namespace, "pods", "-l", f"app={app}")["items"]
        assert sorted(p["spec"]["nodeName"] for p in pods) == NODE_NAMES, app


def test_logs_and_exec_reach_the_kubelet(node_cluster: LocalCluster, node_namespace: str
                                         ) -> None:
    node_cluster.wait_for_service_account(node_namespace)
    apply(node_cluster, node_namespace,
          pod("talker", "echo first line; echo second line; exec sleep 3600", "node-1"))
    wait_phase(node_cluster, node_namespace, "talker", {"Running"})
    logs = wait_until("the pod's log", lambda: node_cluster.kubectl(
        "logs", "-n", node_namespace, "talker").stdout, 30)
    assert logs.splitlines() == ["first line", "second line"]
    executed = node_cluster.kubectl("exec", "-n", node_namespace, "talker", "--",
                                    "sh", "-c", "echo $((6 * 7)) $(hostname)")
    assert executed.returncode == 0, executed.stderr
    assert executed.stdout.strip() == "42 talker"


def test_a_pod_reaches_a_service_backed_by_the_other_node_and_the_api_server(
    node_cluster: LocalCluster, node_namespace: str
) -> None:
    node_cluster.wait_for_service_account(node_namespace)
    apply(node_cluster, node_namespace, pod(
        "web", "mkdir /www && echo served by $(hostname) > /www/index.html && "
               "exec httpd -f -p 8080 -h /www", "node-1"))
    apply(node_cluster, node_namespace, {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    })
    wait_phase(node_cluster, node_namespace, "web", {"Running"})
    # The Service exists before the client: the kubelet gives it WEB_SERVICE_HOST. Retry while
    # kube-proxy on node-0 has not written the Service's rules yet.
    apply(node_cluster, node_namespace, pod(
        "client",
        "for i in $(seq 30); do wget -qO- http://$WEB_SERVICE_HOST/ && break; sleep 1; done; "
        "wget -qO- --no-check-certificate "
        "https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/version", "node-0"))
    done = wait_phase(node_cluster, node_namespace, "client", {"Succeeded", "Failed"}, 90)
    logs = node_cluster.kubectl("logs", "-n", node_namespace, "client").stdout
    assert done["status"]["phase"] == "Succeeded", logs
    assert logs.startswith("served by web\n"), logs
    assert json.loads(logs.split("\n", 1)[1])["gitVersion"] == build_inputs().pins.kubernetes


def test_running_pods_survive_a_kubelet_restart(node_cluster: LocalCluster,
                                                node_namespace: str) -> None:
    node_cluster.wait_for_service_account(node_namespace)
    apply(node_cluster, node_namespace,
          pod("survivor", "date +%s%N > /tmp/started; exec sleep 3600", "node-0"))
    before = wait_phase(node_cluster, node_namespace, "survivor", {"Running"})
    started = node_cluster.kubectl("exec", "-n", node_namespace, "survivor", "--",
                                   "cat", "/tmp/started").stdout
    assert started.strip()
    node_cluster.node("node-0").restart_kubelet(kill=True)

    # The new kubelet serves at once but learns its pods from the API server a moment later.
    def exec_works() -> str:
        again = node_cluster.kubectl("exec", "-n", node_namespace, "survivor", "--",
                                     "cat", "/tmp/started")
        return again.stdout if again.returncode == 0 else ""

    assert wait_until("exec after the restart", exec_works, 60) == started  # the same process
    after = get(node_cluster, node_namespace, "pod", "survivor")
    old, new = before["status"]["containerStatuses"][0], after["status"]["containerStatuses"][0]
    assert new["containerID"] == old["containerID"]
    assert new["restartCount"] == 0
    assert new["ready"] and new["state"]["running"]["startedAt"] == \
        old["state"]["running"]["startedAt"]
