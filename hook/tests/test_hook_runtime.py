"""CUDA runtime-API programs under libtessera: `trt` (hook/tests/c/trt.c) is built against the
real libcudart of the pinned nvidia-cuda-runtime-cu12 wheel, its kernels PTX in a fat binary
it registers as nvcc's host stub does, and runs on the simulated node (which serves the
runtime's private driver tables, fat binaries, libraries and stream capture).

What HAMi-core's runtime test programs check (allocation, concurrent allocation, launches,
several GPUs), written for tessera's budgets, plus the paths where HAMi-core is known to fail
(stream-ordered pools, managed memory, graphs, every GPU of a multi-GPU pod limited)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tessera_hook_harness import GIB, GPU_UUID, MIB, TRT, Container, sim_env, trt

from tessera_node.budget.formats import BudgetEntry
from tessera_sim.node import GPUSpec, node_description

CUDA_SUCCESS = 0
CUDA_ERROR_MEMORY_ALLOCATION = 2  # cudaErrorMemoryAllocation
SECOND_GPU = "GPU-22222222-2222-3333-4444-555555555555"


def test_runtime_programs_run_on_the_plain_simulator(hook_built: None, tmp_path: Path) -> None:
    """No libtessera: the runtime starts on the simulated driver (its private tables and
    integrity check answered), sees the node's GPU, loads the program's fat binary,
    launches and captures kernels."""
    env = sim_env(tmp_path)

    def run(*args: str) -> dict[str, Any]:
        out = subprocess.run([str(TRT), *args], env=env, capture_output=True, text=True,
                             timeout=60, check=False)
        assert out.returncode == 0, out
        result: dict[str, Any] = json.loads(out.stdout.splitlines()[-1])
        return result

    info = run("info")
    assert info["devices"] == 1 and "H100" in info["name"], info
    assert info["total"] == info["prop_total"] > 79 * GIB, info
    fill = run("fill", "malloc", str(8 * GIB))
    assert fill["got"] >= 72 * GIB and fill["after"] == 0, fill
    assert run("launch", "0", "50", "4")["err"] == CUDA_SUCCESS
    graph = run("graph", "3", "4")
    assert graph["err"] == CUDA_SUCCESS and graph["nodes"] == 4, graph


def test_the_runtime_sees_the_budget(container: Container) -> None:
    r = trt(container, "info")
    assert r["err"] == CUDA_SUCCESS and r["devices"] == 1, r
    assert r["info_err"] == CUDA_SUCCESS and r["total"] == GIB and r["free"] == GIB, r


@pytest.mark.parametrize("kind", ["malloc", "managed", "async", "pool", "pitch"])
def test_every_runtime_allocation_is_held_to_the_budget(container: Container, kind: str) -> None:
    """cudaMalloc, cudaMallocManaged, cudaMallocAsync (the default pool), an own pool that
    keeps what is freed (release threshold: everything), cudaMallocPitch: each refused at the
    budget with cudaErrorMemoryAllocation, everything given back once freed."""
    r = trt(container, "fill", kind, str(64 * MIB))
    assert r["got"] == GIB and r["err"] == CUDA_ERROR_MEMORY_ALLOCATION, r
    assert r["free_err"] == CUDA_SUCCESS and r["after"] == 0, r
    assert container.read_ledger().devices[0].oom >= 1


def test_memory_a_pool_keeps_counts_until_it_is_trimmed(container: Container) -> None:
    """HAMi-core counts cudaMallocAsync memory as freed when cudaFreeAsync returns, though the
    pool keeps it: here what the pool keeps is the container's until cudaMemPoolTrimTo."""
    r = trt(container, "poolkeep", str(768 * MIB))
    assert r["kept_err"] == CUDA_ERROR_MEMORY_ALLOCATION, r
    assert r["trimmed_err"] == CUDA_SUCCESS, r


def test_a_release_threshold_is_what_the_pool_keeps_of_the_budget(container: Container) -> None:
    """The default pool's release threshold (128 MiB): after the stream synchronises, the
    pool keeps that much of the 512 MiB freed, and the budget counts exactly that."""
    r = trt(container, "threshold", str(512 * MIB), str(128 * MIB))
    assert r["err"] == CUDA_SUCCESS and r["held"] == 512 * MIB and r["used"] == 128 * MIB, r


def test_threads_allocating_at_once_share_one_budget(container: Container) -> None:
    r = trt(container, "threads", "8", str(32 * MIB))
    assert r["got"] == GIB and r["held"] == GIB and r["after"] == 0, r


def test_runtime_launches_keep_to_the_core_budget(container: Container) -> None:
    container.set_simple(memory=GIB, cores=30, rate=200)
    r = trt(container, "launch", "0", "300", "1")
    assert r["err"] == CUDA_SUCCESS, r
    # 300 launches at 200/s with a 10-token bucket: ~1.45 s
    assert 1.2 < float(r["secs"]) < 2.2, r
    assert container.read_ledger().devices[0].tokens >= 300
    container.set_simple(memory=GIB, cores=None)
    assert float(trt(container, "launch", "0", "300", "1")["secs"]) < 0.5


def test_captured_graphs_spend_a_token_per_kernel(container: Container) -> None:
    """A graph captured from a stream with cudaStreamBeginCapture and launched with
    cudaGraphLaunch: its kernels are paid for like launches (a graph of 5 kernels, 40
    launches: 200 kernels at 200/s)."""
    container.set_simple(memory=GIB, cores=30, rate=200)
    r = trt(container, "graph", "40", "5")
    assert r["err"] == CUDA_SUCCESS and r["nodes"] == 5, r
    assert 0.8 < float(r["secs"]) < 1.6, r
    assert container.read_ledger().devices[0].tokens >= 200


@pytest.fixture
def two_gpus(hook_built: None, tmp_path: Path) -> Container:
    (tmp_path / "node.ini").write_text(node_description([
        GPUSpec("H100-80GB", uuid=GPU_UUID), GPUSpec("H100-80GB", uuid=SECOND_GPU)]))
    return Container(tmp_path, "two")


def test_each_gpu_of_a_two_gpu_program_keeps_its_own_budgets(two_gpus: Container) -> None:
    """HAMi-core limits only card 0 of a multi-GPU pod; here each GPU's memory and core
    budgets hold, named by UUID."""
    c = two_gpus
    c.set(BudgetEntry(uuid=GPU_UUID, memory=GIB, cores=30, rate=200, burst=10),
          BudgetEntry(uuid=SECOND_GPU, memory=512 * MIB, cores=15, rate=100, burst=5))
    r = trt(c, "devices", str(64 * MIB))
    assert r["err"] == CUDA_SUCCESS and r["got"] == [GIB, 512 * MIB], r
    first = trt(c, "launch", "0", "200", "1")
    second = trt(c, "launch", "1", "200", "1")
    assert first["err"] == CUDA_SUCCESS and second["err"] == CUDA_SUCCESS
    assert 0.8 < float(first["secs"]) < 1.5, first
    assert 1.7 < float(second["secs"]) < 2.6, second
    led = c.read_ledger()
    assert led.devices[0].tokens >= 200 and led.devices[1].tokens >= 200
    c.budget.close()
