"""pynvml against the fake libnvidia-ml: devices, memory, MIG geometry and rules."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import pytest

from tessera.models import get_model

from .conftest import Node


def test_devices(make_node: Callable[..., Node], nvml: Callable[[Node], Any]) -> None:
    node = make_node("H100-80GB", "A100-40GB")
    nv = nvml(node)
    assert nv.nvmlDeviceGetCount() == 2
    h = nv.nvmlDeviceGetHandleByIndex(1)
    model = get_model("A100-40GB")
    assert nv.nvmlDeviceGetName(h) == model.nvml_name
    assert nv.nvmlDeviceGetIndex(h) == 1
    uuid = nv.nvmlDeviceGetUUID(h)
    assert uuid.startswith("GPU-")
    assert nv.nvmlDeviceGetIndex(nv.nvmlDeviceGetHandleByUUID(uuid)) == 1
    pci = nv.nvmlDeviceGetPciInfo(h)
    assert pci.pciDeviceId == model.pci_device_id
    mem = nv.nvmlDeviceGetMemoryInfo(h)
    assert mem.total == model.memory_mib << 20 and mem.used == 0 and mem.free == mem.total
    mem2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    assert mem2.total == model.memory_mib << 20
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    assert nv.nvmlDeviceGetUtilizationRates(h).gpu == 0
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)
    assert nv.nvmlSystemGetCudaDriverVersion() >= 12000
    with pytest.raises(nv.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetHandleByUUID("GPU-nope")


def test_unknown_calls_are_not_supported(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    nv = nvml(make_node("H100-80GB"))
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetPowerUsage(h)
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetTemperature(h, 0)


def test_mig_mode_hopper_immediate_ampere_pending(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    nv = nvml(make_node("H100-80GB", "A100-40GB"))
    h100, a100 = (nv.nvmlDeviceGetHandleByIndex(i) for i in (0, 1))
    assert nv.nvmlDeviceSetMigMode(h100, 1) == nv.NVML_SUCCESS
    assert nv.nvmlDeviceGetMigMode(h100) == [1, 1]
    assert nv.nvmlDeviceSetMigMode(a100, 1) != nv.NVML_SUCCESS  # activation status
    assert nv.nvmlDeviceGetMigMode(a100) == [0, 1]
    lib = nv.nvmlLib
    assert lib.tesseraSimResetGpu(ctypes.c_uint(1)) == 0
    assert nv.nvmlDeviceGetMigMode(a100) == [1, 1]
    # MIG-enabled GPUs report no device utilisation, as real ones do.
    with pytest.raises(nv.NVMLError_NotSupported):
        nv.nvmlDeviceGetUtilizationRates(h100)


def profile_id(nv: Any, dev: Any, name: str) -> int:
    for idx in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
        try:
            info = nv.nvmlDeviceGetGpuInstanceProfileInfo(dev, idx)
        except nv.NVMLError:
            continue
        if str(info.name) == f"MIG {name}":
            return int(info.id)
    raise AssertionError(name)


def create(nv: Any, dev: Any, pid: int, start: int | None = None) -> Any:
    if start is None:
        gi = nv.nvmlDeviceCreateGpuInstance(dev, pid)
    else:
        pl = nv.c_nvmlGpuInstancePlacement_t()
        count = ctypes.c_uint(8)
        arr = (nv.c_nvmlGpuInstancePlacement_t * 8)()
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(dev, pid, arr, ctypes.byref(count))
        pl.start, pl.size = start, arr[0].size
        gi = nv.nvmlDeviceCreateGpuInstanceWithPlacement(dev, pid, ctypes.byref(pl))
    return nv.nvmlGpuInstanceGetInfo(gi), gi


def test_default_placement_and_insufficient_resources_order(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    nv = nvml(make_node("A100-40GB:mig"))
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    g1, g2, g3 = (profile_id(nv, dev, n) for n in ("1g.5gb", "2g.10gb", "3g.20gb"))
    assert (g1, g2, g3) == (19, 14, 9)
    # The guide's failing order: 19,19,14,9.
    infos = [create(nv, dev, p)[0] for p in (g1, g1, g2)]
    assert [(i.placement.start, i.id) for i in infos] == [(6, 13), (5, 12), (2, 4)]
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlDeviceCreateGpuInstance(dev, g3)
    for p in (g1, g2):
        count = ctypes.c_uint(8)
        arr = (nv.c_nvmlGpuInstance_t * 8)()
        nv.nvmlDeviceGetGpuInstances(dev, p, arr, ctypes.byref(count))
        for k in range(count.value):
            nv.nvmlGpuInstanceDestroy(arr[k])
    # The working order: 9,19,14,19; a 3g lands at 4.
    infos = [create(nv, dev, p)[0] for p in (g3, g1, g2, g1)]
    assert [i.placement.start for i in infos] == [4, 3, 0, 2]
    assert infos[0].id == 2
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, g1) == 0


def test_explicit_placement_rules(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    nv = nvml(make_node("H100-80GB:mig"))
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    g1, g3, g4, g7 = (profile_id(nv, dev, n) for n in ("1g.10gb", "3g.40gb", "4g.40gb", "7g.80gb"))
    with pytest.raises(nv.NVMLError_InvalidArgument):
        create(nv, dev, g3, 2)  # 3g starts at 0 or 4 only
    create(nv, dev, g4, 0)
    with pytest.raises(nv.NVMLError_InsufficientResources):
        create(nv, dev, g4, 0)  # 4g + 4g
    info, gi3 = create(nv, dev, g3, 4)  # 4g + 3g
    assert (info.placement.start, info.placement.size) == (4, 4)
    assert nv.nvmlDeviceGetGpuInstanceRemainingCapacity(dev, g1) == 0
    with pytest.raises(nv.NVMLError_InsufficientResources):
        nv.nvmlDeviceCreateGpuInstance(dev, g7)
    # A GI with a compute instance cannot be destroyed; its CI can.
    ci = nv.nvmlGpuInstanceCreateComputeInstance(gi3, nv.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE)
    with pytest.raises(nv.NVMLError_InUse):
        nv.nvmlGpuInstanceDestroy(gi3)
    with pytest.raises(nv.NVMLError_InUse):
        nv.nvmlDeviceSetMigMode(dev, 0)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(dev, 0)
    assert nv.nvmlDeviceGetName(mig).endswith("MIG 3g.40gb")
    assert nv.nvmlDeviceGetUUID(mig).startswith("MIG-")
    assert nv.nvmlDeviceGetMemoryInfo(mig).total == nv.nvmlDeviceGetGpuInstanceProfileInfo(
        dev, nv.NVML_GPU_INSTANCE_PROFILE_3_SLICE).memorySizeMB << 20
    nv.nvmlComputeInstanceDestroy(ci)
    nv.nvmlGpuInstanceDestroy(gi3)


def test_seven_1g_and_double_memory(
    make_node: Callable[..., Node], nvml: Callable[[Node], Any]
) -> None:
    nv = nvml(make_node("H100-80GB:mig"))
    dev = nv.nvmlDeviceGetHandleByIndex(0)
    g1, g1d = profile_id(nv, dev, "1g.10gb"), profile_id(nv, dev, "1g.20gb")
    assert g1d == 15
    for s in range(6):
        create(nv, dev, g1, s)
    info, _ = create(nv, dev, g1d, 6)  # 6 x 1g + 1g* at slot 6
    assert (info.placement.start, info.placement.size, info.id) == (6, 2, 6)
