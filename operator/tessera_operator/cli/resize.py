"""``tessera resize``: ask for a running pod's new GPU budget and wait for the outcome.

    tessera resize POD [-n NS] [-c CONTAINER] [--memory 12Gi] [--cores 40] [--wait 30]

Writes ``tessera.dev/budget-request`` (the totals for the container, as its limits count
them) and waits until ``tessera.dev/budget-resize`` answers it: Applied (exit 0), Refused
(the reason on stderr, exit 1), or still pending when ``--wait`` runs out (exit 3).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from typing import Any

from tessera.api.names import ANNOTATION_BUDGET_REQUEST, ANNOTATION_BUDGET_RESIZE
from tessera.api.resize import ResizeStatus, digest
from tessera.kube.client import ApiError, Kube, load_credentials, path
from tessera_operator.cli.errors import CLIError
from tessera_operator.quota.resize import REQUEST_ID, ResizeError, parse_request


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser("resize", help="change a running pod's GPU memory/cores budget")
    p.add_argument("pod")
    p.add_argument("-n", "--namespace", default="default")
    p.add_argument("-c", "--container", default=None,
                   help="the container (default: the pod's only container)")
    p.add_argument("--memory", default=None, help="new GPU memory total, e.g. 12Gi")
    p.add_argument("--cores", type=int, default=None, help="new cores total (percent of a GPU)")
    p.add_argument("--wait", type=float, default=30.0, metavar="SECONDS",
                   help="how long to wait for the outcome (0: do not wait)")
    p.add_argument("--kubeconfig", default=None)
    p.set_defaults(handler=_resize)


def request_text(container: str, memory: str | None, cores: int | None) -> str:
    """The annotation value; CLIError when there is nothing to change or it is malformed."""
    want: dict[str, Any] = {}
    if memory is not None:
        want["memory"] = memory
    if cores is not None:
        want["cores"] = cores
    if not want:
        raise CLIError("tessera resize: give --memory and/or --cores")
    # a fresh @id: the same sizes may be asked for again after a refusal
    text = json.dumps({container: want, REQUEST_ID: f"{time.time():.6f}"}, sort_keys=True,
                      separators=(",", ":"))
    try:
        parse_request(text)
    except ResizeError as exc:
        raise CLIError(f"tessera resize: {exc}") from None
    return text


def _resize(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    request_text(args.container or "container", args.memory, args.cores)  # bad input: before I/O
    try:
        creds = load_credentials(args.kubeconfig)
    except Exception as exc:  # the kubernetes package raises its own ConfigException
        raise CLIError(f"tessera resize: no cluster credentials: {exc}") from None
    kube = Kube(creds, user_agent="tessera-cli")
    url = path("", "v1", "pods", args.namespace, args.pod)
    try:
        pod = await kube.get(url)
        container = args.container
        if container is None:
            names = [c["name"] for c in pod["spec"]["containers"]]
            if len(names) != 1:
                raise CLIError(f"tessera resize: pod {args.pod} has containers "
                               f"{', '.join(names)}: name one with -c")
            container = names[0]
        text = request_text(container, args.memory, args.cores)
        await kube.merge_patch(url, {"metadata": {"annotations": {
            ANNOTATION_BUDGET_REQUEST: text}}})
        tag = digest(text)
        deadline = time.monotonic() + args.wait
        status: ResizeStatus | None = None
        while True:
            ann = (await kube.get(url))["metadata"].get("annotations") or {}
            status = ResizeStatus.parse(ann.get(ANNOTATION_BUDGET_RESIZE))
            if status is not None and status.request == tag and status.state != "Approved":
                break
            if time.monotonic() >= deadline:
                state = status.state if status and status.request == tag else "not answered"
                print(f"pod/{args.pod}: resize {state} yet", file=sys.stderr)
                return 3
            await asyncio.sleep(0.2)
        if status.state == "Refused":
            print(f"pod/{args.pod}: resize refused: {status.reason}", file=sys.stderr)
            return 1
        print(f"pod/{args.pod}: resize applied")
        return 0
    except ApiError as exc:
        raise CLIError(f"tessera resize: {exc}") from None
    finally:
        await kube.close()
