"""The budget counts what a process really holds on the device: its contexts (a real H100
context costs hundreds of MiB; the simulated node charges ``context_mib`` for each) and the
memory a pool keeps reserved after frees, not only the bytes it asked for."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from tessera_hook_harness import MIB, PROBE, SIM_LIB, Container, node_text

from tessera_node.budget.formats import BudgetEntry
from tessera_node.device.context_probe import context_bytes

CTX_MIB = 100
OOM = 2


def driver_used_mib(c: Container) -> int:
    """The device's own figure (NVML, through the simulator's nvidia-smi): what is really
    held, whatever the library counted."""
    r = subprocess.run(
        [str(SIM_LIB.parent / "bin" / "nvidia-smi"), "--query-gpu=memory.used",
         "--format=csv,noheader,nounits"],
        env=c.env, capture_output=True, text=True, check=True,
    )
    return int(r.stdout.split()[0])


@pytest.fixture
def ctx_container(hook_built: None, tmp_path: Path) -> Container:
    """A container on a node whose contexts cost 100 MiB each, budget 512 MiB; the context
    figure in the budget is what the daemon's probe measures on the node."""
    (tmp_path / "node.ini").write_text(node_text(context_mib=CTX_MIB))
    c = Container(tmp_path, "ctx")
    uuid = "GPU-11111111-2222-3333-4444-555555555555"
    per_context = context_bytes(uuid, env=c.env)
    assert per_context == CTX_MIB * MIB
    c.set(BudgetEntry(uuid=uuid, memory=512 * MIB, context=per_context))
    return c


def test_ten_processes_cannot_exceed_the_budget_through_contexts(ctx_container: Container) -> None:
    c = ctx_container
    procs = [c.popen([str(PROBE), "hold", "alloc", "4096", "30"]) for _ in range(10)]
    try:
        first = [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]
        held = [o for o in first if o == "held"]
        refused = [o for o in first if '"fatal": "cuDevicePrimaryCtxRetain", "err": 2' in o]
        assert (len(held), len(refused)) == (5, 5), first  # 5 x 100 MiB fit in 512 MiB
        assert c.read_ledger().devices[0].used == 5 * (CTX_MIB * MIB + 4096)
        assert driver_used_mib(c) == 5 * CTX_MIB <= 512  # the device agrees
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert c.probe("fill", "alloc", str(64 * MIB))["got"] == 384 * MIB  # dead: all back


def test_a_context_counts_in_every_view(ctx_container: Container) -> None:
    r = ctx_container.probe("info")
    assert r["total"] == 512 * MIB and r["free"] == (512 - CTX_MIB) * MIB
    assert r["nvml_used"] == CTX_MIB * MIB
    assert ctx_container.probe("fill", "alloc", str(64 * MIB))["got"] == 384 * MIB


@pytest.mark.parametrize("method", ["direct", "dlsym", "gpa:4000:0", "gpa:11040:0", "gpa:12090:0",
                                    "nest:12090:0"])
def test_explicit_contexts_are_counted(ctx_container: Container, method: str) -> None:
    r = ctx_container.probe("-m", method, "ctxs", "10")
    assert (r["created"], r["err"]) == (4, OOM), r  # the primary one and 4 more: 500 MiB
    assert r["used"] == 5 * CTX_MIB * MIB
    assert r["used_after"] == CTX_MIB * MIB and r["destroy_failures"] == 0


@pytest.mark.parametrize("method", ["direct", "dlsym", "gpa:12090:0", "nest:12090:2"])
def test_primary_context_is_counted_once_while_it_lives(
    ctx_container: Container, method: str
) -> None:
    r = ctx_container.probe("-m", method, "primary")
    assert r["err"] == 0
    assert r["used"] == [CTX_MIB * MIB] * 5  # retained twice, released, re-created, reset


@pytest.mark.parametrize("kind", ["default", "pool"])
def test_pool_reserve_kept_after_frees_is_counted(container: Container, kind: str) -> None:
    """After cuMemFreeAsync the pool keeps the memory reserved (the device still holds it)
    until a synchronisation trims it (default pool) or cuMemPoolTrimTo does (a pool whose
    release threshold keeps everything)."""
    r = container.probe("poolkeep", str(600 * MIB), kind)
    assert r["async"] == 0 and r["free"] == 0, r
    assert r["while_kept"] == OOM, r  # 600 MiB kept + 600 MiB more > 1 GiB
    assert r["after_sync"] == (0 if kind == "default" else OOM), r
    assert r["trim"] == 0 and r["after_trim"] == 0, r
    assert container.read_ledger().devices[0].used == 0
