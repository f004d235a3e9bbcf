"""Which Kubernetes, etcd and containerd versions are built: read from the wrapper modules'
go.mod files, one pair of wrapper modules per Kubernetes release the test bed runs.

go.mod is the single source of truth, so a version bump is one edit there (plus `go mod tidy`).
The test bed runs one release per process: the current one, or the oldest one tessera
supports when ``TESSERA_KUBERNETES=oldest`` (the subset of tests marked ``oldest_kubernetes``,
run by ``make test`` after the whole suite).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tessera_e2e.paths import E2E


@dataclass(frozen=True)
class Release:
    """One Kubernetes release line of the test bed: its two wrapper modules."""

    name: str
    controlplane: Path
    """Kubernetes and etcd (``go.mod`` requires both)."""
    containerd: Path
    """The containerd its nodes run."""


RELEASES = {
    "current": Release("current", E2E / "controlplane", E2E / "containerd"),
    "oldest": Release("oldest", E2E / "controlplane-oldest", E2E / "containerd-oldest"),
}
RELEASE_ENV = "TESSERA_KUBERNETES"


def selected_release(env: Mapping[str, str] = os.environ) -> Release:
    """The release ``TESSERA_KUBERNETES`` names (default: current)."""
    name = env.get(RELEASE_ENV) or "current"
    if name not in RELEASES:
        raise ValueError(f"{RELEASE_ENV}={name!r}: it names one of {', '.join(RELEASES)}")
    return RELEASES[name]


RELEASE = selected_release()
MODULE_DIR = RELEASE.controlplane
CONTAINERD_MODULE_DIR = RELEASE.containerd

KUBERNETES_MODULE = "k8s.io/kubernetes"
CONTROLPLANE_MODULE = "tessera.dev/e2e/controlplane"
"""The wrapper module's own path (its go.mod ``module`` line)."""
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
CONTAINERD_MODULES = ("github.com/containerd/containerd/v2", "github.com/containerd/containerd")
"""containerd 2.x's module path, then 1.x's."""


@dataclass(frozen=True)
class Pins:
    """The pinned versions, e.g. kubernetes='v1.37.2', etcd='v3.7.0'."""

    kubernetes: str
    etcd: str

    @property
    def kubernetes_minor(self) -> str:
        return self.kubernetes.lstrip("v").split(".")[1]

    @property
    def key(self) -> str:
        """Cache directory name for binaries of these versions."""
        return f"k8s-{self.kubernetes}_etcd-{self.etcd}"


def _requirement(go_mod: str, module: str) -> str | None:
    """The version go.mod requires of ``module`` (None: none)."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    return None if match is None else match.group(1)


def _required_version(go_mod: str, module: str) -> str:
    version = _requirement(go_mod, module)
    if version is None:
        raise ValueError(f"go.mod does not require {module}")
    return version


def parse_pins(go_mod: str) -> Pins:
    """Extract the versions from go.mod text; the staging replaces must match Kubernetes."""
    kubernetes = _required_version(go_mod, KUBERNETES_MODULE)
    staging = "v0." + kubernetes.removeprefix("v1.")
    for module, version in re.findall(r"^\s*(k8s\.io/\S+) => \S+ (v\S+)", go_mod, re.MULTILINE):
        if version != staging:
            raise ValueError(
                f"go.mod replaces {module} with {version}, but Kubernetes {kubernetes} "
                f"needs {staging}"
            )
    return Pins(kubernetes=kubernetes, etcd=_required_version(go_mod, ETCD_MODULE))


def load_pins(module_dir: Path = MODULE_DIR) -> Pins:
    return parse_pins((module_dir / "go.mod").read_text())


def containerd_module(module_dir: Path = CONTAINERD_MODULE_DIR) -> str:
    """The containerd module its wrapper requires: ``…/containerd/v2`` for 2.x."""
    go_mod = (module_dir / "go.mod").read_text()
    for module in CONTAINERD_MODULES:
        if _requirement(go_mod, module) is not None:
            return module
    raise ValueError(f"{module_dir / 'go.mod'} requires no containerd")


def load_containerd_version(module_dir: Path = CONTAINERD_MODULE_DIR) -> str:
    """The containerd version its wrapper module requires, e.g. 'v2.3.7'."""
    return _required_version((module_dir / "go.mod").read_text(),
                             containerd_module(module_dir))


def containerd_major(version: str) -> int:
    """'v2.3.7' -> 2."""
    return int(version.lstrip("v").split(".")[0])


def load_go_directive(module_dir: Path) -> tuple[int, int]:
    """The oldest Go a wrapper module builds with: its go.mod's `go 1.N[.P]` line."""
    match = re.search(r"^go (\d+)\.(\d+)", (module_dir / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{module_dir / 'go.mod'} has no go directive")
    return int(match.group(1)), int(match.group(2))
