"""Pod creates in a loop while something changes under the webhooks (a certificate renewal,
a rollout of the operator): each a server-side dry run, so the API server calls every
webhook but stores nothing. A failed create is what a user would have seen."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tessera_e2e.operator.replicas import Kubectl


class DryRunCreates:
    """``with DryRunCreates(kubectl, manifest) as creates: ...``; then ``creates.ok`` and
    ``creates.failed`` (one line per failed create: the time and kubectl's error).
    ``manifest(i)`` is the i-th create's object (JSON or YAML)."""

    def __init__(self, kubectl: Kubectl, manifest: Callable[[int], str],
                 interval_s: float = 0.2) -> None:
        self.kubectl = kubectl
        self.manifest = manifest
        self.interval_s = interval_s
        self.ok = 0
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="dry-run-creates")

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            out = self.kubectl("create", "--dry-run=server", "-o", "name", "-f", "-",
                               input=self.manifest(i))
            if out.returncode == 0:
                self.ok += 1
            else:
                self.failed.append(f"{time.strftime('%X')} {out.stderr.strip()[:300]}")
            self._stop.wait(self.interval_s)

    def __enter__(self) -> DryRunCreates:
        self._thread.start()
        return self

    def __exit__(self, *_: Any) -> None:
        self._stop.set()
        self._thread.join(90)
