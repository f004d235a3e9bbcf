"""The simulator's MIG tables (it plays the hardware) agree with the planner's catalog for
every model, as NVML reports them."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from tessera.mig import catalog
from tessera.models import MODELS

from .conftest import Node


def test_every_model_matches_the_catalog(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    models = [m for m in MODELS if m.mig_capable]
    node = make_node(*(f"{m.id}:mig" for m in models))
    nv = nvml(node)
    mismatches: list[str] = []
    for i, model in enumerate(models):
        dev = nv.nvmlDeviceGetHandleByIndex(i)
        expected = {p.nvml_profile_id: p for p in catalog.profiles(model.id)}
        seen = set()
        for idx in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, idx)
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue
            seen.add(idx)
            p = expected.get(idx)
            if p is None:
                mismatches.append(f"{model.id}: simulator has extra profile {info.name}")
                continue
            count = ctypes.c_uint(8)
            arr = (nv.c_nvmlGpuInstancePlacement_t * 8)()
            nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, info.id, arr, ctypes.byref(count))
            got = {
                "name": str(info.name).removeprefix("MIG "),
                "smi_profile_id": info.id,
                "compute_slices": info.sliceCount,
                "max_count": info.instanceCount,
                "memory_mib": info.memorySizeMB,
                "sm_count": info.multiprocessorCount,
                "starts": tuple(arr[k].start for k in range(count.value)),
                "memory_slices": arr[0].size,
                "media_extensions": str(info.name).endswith("+me"),
            }
            for field, value in got.items():
                if getattr(p, field) != value:
                    mismatches.append(
                        f"{model.id} {p.name}: {field} simulator={value} "
                        f"catalog={getattr(p, field)}"
                    )
        for idx in set(expected) - seen:
            mismatches.append(f"{model.id}: simulator lacks {expected[idx].name}")
    assert not mismatches, "\n".join(mismatches)
