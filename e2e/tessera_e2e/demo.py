"""The demo: a local cluster with tessera's CRDs and the example resources applied, the
operator admitting pods under a quota, and three simulated GPU nodes whose tessera-node
daemons enact the example GPUPartitions with nvidia-smi.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from tessera_e2e.cluster import LocalCluster
from tessera_e2e.errors import ControlPlaneError
from tessera_e2e.operators import LocalOperators, show_quota_admission

if TYPE_CHECKING:  # the GPU nodes need the simulator (sim/ on the path), only the demo does
    from tessera_e2e.node_daemons import NodeDaemonProcess

REPO_ROOT = Path(__file__).resolve().parents[2]

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


def run_demo(
    cluster: LocalCluster,
    operators: LocalOperators,
    say: Printer = _stdout,
    repo: Path = REPO_ROOT,
    *,
    stays: bool,
    daemons: list[NodeDaemonProcess] | None = None,
) -> None:
    """Install CRDs and examples into a started cluster, start the operator, show a quota
    at work and GPU nodes enacting the partitions (their daemons are appended to
    ``daemons`` for the caller to stop); when the cluster `stays` running, say how to use
    it and how to stop it."""
    say(f"Control plane ready in {cluster.ready_seconds:.1f}s at {cluster.server}")
    crds = install_crds(cluster, repo)
    say(f"Installed {len(crds)} CRD file(s) from crds/: all Established")
    namespaces = example_namespaces(example_files(repo))
    if namespaces:
        say(f"Namespaces the examples use: {', '.join(namespaces)} (created if missing)")
    examples = apply_examples(cluster, repo)
    say(f"Applied {len(examples)} example(s): {', '.join(p.name for p in examples)}")
    say("")
    say("Starting the tessera operator (as its ServiceAccount, webhooks on loopback) ...")
    operators.setup().ensure_running()
    say("Operator is leader and serving the admission webhooks.")
    say("")
    show_quota_admission(cluster.kubectl, say)
    say("")
    say("$ kubectl get tessera -A")
    say(_checked(cluster, "get", "tessera", "-A").rstrip())
    say("")
    from tessera_e2e.demo_nodes import show_gpu_nodes

    assert cluster.run is not None
    show_gpu_nodes(cluster.kubectl, cluster.kubeconfig, cluster.run.logs / "nodes", say,
                   daemons if daemons is not None else [])
    if not stays:
        say("Stopping the cluster now (--exit); without --exit it keeps running until Ctrl-C.")
        return
    say("Use this cluster from another shell:")
    say(f"  export KUBECONFIG={cluster.kubeconfig}")
    say(f"  alias kubectl={cluster.kubectl_path}   # the built kubectl, same version as the server")
    say("  kubectl get gpupartitions,gpuquotas -A")
    say("Stop it with Ctrl-C here (everything it started is removed).")


def main_demo(cluster: LocalCluster, *, exit_after: bool, wait: Callable[[], None]) -> None:
    assert cluster.run is not None, "the cluster must be started"
    assert cluster.pki is not None
    operators = LocalOperators(cluster.kubectl, cluster.kubeconfig, cluster.run.logs,
                               names=("operator",),
                               webhook_client_ca=cluster.pki.webhook_client_ca)
    daemons: list[NodeDaemonProcess] = []
    try:
        run_demo(cluster, operators, stays=not exit_after, daemons=daemons)
        if not exit_after:
            wait()
    finally:
        for d in daemons:
            d.stop()
        operators.stop_all()
