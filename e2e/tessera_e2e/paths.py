"""Where the repository's parts are, for the test bed's code (one place)."""

from __future__ import annotations

from pathlib import Path

E2E = Path(__file__).resolve().parents[1]
"""``e2e/``: the test bed's Go modules (control plane, containerd, helm), images, tests."""
REPO = E2E.parent
"""The repository's root."""
