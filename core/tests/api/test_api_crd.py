"""The checked-in CRDs are what the types generate, and they are structural."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api import crd
from tessera_operator.cli.main import main

ROOT = Path(__file__).resolve().parents[3]

# Keywords a structural CRD schema may use (apiextensions JSONSchemaProps, minus the
# ones the API server forbids in CRDs, e.g. $ref, patternProperties, uniqueItems).
ALLOWED = {
    "type", "description", "properties", "items", "additionalProperties", "required",
    "enum", "default", "format", "pattern", "minimum", "maximum", "minLength", "maxLength",
    "minItems", "maxItems", "maxProperties", "minProperties", "anyOf", "nullable",
    "x-kubernetes-int-or-string", "x-kubernetes-validations", "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-map-type",
}
INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def test_checked_in_crds_are_up_to_date() -> None:
    for name, text in crd.rendered().items():
        path = ROOT / "crds" / name
        assert path.exists(), f"crds/{name} is missing: run `make crds`"
        assert path.read_text() == text, f"crds/{name} is out of date: run `make crds`"
    assert sorted(p.name for p in (ROOT / "crds").glob("*.yaml")) == sorted(crd.rendered())


def test_generation_is_deterministic() -> None:
    assert crd.rendered() == crd.rendered()


def _walk(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}.*")


@pytest.mark.parametrize("doc", crd.all_crds(), ids=lambda d: d["metadata"]["name"])
def test_schema_is_structural(doc: dict[str, Any]) -> None:
    schema = doc["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        unknown = set(node) - ALLOWED
        assert not unknown, f"{path}: {unknown}"
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == INT_OR_STRING and "type" not in node, path
        else:
            assert "type" in node, f"{path} has no type"
            assert "anyOf" not in node, path
        assert not ("properties" in node and "additionalProperties" in node), path
        if "x-kubernetes-preserve-unknown-fields" in node:
            pytest.fail(f"{path}: nothing here needs preserve-unknown-fields")
        for rule in node.get("x-kubernetes-validations", []):
            assert rule["message"]
            field = rule.get("fieldPath", "")
            if field:  # fieldPath must name a real child, so the error names the field
                target = node
                for part in field.strip(".").split("."):
                    target = target["properties"][part]


@pytest.mark.parametrize(
    ("doc", "short", "scope", "columns"),
    [
        (crd.gpupartition_crd(), "gpart", "Cluster", ["Selected", "Ready", "Layout", "Age"]),
        (crd.gpuquota_crd(), "gq", "Namespaced", ["Cores", "Memory", "Pods", "Ready", "Age"]),
    ],
)
def test_names_and_columns(
    doc: dict[str, Any], short: str, scope: str, columns: list[str]
) -> None:
    spec = doc["spec"]
    assert spec["group"] == "tessera.dev"
    assert spec["names"]["shortNames"] == [short]
    assert spec["names"]["categories"] == ["tessera"]
    assert spec["scope"] == scope
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == columns
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    for column in version["additionalPrinterColumns"]:
        path = column["jsonPath"]
        if path.startswith(".status."):  # every column reads a field the schema declares
            first = re.split(r"[.\[]", path.removeprefix(".status."))[0]
            assert first in status["properties"], path


def test_quota_order_rules_use_the_quantity_library() -> None:
    spec = crd.gpuquota_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = spec["properties"]["spec"]["x-kubernetes-validations"]
    paths = {r["fieldPath"] for r in rules}
    assert paths == {".default.cores", ".max.cores", ".default.memory", ".max.memory"}
    memory_rules = [r["rule"] for r in rules if "memory" in r["fieldPath"]]
    assert all("quantity(string(" in r and ".compareTo(" in r for r in memory_rules)


def test_cli_prints_yaml_stream(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds"]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    assert [d["metadata"]["name"] for d in docs] == [
        "gpupartitions.tessera.dev", "gpuquotas.tessera.dev"]


def test_cli_writes_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["crds", "--out", str(tmp_path / "out")]) == 0
    for name, text in crd.rendered().items():
        assert (tmp_path / "out" / name).read_text() == text


def test_cli_bad_out_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["crds", "--out", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tessera: --out") and err.count("\n") == 1
