"""The one error type the CLI turns into a one-line message and exit status 2."""

from __future__ import annotations


class CLIError(Exception):
    """Bad input or an impossible request: printed as one line to stderr, exit 2."""
