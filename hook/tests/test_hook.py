"""libtessera on the simulated GPU, each process in its own mount namespace."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
from tessera_hook_harness import (
    GIB,
    GPU_UUID,
    HOOK,
    LIB,
    MIB,
    PROBE,
    SIM_LIB,
    Container,
    iter_methods,
)

from tessera_node.budget.formats import BudgetEntry
from tessera_node.budget.ledger import LedgerReader, read_ledger
from tessera_sim.node import GPUSpec, node_description

PATHS = ["alloc", "pitch", "managed", "async", "pool", "vmm", "array", "array3d", "mipmap"]
CUDA_ERROR_OUT_OF_MEMORY = 2
CUDA_ERROR_INVALID_CONTEXT = 201
CUDA_ERROR_NOT_SUPPORTED = 801


def table() -> list[tuple[str, ...]]:
    rows = []
    for line in (HOOK / "src" / "hooks.def").read_text().splitlines():
        m = re.match(r"H\((\w+), (\w+), (\w+), (\d+), (\d), (\w+)\)", line)
        if m:
            rows.append(m.groups())
    return rows


def test_table_drives_exports(hook_built: None) -> None:
    rows = table()
    assert len(rows) >= 40
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(LIB)], capture_output=True, text=True, check=True
    ).stdout
    exported = {ln.split()[-1] for ln in out.splitlines() if " T " in ln}
    for row in rows:
        assert row[1] in exported, f"{row[1]} listed in hooks.def but not exported"
    hooked = {r[1] for r in rows} | {"dlsym", "dlvsym", "dlmopen"}
    extra = {s for s in exported if s.startswith(("cu", "nvml"))} - hooked
    assert not extra, f"exported but not in the table: {extra}"
    # the library knows nothing about the simulator
    assert not [s for s in exported if "sim" in s.lower()]
    undefined = subprocess.run(
        ["nm", "-D", "--undefined-only", str(LIB)], capture_output=True, text=True, check=True
    ).stdout
    assert "sim" not in undefined.lower()


@pytest.mark.parametrize("path", PATHS)
def test_each_allocation_path_is_held_to_budget(container: Container, path: str) -> None:
    r = container.probe("fill", path, str(64 * MIB))
    assert r["err"] == CUDA_ERROR_OUT_OF_MEMORY
    assert r["got"] == GIB
    assert r["free_failures"] == 0
    assert r["held_after"] == 0, "frees give every byte back (a pool's, once it is trimmed)"
    assert container.read_ledger().devices[0].oom >= 1
    assert container.probe("fill", path, str(64 * MIB))["got"] == GIB  # and again


@pytest.mark.parametrize("method", list(iter_methods()))
def test_bypass_lookup_paths(container: Container, method: str) -> None:
    r = container.probe("-m", method, "fill", "alloc", str(64 * MIB))
    if r["err"] == 500 and r["got"] == 0:  # CUDA_ERROR_NOT_FOUND: this lookup yields nothing
        return
    assert r["got"] <= GIB, f"{method} obtained {r['got']} bytes"
    assert r["got"] == GIB and r["err"] == CUDA_ERROR_OUT_OF_MEMORY


@pytest.mark.parametrize("method", ["gpa:12000:2", "gpa:11020:0", "nest:12090:2", "dlsym"])
@pytest.mark.parametrize("path", ["async", "pool", "vmm"])
def test_bypass_other_paths_through_lookups(container: Container, method: str, path: str) -> None:
    r = container.probe("-m", method, "fill", path, str(64 * MIB))
    assert r["got"] == GIB


def test_environment_cannot_raise_or_redirect(container: Container, tmp_path: Path) -> None:
    env = {
        "TESSERA_MEMORY_LIMIT": "1T",
        "TESSERA_LEDGER": str(tmp_path / "elsewhere"),
        "TESSERA_CORE_RATE": "1000000",
        "LD_PRELOAD": "",
    }
    r = container.probe("fill", "alloc", str(64 * MIB), env=env)
    assert r["got"] == GIB


def test_exec_with_scrubbed_environment(container: Container) -> None:
    r = container.probe("exec", "fill", "alloc", str(64 * MIB))
    assert r["got"] == GIB


def test_fork_child_shares_the_budget(container: Container) -> None:
    assert container.probe("fork", "alloc", str(2 * GIB))["err"] == CUDA_ERROR_OUT_OF_MEMORY
    assert container.probe("fork", "alloc", str(GIB // 2))["err"] == 0


def test_thread_without_context_is_refused(container: Container) -> None:
    assert container.probe("thread", "alloc", str(MIB))["err"] == CUDA_ERROR_INVALID_CONTEXT


def test_physical_memory_without_a_context_is_counted(container: Container) -> None:
    """cuMemCreate needs no current context (the driver's does not): a thread without one
    still gets VMM memory, and the budget holds it."""
    assert container.probe("thread", "vmm", str(512 * MIB))["err"] == 0
    assert container.probe("thread", "vmm", str(2 * GIB))["err"] == CUDA_ERROR_OUT_OF_MEMORY
    assert container.read_ledger().devices[0].used == 0


def test_processes_share_one_budget(container: Container) -> None:
    holders = [
        container.popen([str(PROBE), "hold", "alloc", str(300 * MIB), "3"]) for _ in range(8)
    ]
    outs = [h.stdout.readline().strip() for h in holders]  # type: ignore[union-attr]
    held = sum(o == "held" for o in outs)
    assert held == 3, outs  # 3 x 300 MiB fit in 1 GiB, a 4th does not: no overshoot
    led = container.read_ledger()
    assert led.devices[0].used == 3 * 300 * MIB
    assert (
        container.probe("alloc", "alloc", str(GIB - 900 * MIB + 1))["err"]
        == CUDA_ERROR_OUT_OF_MEMORY
    )
    assert container.probe("alloc", "alloc", str(GIB - 900 * MIB))["err"] == 0
    for h in holders:
        h.kill()
        h.wait()


def test_sigkill_at_random_moments_leaves_exact_accounting(container: Container) -> None:
    rng = random.Random(5)
    procs = []
    for i in range(10):
        if i % 3 == 0:
            procs.append(container.popen([str(PROBE), "hold", "alloc", str(100 * MIB), "30"]))
        else:
            procs.append(container.popen([str(PROBE), "churn", "alloc", str(64 * MIB), "30"]))
    for p in procs:
        p.stdout.readline()  # type: ignore[union-attr]
    survivors = []
    for i, p in enumerate(procs):
        time.sleep(rng.uniform(0.0, 0.05))
        if rng.random() < 0.7:
            p.send_signal(signal.SIGKILL)
            p.wait()
        else:
            survivors.append((i, p))
    # the dead are reaped by the next refused allocation; live holders keep their bytes.
    # The survivors are frozen for the count: a holder asleep with its bytes (SIGSTOP), a
    # churner at the point between two allocations where it holds nothing (SIGUSR1; a
    # SIGSTOP there could land inside the simulated driver's node-wide lock, which no other
    # process could take until it runs again)
    time.sleep(0.1)
    for i, p in survivors:
        if i % 3 == 0:
            p.send_signal(signal.SIGSTOP)
        else:
            p.send_signal(signal.SIGUSR1)
            assert p.stdout.readline().strip() == "paused"  # type: ignore[union-attr]
    led = container.read_ledger()
    live = led.live_bytes(0)
    r = container.probe("fill", "alloc", str(4 * MIB))
    assert r["got"] == GIB - live - (GIB - live) % (4 * MIB)
    led = container.read_ledger()
    assert led.devices[0].used == led.live_bytes(0)
    for _, p in survivors:
        p.send_signal(signal.SIGCONT)
        p.kill()
        p.wait()
    r = container.probe("fill", "alloc", str(64 * MIB))
    assert r["got"] == GIB
    assert container.read_ledger().devices[0].used == 0


def test_sigkill_while_waiting_for_tokens_hangs_nobody(container: Container) -> None:
    container.set_simple(memory=GIB, cores=10, rate=50)
    waiters = [container.popen([str(PROBE), "launch", "100000", "1"]) for _ in range(4)]
    time.sleep(0.5)
    for w in waiters[:3]:
        w.kill()
        w.wait()
    r = container.probe("launch", "20", "1", timeout=20)
    assert r["err"] == 0 and r["launches"] == 20
    waiters[3].kill()
    waiters[3].wait()


def test_live_budget_change_is_obeyed_at_the_next_check(container: Container) -> None:
    p = container.popen([str(PROBE), "repl"], stdin=subprocess.PIPE)
    assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]

    def ask(line: str) -> str:
        p.stdin.write(line + "\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        return p.stdout.readline().strip()  # type: ignore[union-attr]

    assert ask(f"alloc alloc {512 * MIB}") == '{"err": 0}'
    container.set_simple(memory=768 * MIB)
    assert ask(f"alloc alloc {512 * MIB}") == '{"err": 2}'
    container.set_simple(memory=2 * GIB)
    assert ask(f"alloc alloc {1024 * MIB}") == '{"err": 0}'
    info = ask("info")
    assert '"total": 2147483648' in info and '"free": 536870912' in info
    if "nvml_total" in info:
        assert '"nvml_total": 2147483648' in info and '"nvml_used": 1610612736' in info
        assert '"nvml2_total": 2147483648' in info and '"nvml2_free": 536870912' in info
    container.set_simple(memory=GIB)  # below what is held: views never underflow
    info = ask("info")
    assert '"total": 1073741824' in info and '"free": 0' in info
    ask("quit")
    p.wait(timeout=10)


def test_memory_views(container: Container) -> None:
    r = container.probe("info")
    assert r["total"] == GIB and r["free"] == GIB and r["device_total"] == GIB
    if "nvml_total" in r:
        assert r["nvml_total"] == GIB and r["nvml_used"] == 0
        assert r["nvml2_total"] == GIB and r["nvml2_free"] == GIB


def test_uuid_matched_entries(container: Container) -> None:
    container.set(BudgetEntry(uuid=GPU_UUID, memory=512 * MIB))
    assert container.probe("fill", "alloc", str(64 * MIB))["got"] == 512 * MIB
    container.set(BudgetEntry(uuid="GPU-99999999-2222-3333-4444-555555555555", memory=GIB))
    assert_no_memory_at_all(container)  # not our GPU


def assert_no_memory_at_all(c: Container) -> None:
    """A device the budget does not name gets no device memory, not even for a context."""
    r = c.run([str(PROBE), "fill", "alloc", str(64 * MIB)])
    assert r.returncode == 3 and '"fatal": "cuDevicePrimaryCtxRetain", "err": 2' in r.stdout, r
    assert "is not in the budget" in r.stderr


def test_entries_follow_the_uuid_not_the_containers_indices(hook_built: None,
                                                            tmp_path: Path) -> None:
    """In a container given only the node's second GPU (its device file alone, as the device
    plugin's sim visibility mounts it) that GPU is CUDA ordinal 0 and NVML index 0: the
    entry naming its UUID holds it; one naming the node's first GPU, whose index the
    container's GPU now has, holds nothing."""
    second = "GPU-22222222-2222-3333-4444-555555555555"
    (tmp_path / "node.ini").write_text(node_description(
        [GPUSpec("H100-80GB", uuid=GPU_UUID), GPUSpec("A100-40GB", uuid=second)]))
    c = Container(tmp_path, "second")
    dev = tmp_path / "container-dev"
    dev.mkdir()
    (dev / "nvidia1").touch()
    c.env["TESSERA_SIM_DEV"] = str(dev)
    c.set(BudgetEntry(uuid=second, memory=512 * MIB))
    r = c.probe("info")
    assert r["total"] == 512 * MIB and r["device_total"] == 512 * MIB, r
    assert r["nvml_total"] == 512 * MIB, r  # NVML index 0
    assert c.probe("fill", "alloc", str(64 * MIB))["got"] == 512 * MIB
    c.set(BudgetEntry(uuid=GPU_UUID, memory=512 * MIB))
    assert_no_memory_at_all(c)
    c.budget.close()


def test_mig_instance_entries(hook_built: None, tmp_path: Path) -> None:
    """A budget entry naming a MIG device (MIG- UUID, flagged as such in the file) holds a
    process on that MIG instance to its budget."""
    (tmp_path / "node.ini").write_text(
        node_description([GPUSpec("H100-80GB", mig=True, uuid=GPU_UUID)])
    )
    c = Container(tmp_path, "mig")
    smi = [str(SIM_LIB.parent / "bin" / "nvidia-smi")]
    assert subprocess.run([*smi, "mig", "-cgi", "1g.10gb", "-C"], env=c.env).returncode == 0
    listing = subprocess.run([*smi, "-L"], env=c.env, capture_output=True, text=True).stdout
    mig = re.findall(r"UUID: (MIG-[0-9a-f-]+)", listing)
    assert len(mig) == 1, listing
    c.env["CUDA_VISIBLE_DEVICES"] = mig[0]
    c.set(BudgetEntry(uuid=mig[0], memory=512 * MIB))
    assert c.budget.read().entries[0].uuid == mig[0]
    assert c.probe("fill", "alloc", str(64 * MIB))["got"] == 512 * MIB
    c.set(BudgetEntry(uuid=GPU_UUID, memory=512 * MIB))  # the GPU is not this MIG device
    assert_no_memory_at_all(c)
    c.budget.close()


@pytest.mark.parametrize(
    "content",
    [b"", b"garbage", b"TBDG" + bytes(60), bytes(4096)],
    ids=["empty", "short", "bad-version", "zeros"],
)
def test_malformed_budget_refuses_memory_without_crashing(
    container: Container, content: bytes
) -> None:
    container.budget.close()
    container.budget_path.unlink()
    container.budget_path.write_bytes(content)
    r = container.probe("fill", "alloc", str(64 * MIB))
    assert r["got"] == 0 and r["err"] == CUDA_ERROR_OUT_OF_MEMORY
    lines = [ln for ln in r["_stderr"].splitlines() if "budget file" in ln]  # type: ignore[attr-defined]
    assert len(lines) == 1, r["_stderr"]


def test_malformed_update_keeps_last_valid_budget(container: Container) -> None:
    p = container.popen([str(PROBE), "repl"], stdin=subprocess.PIPE)
    assert p.stdout.readline().strip() == "ready"  # type: ignore[union-attr]
    p.stdin.write(f"alloc alloc {256 * MIB}\n")  # type: ignore[union-attr]
    p.stdin.flush()  # type: ignore[union-attr]
    assert p.stdout.readline().strip() == '{"err": 0}'  # type: ignore[union-attr]
    # corrupt in place: bad version, even generation
    m = container.budget._map
    m[4:8] = (99).to_bytes(4, "little")
    m[8:16] = (1000).to_bytes(8, "little")
    for _ in range(2):
        p.stdin.write(f"alloc alloc {256 * MIB}\n")  # type: ignore[union-attr]
        p.stdin.flush()  # type: ignore[union-attr]
        assert p.stdout.readline().strip() == '{"err": 0}'  # type: ignore[union-attr]
    p.stdin.write(f"alloc alloc {GIB}\n")  # type: ignore[union-attr]
    p.stdin.flush()  # type: ignore[union-attr]
    assert p.stdout.readline().strip() == '{"err": 2}'  # type: ignore[union-attr]
    p.stdin.close()  # type: ignore[union-attr]
    p.wait(timeout=10)
    err = p.stderr.read()  # type: ignore[union-attr]
    assert err.count("malformed") == 1 and "last valid budget" in err


def test_env_fallback_without_budget_file(container: Container) -> None:
    container.mounted_budget = False
    r = container.probe(
        "fill",
        "alloc",
        str(64 * MIB),
        env={"TESSERA_MEMORY_LIMIT": "512Mi", "TESSERA_LEDGER": str(container.dir / "envledger")},
    )
    assert r["got"] == 512 * MIB
    r = container.probe("fill", "alloc", str(64 * MIB), env={"TESSERA_MEMORY_LIMIT": "lots"})
    assert r["got"] == 0 and "TESSERA_MEMORY_LIMIT" in r["_stderr"]  # type: ignore[operator]


def test_launches_spend_tokens_at_the_budget_rate(container: Container) -> None:
    container.set_simple(memory=GIB, cores=30, rate=200)
    r = container.probe("launch", "400", "1")
    assert r["err"] == 0
    # 400 launches (all four launch APIs) at 200/s with a 10-token bucket: ~1.95 s
    assert 1.7 < r["secs"] < 2.6, r
    led = container.read_ledger()
    assert led.devices[0].tokens >= 400
    dev = led.devices[0]
    assert dev.waits > 0 and sum(dev.wait_hist) == dev.waits
    assert 0 < dev.wait_quantile(0.99) <= 0.2  # no launch waited more than ~one batch
    container.set_simple(memory=GIB, cores=None)
    assert container.probe("launch", "400", "1")["secs"] < 0.5


def test_readme_lists_every_intercepted_symbol() -> None:
    text = (HOOK / "README.md").read_text()
    for row in table():
        assert f"`{row[1]}`" in text, f"{row[1]} missing from hook/README.md"


def test_holder_killed_inside_the_ledger_lock(container: Container) -> None:
    """A process SIGKILLed while holding the ledger lock, halfway through an update: the next
    process takes the lock over, recounts, and (once the dead slot is reaped) gets it all."""
    tjoin = str(PROBE.parent / "tjoin")
    assert container.probe("alloc", "alloc", str(MIB))["err"] == 0  # creates the ledger
    r = container.run([tjoin, "/run/tessera/ledger", "die", str(256 * MIB)])
    assert r.returncode == -signal.SIGKILL
    led = container.read_ledger()
    assert led.devices[0].used == 0 and any(s.bytes[0] == 256 * MIB for s in led.slots)
    r = container.probe("fill", "alloc", str(64 * MIB), timeout=30)
    assert r["got"] == GIB  # lock taken over, used recounted, dead slot reaped
    led = container.read_ledger()
    assert led.devices[0].used == 0 and not [s for s in led.slots if s.bytes[0]]


def test_a_reader_kept_open_sees_every_join_death_and_reap(container: Container) -> None:
    """The core controller keeps one LedgerReader per container and decodes the slot table
    again only when the library's slot-change counter moves: a process joining, dying and
    being reaped shows in it exactly as in a fresh read of the file."""
    tjoin = str(PROBE.parent / "tjoin")
    assert container.probe("alloc", "alloc", str(MIB))["err"] == 0  # creates the ledger
    kept = LedgerReader(container.ledger)

    def slots() -> list[tuple[int, int, bool, int, int]]:
        mine = [(s.index, s.pid, s.alive, s.start_ticks, s.pidns)
                for s in kept.read(only=0).slots]
        fresh = read_ledger(container.ledger, only=0).slots
        assert mine == [(s.index, s.pid, s.alive, s.start_ticks, s.pidns) for s in fresh]
        return mine

    before = slots()
    p = container.popen([tjoin, "/run/tessera/ledger", "30"])
    try:
        assert (p.stdout.readline() if p.stdout else "").startswith("joined")
        joined = [s for s in slots() if s[1] == p.pid]
        assert len(joined) == 1 and joined[0][2] and joined[0][3] > 0
        # the PID namespace it recorded is the one the host sees it in
        assert joined[0][4] == os.stat(f"/proc/{p.pid}/ns/pid").st_ino
    finally:
        p.kill()
        p.wait()
    assert next(s for s in slots() if s[1] == p.pid)[2] is False  # dead, not yet reaped
    assert container.probe("fill", "alloc", str(64 * MIB), timeout=30)["got"] == GIB  # reaps
    after = slots()
    assert p.pid not in [s[1] for s in after] and len(after) <= len(before) + 1


@pytest.mark.parametrize("round_", range(3))
def test_sigkill_rounds_during_alloc_and_free(container: Container, round_: int) -> None:
    rng = random.Random(100 + round_)
    procs = [
        container.popen([str(PROBE), "churn", path, str(32 * MIB), "30"])
        for path in ("alloc", "async", "vmm", "pitch", "array", "managed")
    ]
    for p in procs:
        p.stdout.readline()  # type: ignore[union-attr]
    for p in procs:
        time.sleep(rng.uniform(0.0, 0.03))
        p.send_signal(signal.SIGKILL)
        p.wait()
    r = container.probe("fill", "alloc", str(64 * MIB), timeout=30)
    assert r["got"] == GIB
    assert container.read_ledger().devices[0].used == 0


GRAPHDRV = HOOK / "build" / "graphdrv"  # libcuda.so.1 with graph memory nodes over the simulator
GRAPH_METHODS = ["direct", "dlsym", "dlvsym", "next", "default", "dlmopen", "libc"] + [
    f"{k}:{v}:{f}" for k in ("gpa", "gpa1", "nest") for v in (12020, 12090) for f in (0, 2)
]


@pytest.mark.parametrize("method", GRAPH_METHODS)
def test_graph_memory_nodes_refused_under_a_budget(container: Container, method: str) -> None:
    """Graph memory nodes get device memory the count never sees: refused (801, one stderr
    line per entry point) through every lookup path; other nodes and plain graphs still work."""
    container.env["LD_LIBRARY_PATH"] = f"{GRAPHDRV}:{SIM_LIB}"
    r = container.probe("-m", method, "graphmem", str(4 * GIB))
    assert r["alloc_node"] == CUDA_ERROR_NOT_SUPPORTED
    assert r["add_node"] == CUDA_ERROR_NOT_SUPPORTED
    assert r["add_node_v2"] == CUDA_ERROR_NOT_SUPPORTED
    assert r["add_kernel_node"] == 0, "non-memory nodes pass through"
    assert r["plain"] == 0, "a graph without memory nodes instantiates and launches"
    err = str(r["_stderr"])
    assert err.count("cuGraphAddMemAllocNode refused") == 1
    assert "cuGraphAddNode" in err and "MEM_ALLOC) refused" in err
    assert container.read_ledger().devices[0].used == 0


def test_graph_memory_nodes_pass_through_without_a_budget(container: Container) -> None:
    container.env["LD_LIBRARY_PATH"] = f"{GRAPHDRV}:{SIM_LIB}"
    container.mounted_budget = False
    r = container.probe("-m", "gpa:12090:0", "graphmem", str(GIB))
    assert r["alloc_node"] == r["add_node"] == r["add_node_v2"] == r["add_kernel_node"] == 0
    assert "refused" not in str(r["_stderr"])


def test_graph_memory_nodes_on_the_plain_simulator(container: Container) -> None:
    """The simulator has no graph memory nodes: linked directly, the hook still refuses;
    looked up, the driver has nothing to give; plain graphs work."""
    r = container.probe("graphmem", str(4 * GIB))
    assert r["alloc_node"] == CUDA_ERROR_NOT_SUPPORTED and r["plain"] == 0
    assert "cuGraphAddMemAllocNode refused" in str(r["_stderr"])
    r = container.probe("-m", "gpa:12090:0", "graphmem", str(4 * GIB))
    assert r["alloc_node"] in (500, CUDA_ERROR_NOT_SUPPORTED) and r["plain"] == 0
