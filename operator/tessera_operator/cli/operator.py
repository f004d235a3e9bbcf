"""``tessera operator run``: the operator process (also the container entry point)."""

from __future__ import annotations

import argparse
import asyncio
import os
from typing import Any
from urllib.parse import urlparse

from tessera.api.names import ANNOTATION_GPU_POLICY, ANNOTATION_NODE_POLICY, SCHEDULER_NAME
from tessera_operator.cli.errors import CLIError
from tessera_operator.controller.settings import DEFAULTS as D
from tessera_operator.webhooks.serving import EXTERNAL, GENERATE


def _run(args: argparse.Namespace) -> int:
    from tessera.kube.logs import setup_logging
    from tessera_operator.controller.app import run
    from tessera_operator.controller.settings import Options
    from tessera_operator.webhooks.rotation import Policy

    if args.webhook_url is not None:
        u = urlparse(args.webhook_url)
        if u.scheme != "https" or not u.hostname:
            raise CLIError(f"--webhook-url must be https://HOST[:PORT], got {args.webhook_url!r}")
    if args.lease_duration <= 2 * args.lease_renew:
        raise CLIError("--lease-duration must be more than twice --lease-renew")
    if args.webhook_client_name and args.webhook_client_ca is None:
        raise CLIError("--webhook-client-name needs --webhook-client-ca")
    if args.webhook_client_ca is not None and not os.path.isfile(args.webhook_client_ca):
        raise CLIError(f"--webhook-client-ca {args.webhook_client_ca!r} is not a file")
    if args.recount_interval <= 0:
        raise CLIError("--recount-interval must be positive")
    policy = Policy(args.cert_lifetime, D.cert_renew_fraction, args.cert_step,
                    args.cert_check_interval)
    if args.webhook_certificate == GENERATE and policy.problems():
        raise CLIError("; ".join(policy.problems()))
    if args.cert_check_interval <= 0:
        raise CLIError("--cert-check-interval must be positive")
    if args.shutdown_drain < 0:
        raise CLIError("--shutdown-drain must be 0 or more")
    from tessera.placement.policy import PolicyError
    from tessera.placement.policy import parse as parse_policy
    try:
        parse_policy({ANNOTATION_NODE_POLICY: args.placement_node_policy,
                      ANNOTATION_GPU_POLICY: args.placement_gpu_policy})
    except PolicyError as exc:
        raise CLIError(f"--placement-*-policy: {exc}") from exc
    if args.placement_url is not None:
        u = urlparse(args.placement_url)
        if u.scheme != "https" or not u.hostname:
            raise CLIError(f"--placement-url must be https://HOST[:PORT], got "
                           f"{args.placement_url!r}")
    opts = Options(
        kubeconfig=args.kubeconfig, namespace=args.namespace, webhook_host=args.webhook_host,
        webhook_port=args.webhook_port, webhook_url=args.webhook_url,
        service_name=args.service_name, health_host=args.health_host,
        health_port=args.health_port, lease_duration_s=args.lease_duration,
        lease_renew_s=args.lease_renew, recount_interval_s=args.recount_interval,
        webhook_client_ca=args.webhook_client_ca,
        webhook_client_names=tuple(args.webhook_client_name or ()),
        webhook_config_interval_s=args.webhook_config_interval,
        webhook_configurations=args.webhook_configurations,
        stuck_after_s=args.stuck_after, webhook_certificate=args.webhook_certificate,
        cert_lifetime_s=args.cert_lifetime, cert_step_s=args.cert_step,
        cert_check_interval_s=args.cert_check_interval, shutdown_drain_s=args.shutdown_drain,
        growth_holder_image=args.growth_holder_image, placement_url=args.placement_url,
        placement_server_name=args.placement_server_name,
        placement_node_policy=args.placement_node_policy,
        placement_gpu_policy=args.placement_gpu_policy, scheduler_name=args.scheduler_name)
    if args.identity:
        opts.identity = args.identity
    setup_logging(quiet=("kopf", "aiohttp.access"))
    asyncio.run(run(opts))
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("operator", help="run the tessera operator")
    sub = p.add_subparsers(dest="operator_command", metavar="COMMAND")
    sub.required = True
    r = sub.add_parser("run", help="serve webhooks; reconcile while holding the leader Lease")
    r.add_argument("--kubeconfig", help="kubeconfig (default: in-cluster, then ~/.kube/config)")
    r.add_argument("--namespace", default=D.namespace,
                   help="namespace of the Lease and the certificate Secret")
    r.add_argument("--identity", help="leader-election identity (default host-pid)")
    r.add_argument("--webhook-host", default=D.webhook_host)
    r.add_argument("--webhook-port", type=int, default=D.webhook_port)
    r.add_argument("--webhook-url", help="https base URL the API server calls (local "
                   "clusters); default: Service client config")
    r.add_argument("--service-name", default=D.service_name)
    r.add_argument("--health-host", default=D.health_host)
    r.add_argument("--health-port", type=int, default=D.health_port,
                   help="/healthz and /metrics")
    r.add_argument("--lease-duration", type=int, default=D.lease_duration_s, help="seconds")
    r.add_argument("--lease-renew", type=float, default=D.lease_renew_s, help="seconds")
    r.add_argument("--recount-interval", type=float, default=D.recount_interval_s,
                   help="seconds")
    r.add_argument("--webhook-client-ca", default=D.webhook_client_ca,
                   help="CA file of the API server's webhook client certificate: admission "
                   "reviews without a certificate it signed are refused")
    r.add_argument("--webhook-client-name", action="append", metavar="CN",
                   help="accept only this common name among those certificates (repeatable)")
    r.add_argument("--webhook-configurations", choices=("apply", "ca-bundle"),
                   default=D.webhook_configurations,
                   help="apply: the leader applies the webhook configurations whole; "
                   "ca-bundle: they are installed by the Helm chart and the leader only "
                   "sets their caBundle")
    r.add_argument("--webhook-config-interval", type=float,
                   default=D.webhook_config_interval_s,
                   help="seconds between re-applies of the webhook configurations")
    r.add_argument("--webhook-certificate", choices=(GENERATE, EXTERNAL),
                   default=D.webhook_certificate,
                   help="generate: the operator makes the serving certificate and renews it "
                   "before it expires; external: another party (cert-manager) writes the "
                   "Secret and the webhooks' caBundle, the operator only reads the Secret")
    r.add_argument("--cert-lifetime", type=float, default=D.cert_lifetime_s,
                   help="seconds each serving certificate the operator makes is valid; "
                   f"renewed after {D.cert_renew_fraction:.2f} of it")
    r.add_argument("--cert-step", type=float, default=D.cert_step_s,
                   help="least seconds between the steps of a renewal")
    r.add_argument("--cert-check-interval", type=float, default=D.cert_check_interval_s,
                   help="seconds between reads of the serving Secret")
    r.add_argument("--stuck-after", type=float, default=D.stuck_after_s,
                   help="seconds a watch may fail before /healthz reports it")
    r.add_argument("--shutdown-drain", type=float, default=D.shutdown_drain_s,
                   help="seconds the replica goes on serving after SIGTERM, not ready and "
                   "closing each webhook connection after its answer, before it stops (a "
                   "second signal stops it at once)")
    r.add_argument("--growth-holder-image", default=D.growth_holder_image,
                   help="the image growth holders name (never pulled: they are never "
                   "scheduled; an image policy must admit it)")
    r.add_argument("--placement-url", help="https URL where this replica answers the "
                   "scheduler extender while it leads (published on the Lease; default "
                   "https://$POD_IP:<webhook port>, or 127.0.0.1 outside a pod)")
    r.add_argument("--placement-server-name", help="name the leader's certificate is "
                   "checked for when another replica forwards to it (default: the Service's "
                   "DNS name in a pod)")
    r.add_argument("--placement-node-policy", default=D.placement_node_policy,
                   help=f"binpack or spread over nodes (a pod's {ANNOTATION_NODE_POLICY} wins)")
    r.add_argument("--placement-gpu-policy", default=D.placement_gpu_policy,
                   help="binpack or spread over GPUs and MIG instances "
                   f"(a pod's {ANNOTATION_GPU_POLICY} wins)")
    r.add_argument("--scheduler-name", default=D.scheduler_name,
                   help="give GPU pods that name no scheduler this spec.schedulerName "
                   f"(the chart's {SCHEDULER_NAME}); empty: leave them to the default")
    r.set_defaults(handler=_run)


def main(argv: list[str] | None = None) -> int:
    """Run this group alone (``python -m tessera_operator.cli.operator run ...``)."""
    import sys

    parser = argparse.ArgumentParser(prog="tessera")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["operator", *(sys.argv[1:] if argv is None else argv)])
    try:
        rc: int = args.handler(args)
    except CLIError as exc:
        print(f"tessera: {exc}", file=sys.stderr)
        return 2
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
