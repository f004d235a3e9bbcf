"""Where built binaries, runs and kept logs live: $TESSERA_CACHE, default ~/.cache/tessera.

Outside the repository so that nothing built is ever committed and every checkout shares one
build. Go's own caches (GOMODCACHE, GOCACHE) keep their defaults, so other Go work shares them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tessera_e2e.controlplane.pins import Pins

BINARIES = (
    "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet",
    "kube-proxy",
)
"""What every release's control plane build has (the current one adds parse-quantity)."""


def cache_root() -> Path:
    configured = os.environ.get("TESSERA_CACHE")
    if configured:
        return Path(configured).expanduser().resolve()
    return Path.home() / ".cache" / "tessera"


@dataclass(frozen=True)
class Layout:
    """Paths under the cache root."""

    root: Path

    def bin_dir(self, pins: Pins) -> Path:
        return self.root / "controlplane" / pins.key / "bin"

    def stamp(self, pins: Pins) -> Path:
        return self.root / "controlplane" / pins.key / "stamp.json"

    def binary(self, pins: Pins, name: str) -> Path:
        return self.bin_dir(pins) / name

    @property
    def runs(self) -> Path:
        """One directory per running cluster: pid files, certificates, etcd data, logs."""
        return self.root / "runs"

    @property
    def images(self) -> Path:
        """OCI image tarballs for the nodes (see images.py)."""
        return self.root / "images"

    @property
    def kept_logs(self) -> Path:
        """Component logs of failed or killed runs."""
        return self.root / "logs"


def default_layout() -> Layout:
    return Layout(cache_root())
