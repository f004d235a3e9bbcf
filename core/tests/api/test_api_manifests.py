"""Every example loads; every bad example is refused naming the field its header names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api import GPUPartition, GPUQuota, ManifestError, load_manifest
from tessera.api.partition import ModelID, layout_summary
from tessera.mig import planner
from tessera.models import model_ids
from tessera.partition import spec_errors

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BAD = sorted((ROOT / "examples" / "bad").glob("*.yaml"))


def _load(path: Path) -> dict[str, Any]:
    data = yaml.safe_load(path.read_text())
    assert isinstance(data, dict)
    return data


# The tessera resources among the examples; the rest are the core objects they need.
GOOD = [p for p in EXAMPLES if _load(p)["apiVersion"].startswith("tessera.dev/")]


def test_examples_bring_the_namespaces_they_use() -> None:
    """`kubectl apply -f examples/` must work on an empty cluster."""
    created = {
        _load(p)["metadata"]["name"] for p in EXAMPLES if _load(p)["kind"] == "Namespace"
    }
    used = {_load(p)["metadata"].get("namespace") for p in GOOD} - {None}
    assert used <= created, f"examples use namespaces no example creates: {used - created}"
    assert {_load(p)["kind"] for p in EXAMPLES if p not in GOOD} <= {"Namespace"}


def test_there_are_enough_examples() -> None:
    kinds = {_load(p)["kind"] for p in GOOD}
    assert kinds == {"GPUPartition", "GPUQuota"}
    assert len(BAD) >= 8


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_example_loads_and_round_trips(path: Path) -> None:
    raw = _load(path)
    obj = load_manifest(raw)
    assert type(obj).__name__ == raw["kind"]
    again = load_manifest(obj.to_dict())
    assert again == obj
    # What the user wrote survives unchanged (quantities keep their spelling).
    assert _subset(raw["spec"], obj.to_dict()["spec"])


def _subset(small: Any, big: Any) -> bool:
    if isinstance(small, dict):
        return isinstance(big, dict) and all(
            k in big and _subset(v, big[k]) for k, v in small.items()
        )
    return bool(small == big)


@pytest.mark.parametrize("path", BAD, ids=lambda p: p.name)
def test_bad_example_names_its_field(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# field: "), f"{path.name} needs a '# field: <path>' header"
    field = first.removeprefix("# field: ").strip()
    with pytest.raises(ManifestError) as caught:
        load_manifest(_load(path))
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(field + ":"), message


def test_example_layouts_fit_their_models() -> None:
    checked = 0
    for path in GOOD:
        obj = load_manifest(_load(path))
        if not isinstance(obj, GPUPartition) or obj.spec.layout.mig_mode == "Disabled":
            continue
        models = (obj.spec.gpus.models if obj.spec.gpus else None) or []
        assert models, f"{path.name}: say which models the layout is for"
        for model in models:
            planner.fit(model, obj.spec.layout.profile_names())
            checked += 1
    assert checked >= 2


@pytest.mark.parametrize("path", GOOD, ids=lambda p: p.name)
def test_example_partitions_pass_admission(path: Path) -> None:
    """What the operator's webhook checks beyond the schema (spec_errors), OnDemand's
    bounds included."""
    obj = load_manifest(_load(path))
    if isinstance(obj, GPUPartition):
        assert spec_errors(obj.spec) == []


def test_model_enum_is_the_model_table() -> None:
    assert sorted(ModelID.__args__) == sorted(model_ids())


def test_defaults_are_the_safe_ones() -> None:
    part = GPUPartition.model_validate(
        {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition", "metadata": {"name": "p"},
         "spec": {"nodeSelector": {}, "layout": {"profiles": [{"name": "7g.80gb", "count": 1}]}}}
    )
    assert part.spec.disruption_policy == "WaitForIdle"
    assert part.spec.deletion_policy == "Retain"
    assert part.spec.layout.mig_mode == "Enabled"


@pytest.mark.parametrize(
    ("spec", "path"),
    [
        ({"hard": {"cores": 100}, "default": {"cores": 150}}, "spec.default.cores"),
        ({"hard": {"memory": "1Gi"}, "default": {"memory": "1025Mi"}}, "spec.default.memory"),
        ({"hard": {"memory": 1073741824}, "max": {"memory": "1Gi"}}, None),
        ({"max": {"memory": "1G"}, "default": {"memory": "1Gi"}}, "spec.default.memory"),
        ({"hard": {"migInstances": {"1g.10gb+me": 1, "1c.3g.40gb": 2}}}, None),
        ({"hard": {"migInstances": {"10gb": 1}}}, "spec.hard.migInstances"),
        ({"hard": {"cores": 1.5}}, "spec.hard.cores"),
        ({"hard": {"pods": True}}, "spec.hard.pods"),
        ({"hard": {"cores": "100"}}, "spec.hard.cores"),
    ],
)
def test_quota_rules(spec: dict[str, Any], path: str | None) -> None:
    raw = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
           "metadata": {"name": "q", "namespace": "n"}, "spec": spec}
    if path is None:
        assert isinstance(load_manifest(raw), GPUQuota)
        return
    with pytest.raises(ManifestError) as caught:
        load_manifest(raw)
    assert caught.value.path.startswith(path)


@pytest.mark.parametrize(
    ("raw", "path"),
    [
        ([], ""),
        ({"apiVersion": "v1", "kind": "GPUQuota"}, "apiVersion"),
        ({"apiVersion": "tessera.dev/v1alpha1", "kind": "Pod"}, "kind"),
        ({"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota"}, "spec"),
    ],
)
def test_not_a_tessera_manifest(raw: Any, path: str) -> None:
    with pytest.raises(ManifestError) as caught:
        load_manifest(raw)
    assert caught.value.path == path


def test_repeated_profile_is_refused() -> None:
    raw = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition", "metadata": {"name": "p"},
           "spec": {"nodeSelector": {}, "layout": {"profiles": [
               {"name": "1g.10gb", "count": 1}, {"name": "1g.10gb", "count": 2}]}}}
    with pytest.raises(ManifestError, match=r"^spec\.layout\.profiles\[1\]\.name: "):
        load_manifest(raw)


def test_layout_summary_is_largest_first() -> None:
    raw = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition", "metadata": {"name": "p"},
           "spec": {"nodeSelector": {}, "layout": {"profiles": [
               {"name": "1g.10gb", "count": 4}, {"name": "3g.40gb", "count": 1}]}}}
    obj = load_manifest(raw)
    assert isinstance(obj, GPUPartition)
    assert layout_summary(obj.spec.layout) == "1x3g.40gb+4x1g.10gb"
    assert obj.spec.layout.profile_names() == ["1g.10gb"] * 4 + ["3g.40gb"]
    disabled = obj.spec.layout.model_copy(update={"mig_mode": "Disabled", "profiles": None})
    assert layout_summary(disabled) == "MIG disabled"
