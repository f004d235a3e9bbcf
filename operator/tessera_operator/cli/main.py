"""Entry point of the ``tessera`` command.

Each command group lives in its own module exposing ``register(subparsers)``; a handler
returns an exit status or raises :class:`CLIError`, which becomes one stderr line and
exit status 2.  Bad input never shows a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from tessera_operator.cli.errors import CLIError

# Command-group modules, each with ``register(subparsers) -> None``.
_GROUPS = ("tessera_operator.cli.mig", "tessera_operator.cli.crds",
           "tessera_operator.cli.operator", "tessera_operator.cli.resize",
           "tessera_operator.cli.uninstall")

Handler = Callable[[argparse.Namespace], int]


class _Parser(argparse.ArgumentParser):
    """argparse exits 2 on usage errors already; keep its message to one line."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(f"{self.prog}: {message} (see '{self.prog} --help')")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tessera", description="Share NVIDIA GPUs safely across teams.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in _GROUPS:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        handler: Handler = args.handler
        return handler(args)
    except CLIError as exc:
        message = str(exc)
        print(message if message.startswith("tessera") else f"tessera: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
