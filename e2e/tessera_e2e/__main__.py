"""`python -m tessera_e2e build | cluster | images | demo` (the Makefile's controlplane, cluster,
images, demo)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from pathlib import Path
from types import FrameType

from tessera_e2e.chart import docs as chartdocs
from tessera_e2e.chart.tessera_images import APP_VERSION, ensure_tessera_images
from tessera_e2e.controlplane.build import (
    ensure_built,
    ensure_containerd,
    ensure_helm,
    ensure_kueue,
)
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import DEFAULT_NODES, SIM_BUILD, LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.demo import DEMO_GPUS, main_demo
from tessera_e2e.nodes.images import PAUSE, WORKLOAD, ensure_images
from tessera_e2e.paths import REPO


def _wait_for_interrupt() -> None:
    """Block until Ctrl-C, SIGTERM or SIGHUP (terminal closed); all arrive as KeyboardInterrupt,
    which stops the cluster cleanly on the way out."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, on_signal)
    threading.Event().wait()


def _cluster(args: argparse.Namespace) -> None:
    if args.nodes:
        ensure_containerd()
    with LocalCluster(ensure_built(), nodes=args.nodes) as cluster:
        print(f"Cluster ready in {cluster.ready_seconds:.1f}s at {cluster.server} with "
              f"{len(cluster.nodes)} nodes")
        for node in cluster.nodes:
            print(f"  {node.name} {node.ip}: a shell on it: "
                  f"{' '.join(node.nsenter('-m', '-n', '-u'))} bash")
        print("Use it from another shell:")
        print(f"  export KUBECONFIG={cluster.kubeconfig}")
        print(f"  alias kubectl={cluster.kubectl_path}")
        if cluster.nodes:
            print(f"  images (imagePullPolicy: Never): {PAUSE}, {WORKLOAD}")
        print("Stop it with Ctrl-C here (everything it started is removed).", flush=True)
        _wait_for_interrupt()


def _demo(args: argparse.Namespace) -> int:
    """Ctrl-C is how a person ends the demo: a clean teardown, status 0."""
    started = time.monotonic()
    ensure_containerd()
    try:
        with LocalCluster(ensure_built(), nodes=len(DEMO_GPUS), gpu_models=DEMO_GPUS,
                          report=_quiet) as cluster:
            main_demo(cluster, exit_after=args.exit, wait=_wait_for_interrupt,
                      started=started)
    except KeyboardInterrupt:
        print("stopped: everything the demo started is removed", flush=True)
    return 0


def _quiet(line: str) -> None:
    """The demo narrates its own steps; the cluster's progress lines stay out of the way."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tessera_e2e", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build the control plane binaries, containerd, "
                                "helm and Kueue into the cache")
    build.add_argument("--force", action="store_true", help="rebuild even if up to date")
    cluster = commands.add_parser("cluster", help="run a local cluster until Ctrl-C")
    cluster.add_argument("--nodes", type=int, default=DEFAULT_NODES,
                         help=f"real nodes (kubelet + containerd), default {DEFAULT_NODES}")
    commands.add_parser("images", help="build the nodes' OCI images and tessera's, print "
                        "their digests")
    commands.add_parser("chart-docs", help="regenerate the values table of the chart README")
    demo = commands.add_parser("demo", help="the story: two GPU nodes, partitions, a quota, "
                                 "budgeted pods; until Ctrl-C")
    demo.add_argument("--exit", action="store_true", help="stop after showing (non-interactive)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            ensure_built(force=args.force)
            ensure_containerd(force=args.force)
            ensure_helm(force=args.force)
            ensure_kueue(force=args.force)
        elif args.command == "cluster":
            _cluster(args)
        elif args.command == "images":
            for image in ensure_images(default_layout(), SIM_BUILD / "lib").values():
                print(f"{image.ref} {image.digest} {image.archive}")
            for ref, built in ensure_tessera_images(default_layout(), Path(sys.executable),
                                                    REPO / "hook" / "build", APP_VERSION).items():
                print(f"{ref} {built.image.digest} {built.image.archive} "
                      f"{built.size_bytes / 2**20:.0f} MiB")
        elif args.command == "chart-docs":
            print(chartdocs.write())
        else:
            return _demo(args)
    except ControlPlaneError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
