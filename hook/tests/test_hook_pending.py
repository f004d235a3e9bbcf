"""Fail closed: a container tessera set up never runs unbudgeted.

The device plugin creates each container's budget file *pending* at Allocate time; the
daemon (here: the test, as a writer that is slow on purpose) rewrites it once it knows the
pod. libtessera waits for it, a bounded time, on the first GPU call. Also: a refused budget,
a missing budget file under tessera's marker, and the format's version-skew rule."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import threading
import time
from pathlib import Path

from tessera_hook_harness import GIB, MIB, PROBE, ROOT, Container

from tessera_node.budget.formats import BudgetFile

CUDA_ERROR_OUT_OF_MEMORY = 2
NOT_READY = "budget not ready after"
# The last commit whose hook predates the budget file's state flags: "the old hook".
OLD_HOOK_COMMIT = "59194df"


def lines_with(stderr: str, text: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if text in ln]


def test_pending_budget_that_becomes_ready_in_time(container: Container) -> None:
    """A daemon slow to write (0.8 s): the first GPU call waits, then the budget holds."""
    container.managed = True
    container.budget.set_pending(20_000)
    timer = threading.Timer(0.8, container.set_simple, kwargs={"memory": 512 * MIB})
    t0 = time.monotonic()
    timer.start()
    try:
        r = container.probe("fill", "alloc", str(64 * MIB))
    finally:
        timer.cancel()
    assert time.monotonic() - t0 >= 0.8
    assert r["got"] == 512 * MIB and r["err"] == CUDA_ERROR_OUT_OF_MEMORY
    assert not lines_with(r["_stderr"], NOT_READY), r["_stderr"]  # type: ignore[arg-type]


def test_pending_budget_that_times_out_refuses_memory_until_ready(container: Container) -> None:
    """Pending past its wait: one clear stderr line, no device memory; a budget written later
    is obeyed at the next allocation."""
    container.managed = True
    container.budget.set_pending(300)
    p = container.popen([str(PROBE), "repl"], stdin=subprocess.PIPE)
    assert p.stdout and p.stdin and p.stderr
    assert p.stdout.readline().strip() == "ready"
    p.stdin.write(f"alloc alloc {64 * MIB}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == '{"err": 2}'
    container.set_simple(memory=GIB)
    p.stdin.write(f"alloc alloc {64 * MIB}\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == '{"err": 0}'
    p.stdin.close()
    p.wait(timeout=30)
    err = p.stderr.read()
    assert len(lines_with(err, NOT_READY)) == 1, err
    assert "after 300 ms" in err and "refusing GPU memory" in err


def test_refused_budget_refuses_memory_at_once_with_its_reason(container: Container) -> None:
    container.managed = True
    container.budget.set_refused("memory budgets on GPU-1 would exceed its 81559 MiB")
    t0 = time.monotonic()
    r = container.probe("fill", "alloc", str(64 * MIB))
    assert time.monotonic() - t0 < 15  # no pending wait
    assert r["got"] == 0 and r["err"] == CUDA_ERROR_OUT_OF_MEMORY
    lines = lines_with(r["_stderr"], "budget refused")  # type: ignore[arg-type]
    assert len(lines) == 1, r["_stderr"]
    assert "would exceed its 81559 MiB" in lines[0] and "refusing GPU memory" in lines[0]


def test_marker_without_budget_file_ignores_the_environment(container: Container) -> None:
    """Under tessera's marker a missing budget file is an error, not 'no budget': the
    environment fallback cannot grant memory there."""
    container.managed = True
    container.mounted_budget = False
    r = container.probe(
        "fill", "alloc", str(64 * MIB),
        env={"TESSERA_MEMORY_LIMIT": "512Mi", "TESSERA_LEDGER": str(container.dir / "l")},
    )
    assert r["got"] == 0 and r["err"] == CUDA_ERROR_OUT_OF_MEMORY
    assert len(lines_with(r["_stderr"], "set up by tessera")) == 1  # type: ignore[arg-type]


def test_unknown_state_flag_from_a_newer_daemon_refuses_memory(container: Container) -> None:
    """Skew, new daemon + this hook: a header flag this hook does not know is malformed."""
    m = container.budget._map
    gen = int.from_bytes(m[8:16], "little")
    m[8:16] = (gen + 1).to_bytes(8, "little")
    m[28:32] = (0x4).to_bytes(4, "little")
    m[8:16] = (gen + 2).to_bytes(8, "little")
    r = container.probe("fill", "alloc", str(64 * MIB))
    assert r["got"] == 0 and "unknown header flags" in r["_stderr"]  # type: ignore[operator]


def old_hook(tmp: Path) -> Path:
    """libtessera as built before the budget file had states, from the repository history."""
    git = shutil.which("git")
    assert git, "needs git to build the old hook from the repository history"
    src = tmp / "oldsrc"
    src.mkdir()
    archive = subprocess.run(
        [git, "-C", str(ROOT), "archive", OLD_HOOK_COMMIT, "hook/src"],
        capture_output=True, check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive, check=True)
    site = Path(sysconfig.get_paths()["purelib"]) / "nvidia"
    cuda_inc, nvml_inc = site / "cuda_runtime" / "include", site / "nvml_dev" / "include"
    out = tmp / "old" / "libtessera.so"
    out.parent.mkdir()
    s = src / "hook" / "src"
    files = [str(s / f) for f in ("hook.c", "lookup.c", "mem.c", "pool.c", "ctx.c", "view.c",
                                  "launch.c", "budget.c", "ledger.c", "dlfcn_tramp.S")]
    subprocess.run(
        ["cc", "-std=gnu11", "-O2", f"-I{cuda_inc}", f"-I{nvml_inc}", f"-I{s}", "-fPIC",
         "-shared", "-fvisibility=hidden", "-o", str(out), *files, "-ldl", "-lpthread"],
        check=True,
    )
    return out


def test_old_hook_refuses_memory_under_pending_and_refused_budgets(
    hook_built: None, tmp_path: Path
) -> None:
    """Skew, this daemon + an old hook: pending and refused files name no device, so a hook
    that does not know the states refuses device memory (it cannot wait, it never grants)."""
    lib = old_hook(tmp_path)
    c = Container(tmp_path, "old", lib=lib)
    try:
        c.set_simple(memory=256 * MIB)
        assert c.probe("fill", "alloc", str(64 * MIB))["got"] == 256 * MIB  # old hook works
        for state in ("pending", "refused"):
            if state == "pending":
                c.budget.set_pending(5000)
            else:
                c.budget.set_refused("overcommitted")
            # not even a context: the old hook finds no device in the budget
            r = c.run([str(PROBE), "fill", "alloc", str(64 * MIB)])
            assert '"err": 2' in r.stdout and '"got"' not in r.stdout, (state, r.stdout)
            assert "device 0 is not in the budget" in r.stderr, (state, r.stderr)
    finally:
        c.budget.close()


def test_budget_written_by_an_old_daemon_is_ready(container: Container) -> None:
    """Skew, old daemon + this hook: an old writer's file has header flags 0 and a zero
    wait: it is a ready budget, in force at once."""
    path = container.dir / "oldbudget"
    with BudgetFile(path) as f:
        f.update([])
    raw = bytearray(path.read_bytes())
    assert raw[28:64] == bytes(36)  # what version-1 writers have always put there
    container.set_simple(memory=128 * MIB)
    assert container.budget.read().state == "ready"
    r = container.probe("fill", "alloc", str(64 * MIB))
    assert r["got"] == 128 * MIB
