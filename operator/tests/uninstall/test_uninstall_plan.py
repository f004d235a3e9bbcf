"""What the uninstall hook removes from a Node: every tessera key, nothing else."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tessera.api.names import PREFIX
from tessera_operator.uninstall.plan import node_patch

_names = st.text("abcdefgh.-/", min_size=1, max_size=12)
_keys = st.one_of(_names, _names.map(lambda n: PREFIX + n))
_maps = st.dictionaries(_keys, st.text(max_size=5), max_size=6)


def _apply(meta: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) for k, v in meta.items()}
    for field, changes in patch["metadata"].items():
        if field == "resourceVersion":
            continue
        for key, value in changes.items():
            assert value is None  # only removals
            out[field].pop(key)
    return out


@given(labels=_maps, annotations=_maps)
def test_the_patch_removes_exactly_the_tessera_keys(labels: dict[str, str],
                                                    annotations: dict[str, str]) -> None:
    meta = {"labels": labels, "annotations": annotations}
    patch = node_patch({"metadata": {**meta, "resourceVersion": "7"}})
    tessera = [k for k in [*labels, *annotations] if k.startswith(PREFIX)]
    if not tessera:
        assert patch is None
        return
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "7"  # a precondition, never blind
    after = _apply(meta, patch)
    for field in ("labels", "annotations"):
        assert after[field] == {k: v for k, v in meta[field].items()
                                if not k.startswith(PREFIX)}


def test_a_node_without_metadata_maps_needs_no_patch() -> None:
    assert node_patch({"metadata": {"name": "n"}}) is None
    assert node_patch({}) is None

