"""merge_diff: the status patch the operator sends is exactly the change, nothing stale kept."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from tessera.kube.merge import merge_diff

scalars = st.one_of(st.booleans(), st.integers(), st.text(max_size=5))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from("abcde"), inner, max_size=4)),
    max_leaves=12)
objects = st.dictionaries(st.sampled_from("abcdef"), values, max_size=5)


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 section 2, as the API server applies a merge patch."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = apply_merge_patch(out.get(k), v)
    return out


@given(objects, objects)
def test_the_patch_turns_old_into_new(old: dict[str, Any], new: dict[str, Any]) -> None:
    assert apply_merge_patch(old, merge_diff(old, new)) == new


@given(objects)
def test_no_change_no_patch(obj: dict[str, Any]) -> None:
    assert merge_diff(obj, obj) == {}


def test_a_cleared_field_of_a_node_entry_is_removed() -> None:
    """A node that was Failed with a message and now reports Ready must lose the message."""
    old = {"nodes": {"a": {"phase": "Failed", "message": "GPU 1 busy"}, "b": {"phase": "Ready"}}}
    new = {"nodes": {"a": {"phase": "Ready"}}}
    assert merge_diff(old, new) == {"nodes": {"a": {"phase": "Ready", "message": None},
                                              "b": None}}
