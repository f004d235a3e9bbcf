"""The policy annotations: round trip, defaults, refusals naming the key."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tessera.api import names
from tessera.models import model_ids
from tessera.placement.policy import DEFAULT, Policy, PolicyError, parse, to_annotations

MODELS = st.frozensets(st.sampled_from(model_ids()), max_size=3)
POLICIES = st.builds(
    Policy, node=st.sampled_from(["binpack", "spread"]), gpu=st.sampled_from(["binpack", "spread"]),
    models=MODELS, exclude_models=MODELS,
    exclude_gpus=st.frozensets(st.from_regex(r"GPU-[0-9a-f]{1,8}", fullmatch=True), max_size=3),
    topology=st.sampled_from(["prefer", "nvlink", "none"]))


@given(POLICIES)
def test_round_trip(policy: Policy) -> None:
    assert parse(to_annotations(policy)) == policy


@given(POLICIES)
def test_absent_keys_keep_the_default(default: Policy) -> None:
    assert parse({}, default) == default
    assert parse({"other": "x"}, default) == default


def test_lists_are_trimmed() -> None:
    got = parse({names.ANNOTATION_GPU_MODELS: " H100-80GB , A100-40GB",
                 names.ANNOTATION_GPU_UUIDS_EXCLUDE: "GPU-1,GPU-2 "})
    assert got == Policy(models=frozenset({"H100-80GB", "A100-40GB"}),
                         exclude_gpus=frozenset({"GPU-1", "GPU-2"}))
    assert Policy() == DEFAULT


@pytest.mark.parametrize(("key", "value", "message"), [
    (names.ANNOTATION_GPU_POLICY, "pack",
     "tessera.dev/gpu-policy: 'pack' is not binpack or spread"),
    (names.ANNOTATION_NODE_POLICY, "", "tessera.dev/node-policy: '' is not binpack or spread"),
    (names.ANNOTATION_GPU_TOPOLOGY, "NVLink",
     "tessera.dev/gpu-topology: 'NVLink' is not prefer, nvlink or none"),
    (names.ANNOTATION_GPU_MODELS, "H100", "tessera.dev/gpu-models: 'H100' is not a GPU model"),
    (names.ANNOTATION_GPU_MODELS_EXCLUDE, "A30-24GB,,H100-80GB",
     "tessera.dev/gpu-models-exclude: 'A30-24GB,,H100-80GB' has an empty item"),
    (names.ANNOTATION_GPU_MODELS, "", "tessera.dev/gpu-models: '' has an empty item"),
    (names.ANNOTATION_GPU_UUIDS_EXCLUDE, "MIG-1",
     "tessera.dev/gpu-uuids-exclude: 'MIG-1' is not a GPU UUID (GPU-…)"),
    (names.ANNOTATION_GPU_UUIDS_EXCLUDE, "GPU-", "tessera.dev/gpu-uuids-exclude: 'GPU-'"),
])
def test_refusals_name_the_key_the_value_and_what_is_allowed(key: str, value: str,
                                                              message: str) -> None:
    with pytest.raises(PolicyError) as err:
        parse({key: value})
    assert str(err.value).startswith(message)


@given(st.sampled_from([names.ANNOTATION_NODE_POLICY, names.ANNOTATION_GPU_POLICY,
                        names.ANNOTATION_GPU_TOPOLOGY]), st.text(max_size=10))
def test_any_other_word_is_refused_with_its_key(key: str, value: str) -> None:
    allowed = {"binpack", "spread", "prefer", "nvlink", "none"}
    if value.strip() in allowed:
        return
    with pytest.raises(PolicyError, match=f"^{key}: "):
        parse({key: value})
