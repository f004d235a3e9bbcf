"""Demo step: three simulated GPU nodes, each with its own simulator state and its own
``tessera-node``, labelled so that the example GPUPartitions select them; the partitions
turn Ready as the daemons enact their layouts with nvidia-smi."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tessera_e2e.node_daemons import NodeDaemonProcess, SimNode, create_node, daemon_kubeconfig
from tessera_e2e.operators import Kubectl, wait_until

DEMO_NODES: dict[str, tuple[list[str], dict[str, str]]] = {
    "gpu-h100-0": (["H100-80GB"] * 8, {"node-role.example.com/inference": "true"}),
    "gpu-a100-0": (["A100-40GB"] * 4, {"node-pool.example.com/name": "experiments"}),
    "gpu-a30-0": (["A30-24GB"] * 2, {}),
}
"""Node name -> (its GPUs, labels the examples select on)."""
SHOW_LGI = "gpu-a100-0"


def start_gpu_nodes(kubectl: Kubectl, admin_kubeconfig: Path, workdir: Path,
                    daemons: list[NodeDaemonProcess]) -> None:
    """Create the Nodes and start one daemon per node (added to ``daemons`` as each starts:
    the caller stops them)."""
    for name, (gpus, labels) in DEMO_NODES.items():
        create_node(kubectl, name, labels)
        kc = daemon_kubeconfig(kubectl, admin_kubeconfig, workdir, name)
        d = NodeDaemonProcess(name, SimNode(workdir / "sim", name, gpus), kc, workdir,
                              ["--resync-interval", "10"])
        daemons.append(d)
        d.start_async()


def partitions_ready(kubectl: Kubectl) -> tuple[bool, list[str]]:
    """(every partition that selects a node has all of them Ready, their names)."""
    out = kubectl("get", "gpupartitions", "-o", "json")
    if out.returncode != 0:
        return False, []
    items = json.loads(out.stdout)["items"]
    active = [p for p in items if (p.get("status") or {}).get("selectedNodeCount")]
    names = sorted(p["metadata"]["name"] for p in active)
    done = len(active) == len(DEMO_NODES) and all(
        p["status"].get("readyNodeCount") == p["status"]["selectedNodeCount"] for p in active)
    return done, names


def show_gpu_nodes(kubectl: Kubectl, admin_kubeconfig: Path, workdir: Path,
                   say: Callable[[str], None], daemons: list[NodeDaemonProcess]) -> None:
    say("Starting three simulated GPU nodes, each with its own GPUs and tessera-node:")
    for name, (gpus, _) in DEMO_NODES.items():
        say(f"  {name}: {len(gpus)}x {gpus[0]}")
    start_gpu_nodes(kubectl, admin_kubeconfig, workdir, daemons)
    say("")
    say("$ kubectl get gpupartitions   # while the daemons apply the layouts")
    wait_until("a partition selecting nodes", lambda: partitions_ready(kubectl)[1], 180, 1)
    say(kubectl("get", "gpupartitions").stdout.rstrip())
    wait_until("every selected node Ready", lambda: partitions_ready(kubectl)[0], 300, 1)
    say("")
    say("$ kubectl get gpupartitions   # every selected node Ready")
    say(kubectl("get", "gpupartitions").stdout.rstrip())
    show = next(d for d in daemons if d.node == SHOW_LGI)
    say("")
    say(f"$ nvidia-smi mig -lgi   # on {SHOW_LGI}, made by its tessera-node")
    say(show.sim.smi("mig", "-lgi").stdout.rstrip())
