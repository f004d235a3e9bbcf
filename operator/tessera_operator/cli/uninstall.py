"""``tessera uninstall``: the Helm chart's pre-delete hook (see tessera_operator.uninstall.run)."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from tessera_operator.controller.settings import DEFAULTS as D


def _run(args: argparse.Namespace) -> int:
    from tessera.kube.client import Kube, load_credentials
    from tessera_operator.uninstall.run import Targets, uninstall

    async def go() -> dict[str, int]:
        kube = Kube(load_credentials(args.kubeconfig), user_agent="tessera-uninstall")
        try:
            return await uninstall(kube, Targets(
                namespace=args.namespace, deployments=tuple(args.deployment),
                daemonsets=tuple(args.daemonset), leases=tuple(args.lease or (D.lease_name,)),
                secrets=tuple(args.secret or (D.secret_name,)),
                resource_slices=args.dra_resource_slices,
                certificates=tuple(args.cert_manager_certificate or ())),
                timeout_s=args.timeout)
        finally:
            await kube.close()

    print(json.dumps({"msg": "uninstalled", **asyncio.run(go())}), flush=True)
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "uninstall", help="remove what tessera created at run time (Helm pre-delete hook)",
        description="Delete the webhook configurations, stop the operator and the node "
        "daemons (and the scheduler), then delete tessera's ResourceSlices, the leader Leases, "
        "the serving Secret "
        "and every tessera label and annotation on Nodes. GPUs are left as they are.")
    p.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    p.add_argument("--namespace", default=D.namespace, help="the operator's namespace")
    p.add_argument("--deployment", required=True, action="append", metavar="NAME",
                   help="a Deployment to stop (repeatable: the operator's, and "
                        "tessera-scheduler with placement on)")
    p.add_argument("--lease", action="append", metavar="NAME",
                   help=f"a leader Lease to delete once they are stopped (repeatable; default "
                        f"{D.lease_name})")
    p.add_argument("--daemonset", required=True, action="append", metavar="NAME",
                   help="a node daemon DaemonSet's name (repeatable: tessera-node, and "
                        "tessera-node-dra with DRA pools)")
    p.add_argument("--dra-resource-slices", action="store_true",
                   help="also delete the ResourceSlices of tessera's DRA driver (installs "
                        "with DRA pools), once the daemons are gone")
    p.add_argument("--secret", action="append", metavar="NAME",
                   help=f"a Secret to delete (repeatable; default {D.secret_name})")
    p.add_argument("--cert-manager-certificate", action="append", metavar="NAME",
                   help="a cert-manager Certificate to delete before the Secrets (repeatable)")
    p.add_argument("--timeout", type=float, default=120.0,
                   help="seconds to wait for their pods to be gone")
    p.set_defaults(handler=_run)
