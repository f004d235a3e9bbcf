"""The demo's file handling, without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.demo import example_namespaces, install_crds


def test_empty_crds_directory_fails_rather_than_skips(tmp_path: Path) -> None:
    (tmp_path / "crds").mkdir()
    idle = LocalCluster(tmp_path)  # never started: no kubectl call may happen
    with pytest.raises(ControlPlaneError, match=r"no CRDs in .*crds: run `make crds`"):
        install_crds(idle, tmp_path)


def test_namespaces_used_but_not_created_by_the_examples(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "kind: GPUQuota\nmetadata: {name: q, namespace: team-a}\n---\n"
        "kind: GPUQuota\nmetadata: {name: r, namespace: team-b}\n"
    )
    (tmp_path / "b.yaml").write_text("kind: Namespace\nmetadata: {name: team-b}\n---\n")
    (tmp_path / "c.yaml").write_text("kind: GPUPartition\nmetadata: {name: p}\n")
    files = sorted(tmp_path.glob("*.yaml"))
    assert example_namespaces(files) == ["team-a"]
