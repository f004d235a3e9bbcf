"""tessera's generated CRDs and examples against a real API server.

These read the real crds/ and examples/ files: an empty crds/ fails (never skips), because a
green run must mean the shipped manifests were checked.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.demo import REPO_ROOT, apply_examples, crd_files, example_files, install_crds

pytestmark = pytest.mark.integration

BAD_EXAMPLES = REPO_ROOT / "examples" / "bad"


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if isinstance(doc, dict)]


def _crds() -> list[dict[str, Any]]:
    return [doc for path in crd_files() for doc in _documents(path)
            if doc.get("kind") == "CustomResourceDefinition"]


def _example_objects(kind: str) -> list[dict[str, Any]]:
    return [doc for path in example_files() for doc in _documents(path) if doc["kind"] == kind]


@pytest.fixture(scope="module")
def installed(cluster: LocalCluster) -> Iterator[LocalCluster]:
    """CRDs installed and the examples applied, once for this module."""
    try:
        install_crds(cluster)
        apply_examples(cluster)
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)
    yield cluster


def test_crds_exist_and_become_established(installed: LocalCluster) -> None:
    crds = _crds()
    assert {crd["spec"]["names"]["kind"] for crd in crds} >= {"GPUPartition", "GPUQuota"}
    for crd in crds:
        name = crd["metadata"]["name"]
        established = installed.kubectl(
            "get", "crd", name, "-o",
            'jsonpath={.status.conditions[?(@.type=="Established")].status}',
        )
        assert established.stdout == "True", f"{name}: {established.stderr}"


def test_every_example_is_accepted(installed: LocalCluster) -> None:
    files = example_files()
    assert files, "examples/*.yaml is empty"
    for path in files:
        for doc in _documents(path):
            ns = doc["metadata"].get("namespace", "default")
            scope = [] if doc["kind"] in ("GPUPartition", "Namespace") else ["-n", ns]
            got = installed.kubectl("get", doc["kind"].lower(), doc["metadata"]["name"], *scope)
            assert got.returncode == 0, f"{path.name}: {got.stderr}"


def _bad_examples() -> list[Path]:
    return sorted(BAD_EXAMPLES.glob("*.yaml"))


def _expected_field(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# field: "), f"{path.name}: first line must be '# field: <path>'"
    return first.removeprefix("# field: ").strip()


def test_every_bad_example_is_rejected_naming_its_field(installed: LocalCluster) -> None:
    bad = _bad_examples()
    assert bad, "examples/bad/*.yaml is empty"
    failures = []
    for path in bad:
        field = _expected_field(path)
        result = installed.kubectl("apply", "-f", str(path))
        if result.returncode == 0:
            installed.kubectl("delete", "-f", str(path), "--ignore-not-found", "--wait=false")
            failures.append(f"{path.name}: accepted, expected a rejection naming {field}")
        elif "Error from server" not in result.stderr and "is invalid" not in result.stderr:
            failures.append(f"{path.name}: not rejected by the API server: {result.stderr}")
        elif field not in result.stderr:
            failures.append(f"{path.name}: message does not name {field}: {result.stderr}")
    assert not failures, "\n".join(failures)


def _printer_columns(kind: str) -> list[str]:
    crd = next(c for c in _crds() if c["spec"]["names"]["kind"] == kind)
    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    return [column["name"].upper() for column in version.get("additionalPrinterColumns", [])]


def _header(output: str) -> str:
    return output.splitlines()[0] if output else ""


@pytest.mark.parametrize(("argv", "kind"), [
    (["get", "gpupartitions"], "GPUPartition"),
    (["get", "gq", "-A"], "GPUQuota"),
])
def test_get_prints_the_printer_columns(
    installed: LocalCluster, argv: list[str], kind: str
) -> None:
    assert _example_objects(kind), f"no {kind} in examples/"
    result = installed.kubectl(*argv)
    assert result.returncode == 0, result.stderr
    columns = _printer_columns(kind)
    assert columns, f"{kind} has no additionalPrinterColumns"
    header = _header(result.stdout)
    for column in ["NAME", *columns]:
        assert column in header, f"{' '.join(argv)}: no {column} column in {header!r}"


def test_get_tessera_lists_both_kinds_with_their_columns(installed: LocalCluster) -> None:
    here = installed.kubectl("get", "tessera")  # cluster-scoped + the current namespace
    assert here.returncode == 0, here.stderr
    assert all(c in _header(here.stdout) for c in _printer_columns("GPUPartition"))
    result = installed.kubectl("get", "tessera", "-A")
    assert result.returncode == 0, result.stderr
    assert "gpupartition.tessera.dev/" in result.stdout
    assert "gpuquota.tessera.dev/" in result.stdout
    headers = [line for line in result.stdout.splitlines() if line.lstrip().startswith(
        ("NAME", "NAMESPACE"))]
    for kind in ("GPUPartition", "GPUQuota"):
        columns = _printer_columns(kind)
        assert any(all(c in h for c in columns) for h in headers), f"{kind} columns missing"


@pytest.mark.parametrize("kind", ["GPUPartition", "GPUQuota"])
def test_status_changes_only_through_the_status_subresource(
    installed: LocalCluster, kind: str
) -> None:
    """Judged on each PATCH's own response (the object as stored by that write), so an
    operator reconciling the same object in a shared cluster cannot race the assertions."""
    obj = _example_objects(kind)[0]
    target = [kind.lower(), obj["metadata"]["name"]]
    if kind == "GPUQuota":
        target += ["-n", obj["metadata"].get("namespace", "default")]
    patch = ["--type=merge", "-p", json.dumps({"status": {"observedGeneration": 4242}})]
    stored = ["-o", "jsonpath={.metadata.name}/{.status.observedGeneration}"]
    name = obj["metadata"]["name"]

    ignored = installed.kubectl("patch", *target, *patch, *stored)
    assert ignored.returncode == 0, ignored.stderr
    assert ignored.stdout.startswith(f"{name}/") and ignored.stdout != f"{name}/4242"

    applied = installed.kubectl("patch", *target, "--subresource=status", *patch, *stored)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout == f"{name}/4242"
