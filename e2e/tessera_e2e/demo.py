"""The demo, as one story told a short line per step: two real nodes with simulated GPUs
(node-0: 2x H100-80GB, node-1: 1x A100-40GB), tessera's CRDs and examples applied, the
operator and each node's tessera-node running, the example GPUPartitions enacted and Ready,
a GPUQuota, workload pods running under their budgets, an over-budget allocation refused,
and the final ``kubectl get tessera -A``.

Each step is one function (``step_*``), run in order by ``run_demo``. The two inference
pods keep their GPU busy (``cuda-spin``) so that the core controller's work shows: the busy
time split by their core budgets, idle time lent and taken back, and a live resize obeyed
while they run (shares read from tessera-node's own per-container counters).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.nodes.node import GPUs, NodeGPUs, node_gpus
from tessera_e2e.paths import REPO as REPO_ROOT

DEMO_GPUS: tuple[GPUs, ...] = (NodeGPUs(("H100-80GB", "H100-80GB"), nvlink="0-1"),
                               ("A100-40GB",), ("H100-80GB",))
"""The demo's nodes' simulated GPUs: node-0 (two H100s joined by NVLink, both on NUMA node
0), node-1, and node-2 (one H100, tessera's DRA driver instead of its device plugin)."""
DRA_NODE = "node-2"
DRA_TEMPLATE = "h100-4gi-30pct"
"""examples/dra/h100-4gi-30pct.yaml: 4 GiB and 30 % of any H100, shared (consumable
capacity)."""
NODE_LABELS = {"node-0": {"node-role.example.com/inference": "true"},
               "node-1": {"node-pool.example.com/name": "experiments"}}
"""What the example partitions select (examples/h100-inference-pool.yaml: seven shared
1g.10gb instances per H100; examples/a100-40gb-experiments.yaml: whole 3g.20gb + 2x 2g.10gb)."""
TEAM = "demo-team"

Printer = Callable[[str], None]


def _stdout(line: str) -> None:
    print(line, flush=True)


def example_files(repo: Path = REPO_ROOT) -> list[Path]:
    """examples/*.yaml, not examples/bad/ (those must be rejected)."""
    return sorted((repo / "examples").glob("*.yaml"))


def crd_files(repo: Path = REPO_ROOT) -> list[Path]:
    return sorted((repo / "crds").glob("*.yaml"))


def _checked(cluster: LocalCluster, *args: str) -> str:
    result = cluster.kubectl(*args)
    if result.returncode != 0:
        raise ControlPlaneError(
            f"`kubectl {' '.join(args)}` failed: {result.stderr.strip() or result.stdout.strip()}"
        )
    return result.stdout


def install_crds(cluster: LocalCluster, repo: Path = REPO_ROOT) -> list[Path]:
    """Apply crds/*.yaml and wait until every CRD is Established."""
    files = crd_files(repo)
    if not files:
        raise ControlPlaneError(f"no CRDs in {repo / 'crds'}: run `make crds` to generate them")
    for path in files:
        _checked(cluster, "apply", "-f", str(path))
    _checked(cluster, "wait", "--for=condition=Established", "--timeout=30s",
             "customresourcedefinitions", "--all")
    return files


def example_namespaces(files: list[Path]) -> list[str]:
    """Pure: namespaces the examples' objects live in that no example itself creates."""
    used: set[str] = set()
    created: set[str] = set()
    for path in files:
        for doc in yaml.safe_load_all(path.read_text()):
            if not isinstance(doc, dict):
                continue
            metadata = doc.get("metadata") or {}
            if doc.get("kind") == "Namespace":
                created.add(str(metadata.get("name")))
            elif metadata.get("namespace"):
                used.add(str(metadata["namespace"]))
    return sorted(used - created)


def ensure_namespaces(cluster: LocalCluster, names: list[str]) -> list[str]:
    """Create the namespaces that do not exist yet; returns those created."""
    missing = [n for n in names if cluster.kubectl("get", "namespace", n).returncode != 0]
    for name in missing:
        _checked(cluster, "create", "namespace", name)
    return missing


def apply_examples(cluster: LocalCluster, repo: Path = REPO_ROOT) -> list[Path]:
    """Apply examples/*.yaml in name order, after creating the namespaces they use."""
    files = example_files(repo)
    ensure_namespaces(cluster, example_namespaces(files))
    for path in files:
        _checked(cluster, "apply", "-f", str(path))
    return files


class Story:
    """What the steps share: the cluster, the GPU bed (operator + daemons) once started,
    the narrator, and when the demo started (for the first-pod figure)."""

    def __init__(self, cluster: LocalCluster, say: Printer, started: float,
                 repo: Path = REPO_ROOT) -> None:
        self.cluster = cluster
        self.say = say
        self.started = started
        self.repo = repo
        self.bed: Any = None  # tessera_e2e.gpubed.bed.Bed (needs sim/ on the path)

    def kubectl(self, *args: str, input: str | None = None) -> str:
        result = self.cluster.kubectl(*args, input=input)
        if result.returncode != 0:
            raise ControlPlaneError(f"`kubectl {' '.join(args)}` failed: "
                                    f"{result.stderr.strip() or result.stdout.strip()}")
        return str(result.stdout)

    def show(self, *args: str) -> None:
        self.say(f"$ kubectl {' '.join(args)}")
        self.say(self.kubectl(*args).rstrip())


def step_cluster(s: Story) -> None:
    nodes = ", ".join(f"{n.name} ({len(g)}x {g[0]})" for n, g in zip(
        s.cluster.nodes, (node_gpus(d).models for d in DEMO_GPUS), strict=False))
    s.say(f"1. Control plane and three real nodes (kubelet, containerd) ready in "
          f"{time.monotonic() - s.started:.0f}s: {nodes}")
    s.show("get", "nodes", "-o", "wide")  # the Kubernetes and containerd versions


def step_crds_and_examples(s: Story) -> None:
    crds = install_crds(s.cluster, s.repo)
    examples = apply_examples(s.cluster, s.repo)
    s.say(f"2. Installed {len(crds)} CRDs and applied {len(examples)} examples/ "
          f"(partitions, quotas)")
    for node, labels in NODE_LABELS.items():
        s.kubectl("label", "node", node, "--overwrite",
                  *(f"{k}={v}" for k, v in labels.items()))


def step_tessera(s: Story, logdir: Path, stack: Any) -> None:
    from tessera.api.names import DRA_DEVICE_CLASS, DRA_DRIVER
    from tessera_e2e.gpubed.bed import gpu_bed
    from tessera_e2e.operator.replicas import render_chart

    s.bed = stack.enter_context(gpu_bed(
        s.cluster, logdir, operators=("operator",),
        node_args={DRA_NODE: ("--dra", "true", "--device-plugin", "false")}))
    # the chart's permissions for a DRA pool (the node's ResourceSlices) and its DeviceClass
    s.kubectl("apply", "-f", "-", input=render_chart(values={"nodeDaemon": {"dra": {
        "nodeLabels": {"kubernetes.io/hostname": DRA_NODE}}}}))
    s.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]}}))
    s.say(f"3. tessera operator (leader, admission webhooks) and tessera-node on each node "
          f"running ({DRA_NODE}: as a DRA driver, its GPU in a ResourceSlice)")


def partitions_ready(s: Story) -> list[dict[str, Any]] | None:
    items: list[dict[str, Any]] = json.loads(s.kubectl("get", "gpart", "-o", "json"))["items"]
    active = [p for p in items if (p.get("status") or {}).get("selectedNodeCount")]
    done = len(active) == len(NODE_LABELS) and all(
        p["status"].get("readyNodeCount") == p["status"]["selectedNodeCount"] for p in active)
    return active if done else None


def step_partitions(s: Story) -> None:
    from tessera_e2e.operator.replicas import wait_until

    active = wait_until("the partitions selecting the nodes Ready",
                        lambda: partitions_ready(s), 300, 1)
    s.say(f"4. Partitions {', '.join(p['metadata']['name'] for p in active)} enacted by "
          f"tessera-node with nvidia-smi and Ready:")
    s.show("get", "gpart")


def step_quota(s: Story) -> None:
    from tessera_e2e.operator.replicas import wait_until

    s.kubectl("create", "namespace", TEAM)
    s.cluster.wait_for_service_account(TEAM)
    s.bed.quota(TEAM, {"memory": "16Gi", "cores": 200, "pods": 6},
                {"memory": "8Gi", "cores": 100})
    wait_until("the quota Ready", lambda: "True" in s.kubectl("get", "gq", "-n", TEAM), 30)
    s.say(f"5. GPUQuota {TEAM}/team: 16Gi of GPU memory, 200 cores (2 GPUs' worth), 6 pods")


WORKLOADS = (  # name, node, budget MiB, cores, what it holds, MIG resource
    ("infer-a", "node-0", 4096, 30, 4000, None),
    ("infer-b", "node-0", 2048, 70, 2000, None),
    ("train", "node-1", 0, 0, 0, "3g.20gb"),
)


def step_workloads(s: Story) -> None:
    from tessera.api.resources import mig_resource_name
    from tessera_e2e.gpubed.bed import claim_pod, gpu_pod, vgpu
    from tessera_e2e.operator.replicas import wait_until

    for name, node, mib, cores, hold, mig in WORKLOADS:
        limits = {mig_resource_name(mig): "1"} if mig else vgpu(mib, cores)
        command = (f"cuda-info && (cuda-alloc {hold} 86400 &) && "
                   f"cuda-spin 0 1000 {len(name)} {PAUSE}" if hold else
                   "cuda-info && sleep 86400")
        s.bed.apply(TEAM, gpu_pod(name, command, limits, node=node))
    s.kubectl("apply", "-n", TEAM, "-f", str(s.repo / "examples" / "dra" /
                                               f"{DRA_TEMPLATE}.yaml"))
    s.bed.apply(TEAM, claim_pod(DRA_POD, "cuda-info && sleep 86400", template=DRA_TEMPLATE,
                                 node=DRA_NODE))
    for name, node, mib, cores, hold, mig in WORKLOADS:
        s.bed.wait_phase(TEAM, name, {"Running"}, 120)
        if name == WORKLOADS[0][0]:
            s.say(f"6. First GPU pod running {time.monotonic() - s.started:.0f}s after the "
                  f"demo started")
        logs = _wait_logs(s, name, "allocated" if hold else " ")
        gpu = next(line for line in logs.splitlines() if line.startswith("0 ")).split()
        what = f"MIG {mig}, whole" if mig else f"budget {mib} MiB / {cores}% cores"
        held = f", holds {hold} MiB" if hold else ""
        s.say(f"   {name} on {node} ({what}): cuMemGetInfo shows {gpu[-2]} MiB{held}")
    s.bed.wait_phase(TEAM, DRA_POD, {"Running"}, 120)
    logs = _wait_logs(s, DRA_POD, "devices 1")
    gpu = next(line for line in logs.splitlines() if line.startswith("0 ")).split()
    s.say(f"   {DRA_POD} on {DRA_NODE} (DRA: claim from ResourceClaimTemplate {DRA_TEMPLATE}, "
          f"4 GiB / 30% cores of the shared H100): cuMemGetInfo shows {gpu[-2]} MiB")
    # the claim is counted at admission; the GPUQuota's status shows it at the operator's
    # next recount of claim holders (every 5 s)
    wait_until("the claim in the GPUQuota's status", lambda: json.loads(s.kubectl(
        "get", "gq", "team", "-n", TEAM, "-o", "json")).get("status", {}).get("used", {}).get(
        "pods") == len(WORKLOADS) + 1, 30, 0.5)
    s.show("get", "gq", "-n", TEAM)


DRA_POD = "infer-dra"


def _wait_logs(s: Story, pod: str, needle: str) -> str:
    from tessera_e2e.operator.replicas import wait_until

    found: str = wait_until(f"{pod}'s output", lambda: (
        out if needle in (out := s.bed.logs(TEAM, pod)) else None), 60, 0.5)
    return found


SPINNERS = ("infer-a", "infer-b")
PAUSE = "/tmp/pause"
"""While this file exists in an inference pod, its cuda-spin launches nothing."""


def _shares(s: Story, seconds: float) -> tuple[dict[str, float], float]:
    """Each spinner's share of the busy time over the next ``seconds`` (percent), and the
    busiest one's busy fraction of the wall time."""
    got, wall = s.bed.busy_window("node-0", TEAM, seconds)
    total = sum(got.get(p, 0.0) for p in SPINNERS) or 1.0
    return ({p: 100 * got.get(p, 0.0) / total for p in SPINNERS},
            max(got.get(p, 0.0) for p in SPINNERS) / wall)


def _split(shares: dict[str, float]) -> str:
    return " / ".join(f"{p} {v:.1f} %" for p, v in shares.items())


def step_achieved_shares(s: Story) -> None:
    from tessera_e2e.operator.replicas import wait_until

    wait_until("both inference pods under a core controller", lambda: all(
        p in s.bed.core_busy("node-0", TEAM) for p in SPINNERS), 60, 1)
    time.sleep(8)  # in a MIG instance the controller first searches its capacity
    shares, _ = _shares(s, 10)
    budgets = " / ".join(f"{c} %" for _, _, _, c, _, _ in WORKLOADS[:2])
    s.say(f"   Both keep their GPU share busy; core budgets {budgets}, achieved over 10 s: "
          f"{_split(shares)} of the busy time")


def step_refused(s: Story) -> None:
    from tessera_e2e.gpubed.bed import gpu_pod, vgpu

    s.bed.apply(TEAM, gpu_pod("greedy", "cuda-alloc 3000", vgpu(2048, 10), node="node-0"))
    done = s.bed.wait_phase(TEAM, "greedy", {"Succeeded", "Failed"}, 120)
    logs = s.bed.logs(TEAM, "greedy")
    refusal = next((line for line in logs.splitlines() if "cuMemAlloc failed" in line), logs)
    code = done["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"]
    s.say(f"7. greedy asks for 3000 MiB on a 2048 MiB budget: refused, exit {code}: "
          f"{refusal.strip()}")


LENT_BUSY = 0.8
"""How busy infer-a keeps the GPU while it borrows infer-b's idle time (its budget: 30 %)."""


def step_lending(s: Story) -> None:
    s.kubectl("exec", "-n", TEAM, "infer-b", "--", "sh", "-c", f": > {PAUSE}")
    # the core controller lends once it has seen infer-b idle; how soon depends on the
    # machine's load (2 s sufficed on a quiet machine, not always under the full suite):
    # wait, in 1 s windows, until the lending shows (at most 10 s), then measure 3 s
    deadline = time.monotonic() + 10
    while _shares(s, 1)[1] < LENT_BUSY and time.monotonic() < deadline:
        pass
    _, busiest = _shares(s, 3)
    s.say(f"8. infer-b goes idle: infer-a borrows its time and keeps the GPU {busiest:.0%} "
          f"busy (its budget is 30 %)")
    s.kubectl("exec", "-n", TEAM, "infer-b", "--", "sh", "-c", f"rm {PAUSE}")
    time.sleep(1)
    shares, _ = _shares(s, 4)
    s.say(f"   infer-b resumes and takes its time back: {_split(shares)}")


def step_live_resize(s: Story) -> None:
    import subprocess
    import sys

    t0 = time.monotonic()
    for pod, cores in (("infer-b", 50), ("infer-a", 50)):  # shrink first: the quota holds
        r = subprocess.run([sys.executable, "-m", "tessera_operator.cli.main", "resize", pod,
                            "-n", TEAM, "--cores", str(cores), "--wait", "30",
                            "--kubeconfig", str(s.cluster.kubeconfig)],
                           capture_output=True, text=True, timeout=90, check=False)
        if r.returncode != 0:
            raise ControlPlaneError(f"tessera resize {pod} failed: {r.stderr.strip()}")
    applied = time.monotonic() - t0
    time.sleep(1)
    shares, _ = _shares(s, 6)
    s.say(f"9. `tessera resize` rebalances them to 50 / 50 while they run (both applied in "
          f"{applied:.1f}s, no restart): {_split(shares)}")


def step_final(s: Story) -> None:
    s.say("10. Everything tessera knows:")
    s.show("get", "tessera", "-A")


def run_demo(cluster: LocalCluster, say: Printer = _stdout, repo: Path = REPO_ROOT, *,
             stays: bool, started: float, stack: Any) -> None:
    """Tell the story on a started cluster with the demo's nodes; what it starts is
    registered on ``stack`` (a contextlib.ExitStack) for the caller to stop. When the
    cluster `stays` running, say how to use it and how to stop it."""
    assert cluster.run is not None
    s = Story(cluster, say, started, repo)
    step_cluster(s)
    step_crds_and_examples(s)
    step_tessera(s, cluster.run.logs / "tessera", stack)
    step_partitions(s)
    step_quota(s)
    step_workloads(s)
    step_achieved_shares(s)
    step_refused(s)
    step_lending(s)
    step_live_resize(s)
    step_final(s)
    if not stays:
        say("Stopping the cluster now (--exit); without --exit it keeps running until Ctrl-C.")
        return
    say("Use this cluster from another shell:")
    say(f"  export KUBECONFIG={cluster.kubeconfig}")
    say(f"  alias kubectl={cluster.kubectl_path}   # the built kubectl, same version as the server")
    say(f"  kubectl get pods,gq -n {TEAM}")
    say("Stop it with Ctrl-C here (everything it started is removed).")


def main_demo(cluster: LocalCluster, *, exit_after: bool, wait: Callable[[], None],
              started: float) -> None:
    import contextlib

    assert cluster.run is not None, "the cluster must be started"
    (cluster.run.logs / "tessera").mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        run_demo(cluster, stays=not exit_after, started=started, stack=stack)
        if not exit_after:
            wait()
