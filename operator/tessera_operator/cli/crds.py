"""``tessera crds [--out DIR]``: the CRDs generated from the API types.

Without ``--out`` the YAML goes to stdout (``tessera crds | kubectl apply -f -``); with it,
one file per kind, as checked in under ``crds/``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from tessera.api import crd
from tessera_operator.cli.errors import CLIError


def _run(args: argparse.Namespace) -> int:
    if args.out is None:
        sys.stdout.write("---\n".join(crd.rendered().values()))
        return 0
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise CLIError(f"--out {out}: not a directory")
    try:
        for path in crd.write(out):
            print(path)
    except OSError as exc:
        raise CLIError(f"--out {out}: {exc.strerror or exc}") from None
    return 0


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "crds",
        help="print or write the CustomResourceDefinitions",
        description="Generate the GPUPartition and GPUQuota CRDs from the API types.",
    )
    parser.add_argument("--out", metavar="DIR", help="write one YAML file per kind into DIR")
    parser.set_defaults(handler=_run)
