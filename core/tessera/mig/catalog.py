"""MIG GPU-instance profiles per GPU model (reference: docs/mig.md §1.3, §1.4, §1.2).

Profile names are device-relative: ``1g.10gb`` is the base one-slice profile (7 fit) on
A100-80GB and H100-80GB but the double-memory one-slice profile (4 fit) on A100-40GB.  So a
profile is only ever looked up together with a model ID.  Geometry (placement size on the
memory-slice axis, compute slices, start slots, maximum count) is a property of the GPU's slice
class (8/7 for A100/H100/H200/B200, 4/4 for A30); the names come from each model's memory size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from tessera.models import get_model


@dataclass(frozen=True)
class Profile:
    """One GPU-instance profile as it exists on one GPU model."""

    name: str
    """Name as nvidia-smi prints it on this model, e.g. ``1g.10gb`` or ``1g.10gb+me``."""
    model_id: str
    memory_slices: int
    """Placement size on the memory-slice axis (a 3g takes 4 slices, a 7g all 8)."""
    compute_slices: int
    starts: tuple[int, ...]
    """Memory slices an instance of this profile may start at (``-lgipp``)."""
    max_count: int
    media_extensions: bool
    """The ``+me`` variant: same geometry as its base profile, at most one per GPU."""
    nvml_profile_id: int
    """``NVML_GPU_INSTANCE_PROFILE_*`` value passed to ``nvmlDeviceGetGpuInstanceProfileInfo``."""
    smi_profile_id: int
    """The profile ID nvidia-smi prints and accepts in ``-cgi`` (differs from the NVML enum)."""
    memory_mib: int
    """Instance memory as NVML reports it."""
    sm_count: int
    """Streaming multiprocessors of the instance."""

    def mask(self, start: int) -> int:
        """Bitmask of the memory slices an instance at ``start`` occupies."""
        return ((1 << self.memory_slices) - 1) << start


class UnknownProfileError(ValueError):
    """A profile name that does not exist on the given GPU model."""


@dataclass(frozen=True)
class _Shape:
    compute: int
    memory: int
    starts: tuple[int, ...]
    max_count: int
    media_extensions: bool
    nvml_id: int
    smi_id: int


# Slice class with 8 memory / 7 compute slices (A100, H100, H200, B200): §1.4 placements.
_EIGHT_SLICE: tuple[_Shape, ...] = (
    _Shape(1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False, 0, 19),
    _Shape(1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True, 7, 20),
    _Shape(1, 2, (0, 2, 4, 6), 4, False, 9, 15),
    _Shape(2, 2, (0, 2, 4), 3, False, 1, 14),
    _Shape(3, 4, (0, 4), 2, False, 2, 9),
    _Shape(4, 4, (0,), 1, False, 3, 5),
    _Shape(7, 8, (0,), 1, False, 4, 0),
)

# A30: 4 memory / 4 compute slices.
_FOUR_SLICE: tuple[_Shape, ...] = (
    _Shape(1, 1, (0, 1, 2, 3), 4, False, 0, 14),
    _Shape(1, 1, (0, 1, 2, 3), 1, True, 7, 21),
    _Shape(2, 2, (0, 2), 2, False, 1, 5),
    _Shape(2, 2, (0, 2), 1, True, 8, 6),
    _Shape(4, 4, (0,), 1, False, 3, 0),
)

# The "<GB>gb" part of each model's names, per memory-slice count (§1.3 tables).
_GB_BY_MEMORY_SLICES: dict[str, dict[int, int]] = {
    "A100-40GB": {1: 5, 2: 10, 4: 20, 8: 40},
    "A100-80GB": {1: 10, 2: 20, 4: 40, 8: 80},
    "H100-80GB": {1: 10, 2: 20, 4: 40, 8: 80},
    "H100-94GB": {1: 12, 2: 24, 4: 47, 8: 94},
    "H100-96GB": {1: 12, 2: 24, 4: 48, 8: 96},
    "H200-141GB": {1: 18, 2: 35, 4: 71, 8: 141},
    "B200-180GB": {1: 23, 2: 45, 4: 90, 8: 180},
    "A30-24GB": {1: 6, 2: 12, 4: 24},
}

# Real instance memory in MiB, keyed by memory slices: instance memory depends only on the
# memory slices, so the 2g figure also holds for the double-memory 1g.  A100-*, H100-94GB and
# A30: real `-lgip` outputs (GiB printed with two decimals, read as the MiB value it rounds).
# H100-80GB (an H100 80GB HBM3) and H200-141GB (an H200): NVML's `memorySizeMB`, read from
# `nvmlDeviceGetGpuInstanceProfileInfo` on real GPUs (driver 580.159.04, 2026-11-27).
# Models/sizes not listed are derived (slices * model memory / total).
_REAL_MEMORY_MIB: dict[str, dict[int, int]] = {
    "A100-40GB": {1: 4864, 2: 9984, 4: 20096, 8: 40448},
    "A100-80GB": {1: 9728, 2: 19968, 4: 40192},
    "H100-80GB": {1: 9984, 2: 20096, 4: 40448, 8: 81152},
    "H100-94GB": {1: 11008, 2: 22144, 4: 47488, 8: 95360},
    "H200-141GB": {1: 16384, 2: 33280, 4: 71424, 8: 143360},
    "A30-24GB": {1: 5952, 2: 11968, 4: 24064},
}

# Real SM counts keyed by (compute slices, memory slices).  The numbers are a property of the
# chip: the H100 NVL's `-lgip` figures, which NVML also reported on an H100 80GB HBM3 and an
# H200 (driver 580.159.04, 2026-11-27), are used for every GH100-based model (H100-*, H200).
_AMPERE_SM = {(1, 1): 14, (1, 2): 14, (2, 2): 28, (3, 4): 42, (4, 4): 56, (7, 8): 98}
_HOPPER_SM = {(1, 1): 16, (1, 2): 26, (2, 2): 32, (3, 4): 60, (4, 4): 64, (7, 8): 132}
_REAL_SM: dict[str, dict[tuple[int, int], int]] = {
    "A100-40GB": _AMPERE_SM,
    "A100-80GB": _AMPERE_SM,
    "H100-80GB": _HOPPER_SM,
    "H100-94GB": _HOPPER_SM,
    "H100-96GB": _HOPPER_SM,
    "H200-141GB": _HOPPER_SM,
    "A30-24GB": {(1, 1): 14, (2, 2): 28, (4, 4): 56},
}


def _shapes(model_id: str) -> tuple[_Shape, ...]:
    return _FOUR_SLICE if model_id == "A30-24GB" else _EIGHT_SLICE


def slice_counts(model_id: str) -> tuple[int, int]:
    """(memory slices, compute slices) of a model: (8, 7) or (4, 4)."""
    get_model(model_id)  # raises UnknownModelError with the list of known models
    return (4, 4) if model_id == "A30-24GB" else (8, 7)


@cache
def profiles(model_id: str) -> tuple[Profile, ...]:
    """Every GPU-instance profile of a model, smallest first."""
    model = get_model(model_id)
    total_memory, total_compute = slice_counts(model_id)
    gb = _GB_BY_MEMORY_SLICES[model_id]
    real_memory = _REAL_MEMORY_MIB.get(model_id, {})
    real_sm = _REAL_SM.get(model_id, {})
    result = []
    for shape in _shapes(model_id):
        suffix = "+me" if shape.media_extensions else ""
        memory_mib = real_memory.get(
            shape.memory, shape.memory * model.memory_mib // total_memory
        )
        sm_count = real_sm.get(
            (shape.compute, shape.memory),
            model.sm_count
            if shape.compute == total_compute
            else shape.compute * model.sm_count // total_compute,
        )
        result.append(
            Profile(
                name=f"{shape.compute}g.{gb[shape.memory]}gb{suffix}",
                model_id=model_id,
                memory_slices=shape.memory,
                compute_slices=shape.compute,
                starts=shape.starts,
                max_count=shape.max_count,
                media_extensions=shape.media_extensions,
                nvml_profile_id=shape.nvml_id,
                smi_profile_id=shape.smi_id,
                memory_mib=memory_mib,
                sm_count=sm_count,
            )
        )
    return tuple(result)


@cache
def _by_name(model_id: str) -> dict[str, Profile]:
    return {p.name: p for p in profiles(model_id)}


def profile(model_id: str, name: str) -> Profile:
    """Resolve a profile name on a model; the error names the model and its valid profiles."""
    table = _by_name(model_id)
    try:
        return table[name]
    except KeyError:
        valid = ", ".join(table)
        raise UnknownProfileError(
            f"unknown MIG profile {name!r} for {model_id}; valid profiles: {valid}"
        ) from None
