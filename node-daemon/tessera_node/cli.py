"""``tessera-node run``: the node daemon's entry point (also the DaemonSet's command).

Each flag falls back to an environment variable (``settings.ENV``), then to the default in
:mod:`tessera_node.settings`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from tessera_node.settings import DEFAULTS, ENV, POLICIES, VISIBILITIES, Options

_HELP = {
    "node_name": "this node's name (the daemon reads and writes this Node only)",
    "kubeconfig": "kubeconfig (default: in-cluster, then ~/.kube/config)",
    "driver_root": "where the NVIDIA driver's files are (libnvidia-ml.so.1 below it)",
    "nvidia_smi": "nvidia-smi to run (default: <driver root>/usr/bin/nvidia-smi)",
    "state_dir": "host directory the daemon owns",
    "device_plugin_dir": "the kubelet's device-plugin directory (other plugins' sockets)",
    "metrics_host": "address of /metrics, /healthz, /readyz",
    "metrics_port": "port of /metrics, /healthz, /readyz",
    "poll_interval_s": "seconds between NVML reads",
    "resync_interval_s": "seconds between full reconcile passes when nothing happens",
    "stuck_after_s": "seconds a watch or NVML may fail before /healthz reports it",
    "retry_interval_s": "seconds before a failed MIG change is tried again",
    "allow_gpu_reset": "true/false: may reset an idle GPU to finish a MIG mode change",
    "on_demand_idle_s": "MIG on demand: seconds an instance no pod or claim holds and "
                        "nothing asks stays before it is destroyed",
    "audit_interval_s": "seconds between audits of GPU processes against budgets",
    "core_interval_s": "seconds between core-controller periods (fair share of SM time)",
    "audit_slack_mib": "MiB a container may hold beyond its budget before it is over budget",
    "device_plugin": "true/false: serve the kubelet device plugin",
    "shares_per_unit": "vgpu shares per GPU or shared MIG instance",
    "share_policy": "pack or spread: which shares GetPreferredAllocation prefers",
    "device_visibility": "cdi, volume-mounts or sim: how Allocate makes GPUs visible",
    "sim_node": "the simulated node's description (sim visibility)",
    "libtessera": "the libtessera.so to install for containers",
    "pod_resources_socket": "the kubelet's PodResources socket",
    "budget_wait_s": "seconds libtessera waits for a pending budget file",
    "confirm_interval_s": "seconds between PodResources polls while an allocation waits",
    # DRA
    "dra": "true/false: offer this node's GPUs through DRA: publish its ResourceSlices and "
           "serve the DRA kubelet plugin (not with --device-plugin)",
    "kubelet_root": "the kubelet's --root-dir (plugins_registry/, plugins/)",
    "cdi_dir": "where the DRA plugin writes CDI specs",
}


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"not true or false: {text!r}")


def _flag(name: str) -> str:
    return "--" + name.removesuffix("_s").replace("_", "-")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tessera-node",
                                     description="tessera's node daemon (one per GPU node)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    run = sub.add_parser("run", help="run the daemon on this node")
    for f in fields(Options):
        default: Any = getattr(DEFAULTS, f.name)
        env = ENV[f.name]
        kind: Any = type(default) if default is not None else str
        if kind is bool:
            kind = _bool
        from_env = os.environ.get(env)
        run.add_argument(_flag(f.name), dest=f.name, type=kind,
                         default=kind(from_env) if from_env else default,
                         help=f"{_HELP[f.name]} (env {env}; default {default!r})")
    return parser


def options(args: argparse.Namespace) -> Options:
    opts = Options(**{f.name: getattr(args, f.name) for f in fields(Options)})
    if not opts.node_name:
        raise ValueError(f"--node-name (or {ENV['node_name']}) is required")
    if min(opts.poll_interval_s, opts.resync_interval_s, opts.retry_interval_s,
           opts.audit_interval_s) <= 0:
        raise ValueError("--poll-interval, --resync-interval, --retry-interval and "
                         "--audit-interval must be positive")
    if opts.on_demand_idle_s < 0:
        raise ValueError("--on-demand-idle must not be negative")
    if not 0.01 <= opts.core_interval_s <= 10:
        raise ValueError("--core-interval must be 0.01 to 10 seconds")
    if opts.audit_slack_mib < 0:
        raise ValueError("--audit-slack-mib must not be negative")
    if opts.device_visibility not in VISIBILITIES:
        raise ValueError(f"--device-visibility must be one of {', '.join(VISIBILITIES)}")
    if opts.share_policy not in POLICIES:
        raise ValueError(f"--share-policy must be one of {', '.join(POLICIES)}")
    if opts.device_visibility == "sim" and not opts.sim_node:
        raise ValueError(f"--device-visibility sim needs --sim-node (or {ENV['sim_node']})")
    if opts.shares_per_unit < 1:
        raise ValueError("--shares-per-unit must be at least 1")
    if not 0 <= opts.budget_wait_s <= 120 or opts.confirm_interval_s <= 0:
        raise ValueError("--budget-wait must be 0 to 120 seconds and --confirm-interval "
                         "positive")
    # DRA
    if opts.dra and opts.device_plugin:
        raise ValueError("--dra and --device-plugin cannot both be on: both would hand out "
                         "the same GPUs (run one per node pool)")
    return opts


def main(argv: Sequence[str] | None = None) -> int:
    from tessera.kube.logs import setup_logging

    try:
        args = build_parser().parse_args(argv)
        opts = options(args)
    except ValueError as exc:
        print(f"tessera-node: {exc}", file=sys.stderr)
        return 2
    from tessera_node.app import run

    setup_logging(quiet=("aiohttp.access",))
    try:
        asyncio.run(run(opts))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
