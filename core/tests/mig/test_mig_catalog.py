"""The MIG profile catalog says what a name means on each GPU model (docs/mig.md §1.2-§1.4)."""

from __future__ import annotations

import itertools

import pytest
from mig_oracle import geometry

from tessera.mig.catalog import (
    UnknownProfileError,
    profile,
    profiles,
    slice_counts,
)
from tessera.models import MODELS, UnknownModelError, get_model

MODEL_IDS = [m.id for m in MODELS]


def test_same_name_means_different_profiles_on_different_models() -> None:
    small = profile("A100-40GB", "1g.10gb")
    big = profile("H100-80GB", "1g.10gb")
    assert (small.memory_slices, small.max_count, small.starts) == (2, 4, (0, 2, 4, 6))
    assert (big.memory_slices, big.max_count, big.starts) == (1, 7, (0, 1, 2, 3, 4, 5, 6))
    assert small.smi_profile_id == 15 and big.smi_profile_id == 19


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_catalog_matches_the_reference_tables(model_id: str) -> None:
    slots, compute, table = geometry(model_id)
    assert slice_counts(model_id) == (slots, compute)
    got = {
        p.name: (p.compute_slices, p.memory_slices, p.starts, p.max_count)
        for p in profiles(model_id)
    }
    assert got == table


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_media_extension_variants_mirror_their_base_profile(model_id: str) -> None:
    by_name = {p.name: p for p in profiles(model_id)}
    me = [p for p in profiles(model_id) if p.media_extensions]
    assert me, "every model has a +me variant"
    for variant in me:
        assert variant.name.endswith("+me") and variant.max_count == 1
        base = by_name[variant.name.removesuffix("+me")]
        assert (variant.memory_slices, variant.starts) == (base.memory_slices, base.starts)
        assert variant.nvml_profile_id != base.nvml_profile_id


def test_nvidia_smi_and_nvml_ids_differ_as_on_real_gpus() -> None:
    ids = {p.name: (p.nvml_profile_id, p.smi_profile_id) for p in profiles("A100-40GB")}
    assert ids == {
        "1g.5gb": (0, 19), "1g.5gb+me": (7, 20), "1g.10gb": (9, 15), "2g.10gb": (1, 14),
        "3g.20gb": (2, 9), "4g.20gb": (3, 5), "7g.40gb": (4, 0),
    }
    a30 = {p.name: p.smi_profile_id for p in profiles("A30-24GB")}
    assert a30 == {"1g.6gb": 14, "1g.6gb+me": 21, "2g.12gb": 5, "2g.12gb+me": 6, "4g.24gb": 0}


def test_real_lgip_figures_are_used_where_known() -> None:
    assert profile("A100-40GB", "1g.5gb").memory_mib == 4864  # 4.75 GiB
    assert profile("A100-40GB", "7g.40gb").sm_count == 98
    assert profile("H100-94GB", "1g.24gb").sm_count == 26
    assert profile("H100-94GB", "3g.47gb").memory_mib == 47488  # 46.38 GiB
    assert profile("A30-24GB", "2g.12gb").memory_mib == 11968  # 11.69 GiB


# nvmlDeviceGetGpuInstanceProfileInfo on real GPUs (driver 580.159.04, 2026-11-27): name,
# memorySizeMB, multiprocessorCount, instanceCount of every profile.
NVML_READINGS = {
    "H100-80GB": {  # NVIDIA H100 80GB HBM3, 81559 MiB
        "1g.10gb": (9984, 16, 7), "1g.10gb+me": (9984, 16, 1), "1g.20gb": (20096, 26, 4),
        "2g.20gb": (20096, 32, 3), "3g.40gb": (40448, 60, 2), "4g.40gb": (40448, 64, 1),
        "7g.80gb": (81152, 132, 1),
    },
    "H200-141GB": {  # NVIDIA H200, 143771 MiB
        "1g.18gb": (16384, 16, 7), "1g.18gb+me": (16384, 16, 1), "1g.35gb": (33280, 26, 4),
        "2g.35gb": (33280, 32, 3), "3g.71gb": (71424, 60, 2), "4g.71gb": (71424, 64, 1),
        "7g.141gb": (143360, 132, 1),
    },
}


@pytest.mark.parametrize("model_id", sorted(NVML_READINGS))
def test_catalog_matches_what_nvml_read_on_real_gpus(model_id: str) -> None:
    got = {p.name: (p.memory_mib, p.sm_count, p.max_count) for p in profiles(model_id)}
    assert got == NVML_READINGS[model_id]


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_instance_resources_grow_with_slices_and_stay_within_the_gpu(model_id: str) -> None:
    model = get_model(model_id)
    total_memory, total_compute = slice_counts(model_id)
    for p in profiles(model_id):
        assert 0 < p.memory_mib <= model.memory_mib
        assert 0 < p.sm_count <= model.sm_count
        # the name's GB figure is the memory rounded up to the model's GB per slice
        assert int(p.name.split(".")[1].split("gb")[0]) * 1024 >= p.memory_mib * 0.95
    ordered = sorted(profiles(model_id), key=lambda p: (p.memory_slices, p.compute_slices))
    for a, b in itertools.pairwise(ordered):
        if b.memory_slices > a.memory_slices:
            assert b.memory_mib > a.memory_mib
        if b.compute_slices > a.compute_slices:
            assert b.sm_count > a.sm_count
    full = [p for p in profiles(model_id) if p.memory_slices == total_memory]
    assert len(full) == 1 and full[0].compute_slices == total_compute


def test_unknown_profile_names_the_model_and_lists_valid_profiles() -> None:
    with pytest.raises(UnknownProfileError) as err:
        profile("A100-40GB", "1g.20gb")
    message = str(err.value)
    assert "A100-40GB" in message and "1g.5gb" in message and "7g.40gb" in message


def test_unknown_model_is_reported_by_the_model_table() -> None:
    with pytest.raises(UnknownModelError, match="known models"):
        profiles("T4-16GB")

