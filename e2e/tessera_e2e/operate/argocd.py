"""Argo CD's Lua, to run tessera's health check as Argo CD runs it.

``argocd-health`` (``e2e/argocd-health/``) is a small Go program on gopher-lua at the version
Argo CD's own go.mod requires (``ARGOCD_VERSION`` below; gopher-json too, which Argo CD uses
to read the returned table).  It is built once from the Go module proxy into the cache, in a
directory and with a stamp of its own (``argocd-health/gopher-lua-<version>/``), by the same
machinery as the control plane (``build.ensure_product``); nothing of the control plane's
pins or build inputs is involved.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tessera_e2e.controlplane.build import (
    Product,
    Reporter,
    ensure_product,
    sources_digest,
)
from tessera_e2e.controlplane.cache import Layout, default_layout
from tessera_e2e.controlplane.pins import _required_version
from tessera_e2e.paths import REPO

MODULE_DIR = REPO / "e2e" / "argocd-health"
MODULE = "tessera/e2e/argocd-health"
BINARY = "argocd-health"
GOPHER_LUA = "github.com/yuin/gopher-lua"
ARGOCD_VERSION = "v3.6.1"
"""The Argo CD release whose go.mod the program's go.mod follows (gopher-lua v1.1.2 and
gopher-json 97fed8db8427 there)."""
HEALTH_SCRIPT = REPO / "deploy" / "argocd" / "health.lua"
VALUES = REPO / "deploy" / "argocd" / "argocd-values.yaml"


def gopher_lua_version(module_dir: Path = MODULE_DIR) -> str:
    return _required_version((module_dir / "go.mod").read_text(), GOPHER_LUA)


def product(layout: Layout, module_dir: Path = MODULE_DIR) -> Product:
    version = gopher_lua_version(module_dir)
    return Product(
        title=f"argocd-health (gopher-lua {version}, as Argo CD {ARGOCD_VERSION})",
        module_dir=module_dir,
        directory=layout.root / "argocd-health" / f"gopher-lua-{version}",
        packages={MODULE: BINARY},
        ldflags="-s -w",
        inputs={"gopher-lua": version,
                "go_sum_sha256": hashlib.sha256((module_dir / "go.sum").read_bytes()).hexdigest(),
                "sources_sha256": sources_digest(module_dir)},
        versions={BINARY: (("--version",), f"{GOPHER_LUA} {version}")},
        cold_minutes="1",
    )


def _report(line: str) -> None:
    print(f"[argocd-health] {line}", file=sys.stderr, flush=True)


def ensure_argocd_health(layout: Layout | None = None, *, env: Mapping[str, str] | None = None,
                         report: Reporter = _report) -> Path:
    """The built program (built first when its stamp does not match)."""
    return ensure_product(product(layout or default_layout()), env=env, report=report) / BINARY


def evaluate(binary: Path, script: Path, objects: Sequence[Mapping[str, Any]]
             ) -> list[dict[str, str]]:
    """Argo CD's verdict ({"status", "message"} or {"error"}) for each object."""
    out = subprocess.run([str(binary), str(script)], input=json.dumps(list(objects)),
                         capture_output=True, text=True, timeout=60, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"{binary.name} failed ({out.returncode}): {out.stderr.strip()}")
    results: list[dict[str, str]] = json.loads(out.stdout)
    return results
