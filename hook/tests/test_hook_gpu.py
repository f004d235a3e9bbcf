"""Real-GPU tier: the same checks as test_hook.py and test_hook_runtime.py, built the same way,
against the machine's own libcuda.so.1 and libnvidia-ml.so.1 (the runtime program `trt` with
the pinned libcudart, its PTX kernels compiled by the real driver). Skipped, saying so, only
where there is no NVIDIA GPU (/dev/nvidiactl missing); on a machine with one, a driver that
cannot be used fails."""

from __future__ import annotations

import ctypes.util
import dataclasses
import os
from pathlib import Path

import pytest
from tessera_hook_harness import GIB, MIB, SIM_LIB, Container, trt

from tessera_node.device.nvml import NvmlReader
from tessera_node.node.inventory import model_of, node_gpus, profile_mismatches

pytestmark = pytest.mark.gpu


NO_GPU = "no NVIDIA GPU on this machine (/dev/nvidiactl missing)"


def real_driver() -> str | None:
    """Why the real driver cannot be used here, or None."""
    if not Path("/dev/nvidiactl").exists():
        return NO_GPU
    name = ctypes.util.find_library("cuda")
    if not name:
        return "no libcuda.so.1 from an NVIDIA driver"
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return f"libcuda.so.1 does not load: {exc}"
    if hasattr(lib, "tesseraSimSetFault") or str(SIM_LIB) in os.environ.get("LD_LIBRARY_PATH", ""):
        return "libcuda.so.1 is the simulator's"
    if lib.cuInit(0) != 0:
        return "cuInit failed on the real driver"
    return None


@pytest.fixture
def real_gpu() -> None:
    why = real_driver()
    if why == NO_GPU:
        pytest.skip(why)  # the one skip of the suite: this tier needs the hardware
    if why:
        pytest.fail(f"an NVIDIA GPU is present but {why}")


@pytest.fixture
def gpu_container(real_gpu: None, hook_built: None, tmp_path: Path) -> Container:
    c = Container(tmp_path, "gpu")
    for k in ("LD_LIBRARY_PATH", "TESSERA_SIM_NODE", "TESSERA_SIM_STATE"):
        c.env.pop(k, None)
    c.set_simple(memory=GIB)
    return c


@pytest.mark.parametrize("path", ["alloc", "pitch", "managed", "async", "pool", "vmm", "array"])
def test_real_gpu_paths_held_to_budget(gpu_container: Container, path: str) -> None:
    r = gpu_container.probe("fill", path, str(64 * MIB))
    assert r["got"] <= GIB and r["err"] == 2


@pytest.mark.parametrize(
    "method", ["dlsym", "next", "dlmopen", "gpa:12000:0", "gpa:12000:2", "nest:12090:0"]
)
def test_real_gpu_bypass(gpu_container: Container, method: str) -> None:
    assert gpu_container.probe("-m", method, "fill", "alloc", str(64 * MIB))["got"] <= GIB


def test_real_gpu_launches_are_counted(gpu_container: Container) -> None:
    """Every launch API and a graph, on the real driver: each kernel counted in the ledger
    (the node daemon's activity signal inside a MIG instance)."""
    assert gpu_container.probe("launch", "400", "1")["launches"] == 400
    assert gpu_container.read_ledger().launches == 400


def test_real_gpu_views_and_rate(gpu_container: Container) -> None:
    r = gpu_container.probe("info")
    assert r["total"] == GIB and r["device_total"] == GIB
    gpu_container.set_simple(memory=GIB, cores=30, rate=200)
    r = gpu_container.probe("launch", "400", "1")
    assert r["secs"] > 1.5


@pytest.mark.parametrize(
    "method", ["direct", "dlsym", "gpa:12090:0", "gpa:11040:2", "nest:12090:0"]
)
def test_real_gpu_graph_memory_nodes_refused(gpu_container: Container, method: str) -> None:
    r = gpu_container.probe("-m", method, "graphmem", str(4 * GIB))
    assert r["alloc_node"] == 801 and r["plain"] == 0
    if method != "gpa:11040:2":  # cuGraphAddNode exists from CUDA 12.2
        assert r["add_node"] == r["add_node_v2"] == 801 and r["add_kernel_node"] == 0


def test_real_gpu_runtime_sees_the_budget_and_runs_kernels(gpu_container: Container) -> None:
    """The CUDA runtime on the real driver under libtessera: cudaMemGetInfo and the device's
    properties show the budget; PTX kernels launch, alone and from a captured graph."""
    info = trt(gpu_container, "info")
    assert info["err"] == 0 and info["total"] == GIB and info["free"] == GIB, info
    assert trt(gpu_container, "launch", "0", "50", "4")["err"] == 0
    graph = trt(gpu_container, "graph", "3", "4")
    assert graph["err"] == 0 and graph["nodes"] == 4, graph


@pytest.mark.parametrize("kind", ["malloc", "managed", "async", "pool", "pitch"])
def test_real_gpu_runtime_allocations_held_to_budget(gpu_container: Container, kind: str) -> None:
    """Every runtime allocation path refused at the budget with cudaErrorMemoryAllocation
    (2), and everything given back once freed."""
    r = trt(gpu_container, "fill", kind, str(64 * MIB))
    assert isinstance(r["got"], int) and GIB - 64 * MIB <= r["got"] <= GIB, r
    assert r["err"] == 2 and r["free_err"] == 0 and r["after"] == 0, r


def test_real_gpu_is_in_the_model_table_and_its_mig_profiles_match(real_gpu: None) -> None:
    """The node daemon's model check on this machine's GPUs: each in tessera's model table
    (no UnknownModel finding), and NVML's MIG profile table, read with MIG mode left as it
    is, equal to tessera's catalog field for field (a difference is a ProfileMismatch
    finding, which fails every GPUPartition owning the GPU)."""
    reader = NvmlReader()
    try:
        snapshot = reader.read()
        assert snapshot.gpus and node_gpus(snapshot).findings == ()
        for gpu in snapshot.gpus:
            model = model_of(gpu)
            assert model is not None, gpu.name
            table = reader.mig_profiles(gpu.index)
            if model.mig_capable:
                assert table, f"{gpu.name}: NVML lists no MIG profiles"
            found = profile_mismatches(dataclasses.replace(gpu, profiles=table), model)
            assert found == [], [f.message for f in found]
    finally:
        reader.close()
