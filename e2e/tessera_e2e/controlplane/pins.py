"""Which Kubernetes and etcd versions are built: read from the wrapper module's go.mod.

go.mod is the single source of truth, so a version bump is one edit there (plus `go mod tidy`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tessera_e2e.paths import E2E

MODULE_DIR = E2E / "controlplane"
CONTAINERD_MODULE_DIR = E2E / "containerd"

KUBERNETES_MODULE = "k8s.io/kubernetes"
CONTROLPLANE_MODULE = "tessera.dev/e2e/controlplane"
"""The wrapper module's own path (its go.mod ``module`` line)."""
ETCD_MODULE = "go.etcd.io/etcd/server/v3"
CONTAINERD_MODULE = "github.com/containerd/containerd"


@dataclass(frozen=True)
class Pins:
    """The pinned versions, e.g. kubernetes='v1.34.4', etcd='v3.6.4'."""

    kubernetes: str
    etcd: str

    @property
    def kubernetes_minor(self) -> str:
        return self.kubernetes.lstrip("v").split(".")[1]

    @property
    def key(self) -> str:
        """Cache directory name for binaries of these versions."""
        return f"k8s-{self.kubernetes}_etcd-{self.etcd}"


def _required_version(go_mod: str, module: str) -> str:
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", go_mod, re.MULTILINE)
    if match is None:
        raise ValueError(f"go.mod does not require {module}")
    return match.group(1)


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


def load_containerd_version(module_dir: Path = CONTAINERD_MODULE_DIR) -> str:
    """The containerd version its wrapper module requires, e.g. 'v1.7.35'."""
    return _required_version((module_dir / "go.mod").read_text(), CONTAINERD_MODULE)


def load_go_directive(module_dir: Path) -> tuple[int, int]:
    """The oldest Go a wrapper module builds with: its go.mod's `go 1.N[.P]` line."""
    match = re.search(r"^go (\d+)\.(\d+)", (module_dir / "go.mod").read_text(), re.MULTILINE)
    if match is None:
        raise ValueError(f"{module_dir / 'go.mod'} has no go directive")
    return int(match.group(1)), int(match.group(2))
