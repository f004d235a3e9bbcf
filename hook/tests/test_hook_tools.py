"""Sanitizer builds, valgrind and seeded libFuzzer runs over libtessera."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tessera_hook_harness import BUILD, HOOK, MIB, ROOT, SIM_LIB, sim_env

RUNS = 200_000  # per fuzz target, seeded: the same inputs every time
OPS = [
    ["fill", "alloc", str(64 * MIB)],
    ["fill", "pitch", str(64 * MIB)],
    ["fill", "vmm", str(64 * MIB)],
    ["fill", "array3d", str(64 * MIB)],
    ["-m", "nest:12090:2", "fill", "pool", str(64 * MIB)],
    ["-m", "dlmopen", "fill", "async", str(64 * MIB)],
    ["launch", "200", "1"],
    ["fork", "alloc", "4096"],
    ["thread", "alloc", "4096"],
]


def _env(tmp: Path, lib_dir: Path) -> dict[str, str]:
    env = sim_env(tmp)
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    env["TESSERA_MEMORY_LIMIT"] = "256Mi"
    env["TESSERA_CORE_RATE"] = "2000"
    env["TESSERA_LEDGER"] = str(tmp / "ledger")
    return env


def test_asan_ubsan(hook_built: None, tmp_path: Path) -> None:
    subprocess.run(
        ["make", "-s", "-C", str(HOOK), f"PYTHON={sys.executable}", "sanitize"], check=True
    )
    asan = subprocess.run(
        ["gcc", "-print-file-name=libasan.so"], capture_output=True, text=True, check=True
    ).stdout.strip()
    san_sim = SIM_LIB.parent / "san" / "lib"
    env = _env(tmp_path, san_sim if (san_sim / "libcuda.so.1").exists() else SIM_LIB)
    env["LD_PRELOAD"] = f"{asan} {BUILD / 'asan' / 'libtessera.so'}"
    env["ASAN_OPTIONS"] = "detect_leaks=1:abort_on_error=0:exitcode=23"
    env["UBSAN_OPTIONS"] = "halt_on_error=1:exitcode=24"
    for op in OPS:
        r = subprocess.run(
            [str(BUILD / "asan" / "bin" / "tprobe"), *op],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert r.returncode == 0, f"{op}: rc={r.returncode}\n{r.stderr[-3000:]}"
        assert "ERROR: AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr


def test_valgrind_memcheck(hook_built: None, tmp_path: Path) -> None:
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind not installed (make sysdeps, or apt-get install valgrind)")
    env = _env(tmp_path, SIM_LIB)
    env["LD_PRELOAD"] = str(BUILD / "libtessera.so")
    for op in OPS[:4] + OPS[6:7]:
        r = subprocess.run(
            [
                "valgrind",
                "-q",
                "--error-exitcode=9",
                "--leak-check=full",
                "--errors-for-leak-kinds=definite",
                str(BUILD / "bin" / "tprobe"),
                *op,
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert r.returncode == 0, f"{op}: rc={r.returncode}\n{r.stderr[-3000:]}"


def _libfuzzer_missing() -> str | None:
    if shutil.which("clang") is None:
        return "clang not installed (apt-get install clang libclang-rt-14-dev)"
    probe = subprocess.run(
        ["clang", "-print-file-name=libclang_rt.fuzzer-x86_64.a"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    if not probe or not os.path.isabs(probe) or not Path(probe).exists():
        return "libFuzzer runtime missing (apt-get install libclang-rt-14-dev)"
    return None


@pytest.mark.parametrize("target", ["budget", "env", "ledger"])
def test_fuzz_seeded(target: str, tmp_path: Path) -> None:
    why = _libfuzzer_missing()
    if why:
        pytest.fail(why)
    subprocess.run(["make", "-s", "-C", str(HOOK), f"PYTHON={sys.executable}", "fuzz"], check=True)
    r = subprocess.run(
        [
            str(BUILD / "fuzz" / f"fuzz_{target}"),
            f"-runs={RUNS}",
            "-seed=1",
            f"-artifact_prefix={tmp_path}/",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"Done {RUNS} runs" in r.stderr


def test_first_use_cost_is_flat_across_processes(hook_built: None, tmp_path: Path) -> None:
    """What the library costs a process end to end (loading, driver entry points, budget,
    joining the ledger, first context and allocation) does not grow with the number of live
    processes in the container: no join-time sweep, no per-process scan (callgrind)."""
    if shutil.which("valgrind") is None:
        pytest.fail("valgrind not installed (make sysdeps, or apt-get install valgrind)")
    spec = importlib.util.spec_from_file_location("bench_hook", ROOT / "bench" / "hook.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    cost = bench.first_use(tmp_path, (2, 30))
    assert 0 < cost[30] <= 1.02 * cost[2], cost
    assert cost[2] < 400_000, cost  # hook/README.md: ~170k
