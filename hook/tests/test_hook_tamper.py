"""What a container can do to the files libtessera reads, and what the library does then
(hook/README.md, "Threat model"). The ledger is the node daemon's (created before any
process, named by the budget file, mounted as a file of its own), as the device plugin sets
a container up: a container can write and truncate it, never replace it; a process that
replaced it in a mount namespace of its own, or a budget file of its own, is what the
daemon's audit catches (docs/node-daemon.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tessera_hook_harness import GIB, MIB, PROBE, ROOT, Container

from tessera_node.budget.ledger import DEV_OFFSET, FILE_SIZE, HEADER_SIZE, create_ledger

CUDA_ERROR_OUT_OF_MEMORY = 2
TJOIN = PROBE.parent / "tjoin"


@pytest.fixture
def plugged(hook_built: None, tmp_path: Path) -> Container:
    """A container as the device plugin sets it up: the daemon's ledger, the marker."""
    c = Container(tmp_path, "c1")
    c.managed = True
    c.daemon_ledger()
    c.set_simple()
    return c


def no_memory(c: Container, why: str) -> None:
    """A new process gets no device memory (not even a context), saying why once."""
    r = c.run([str(PROBE), "fill", "alloc", str(64 * MIB)])
    out = r.stdout.splitlines()
    got = [json.loads(x) for x in out if x.startswith("{")]
    assert got and (got[-1].get("got") == 0 or got[-1].get("err") == CUDA_ERROR_OUT_OF_MEMORY), r
    assert why in r.stderr, r.stderr


class Repl:
    """One long-lived process of the container (tprobe repl)."""

    def __init__(self, c: Container) -> None:
        self.p = c.popen([str(PROBE), "repl"], stdin=subprocess.PIPE)
        assert self.say("") == "ready"

    def say(self, line: str) -> str:
        assert self.p.stdin is not None and self.p.stdout is not None
        if line:
            self.p.stdin.write(line + "\n")
            self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def alloc(self, n: int) -> int:
        out: int = json.loads(self.say(f"alloc alloc {n}"))["err"]
        return out

    def close(self) -> tuple[int, str]:
        assert self.p.stdin is not None and self.p.stderr is not None
        self.p.stdin.close()
        rc = self.p.wait(timeout=30)
        return rc, self.p.stderr.read()


def test_the_daemons_ledger_is_used_and_no_other_file(plugged: Container) -> None:
    r = plugged.probe("fill", "alloc", str(64 * MIB))
    assert r["got"] == GIB
    assert plugged.read_ledger().devices[0].used == 0  # all given back
    # a ledger of the container's own in its place (only a process with a mount namespace
    # of its own can put one there): refused, not joined
    other = plugged.dir / "other-ledger"
    create_ledger(other)
    plugged.ledger.rename(plugged.dir / "kept")
    other.rename(plugged.ledger)
    no_memory(plugged, "not the one the node daemon created")


def test_a_header_wiped_under_running_processes_gives_them_nothing(
        plugged: Container) -> None:
    p = Repl(plugged)
    assert p.alloc(100 * MIB) == 0
    with plugged.ledger.open("r+b") as f:
        f.write(bytes(HEADER_SIZE))
    assert p.alloc(MIB) == CUDA_ERROR_OUT_OF_MEMORY
    assert json.loads(p.say("free")) == {"freed": 1}
    rc, err = p.close()
    assert rc == 0 and "unusable" in err, err


@pytest.mark.parametrize("damage", ["truncate", "zero-header", "grow"])
def test_a_damaged_ledger_gives_a_new_process_nothing(plugged: Container, damage: str) -> None:
    assert plugged.probe("alloc", "alloc", str(MIB))["err"] == 0
    if damage == "truncate":
        os.truncate(plugged.ledger, 0)  # `: > /run/tessera/ledger`
        why = "wrong size"
    elif damage == "grow":
        os.truncate(plugged.ledger, FILE_SIZE + 4096)
        why = "wrong size"
    else:
        with plugged.ledger.open("r+b") as f:
            f.write(bytes(HEADER_SIZE))
        why = "bad magic"
    no_memory(plugged, why)


def test_a_ledger_truncated_under_a_running_process_costs_it_nothing_but_new_memory(
        plugged: Container) -> None:
    """The process had the ledger mapped: the next access would have been SIGBUS. It goes on
    (the allocation that met the truncation still held to the budget by what the process
    holds itself), launches (throttled by a bucket of its own), frees what it held, and gets
    no new memory."""
    p = Repl(plugged)
    assert p.alloc(300 * MIB) == 0
    os.truncate(plugged.ledger, 0)
    assert p.alloc(800 * MIB) == CUDA_ERROR_OUT_OF_MEMORY  # 300 + 800 > 1024
    assert p.alloc(MIB) == CUDA_ERROR_OUT_OF_MEMORY  # the ledger is lost
    assert "secs" in p.say("launch 100")
    assert json.loads(p.say("free")) == {"freed": 1}
    assert p.alloc(MIB) == CUDA_ERROR_OUT_OF_MEMORY
    rc, err = p.close()
    assert rc == 0, err
    assert err.count("truncated under this process") == 1, err


def test_zeroed_counts_do_not_give_running_processes_their_budget_again(
        plugged: Container) -> None:
    """The container zeroes the shared counts in place (the header intact). A running process
    knows what it holds itself: a shared count below that is a ledger written from inside,
    and it gets no new memory (each would otherwise take the budget again beside the
    others). A process that joins afterwards holds nothing and cannot tell: it gets up to
    the budget beside them, which is the audit's case (docs/node-daemon.md, "Audit")."""
    a, b = Repl(plugged), Repl(plugged)
    assert a.alloc(600 * MIB) == 0 and b.alloc(300 * MIB) == 0
    with plugged.ledger.open("r+b") as f:
        f.seek(DEV_OFFSET)
        f.write(bytes(1024))  # every device's used, tokens, ...
        for i in range(1024):
            f.seek(HEADER_SIZE + i * 256 + 16)
            f.write(bytes(128))  # every slot's bytes
    assert a.alloc(100 * MIB) == CUDA_ERROR_OUT_OF_MEMORY
    assert b.alloc(100 * MIB) == CUDA_ERROR_OUT_OF_MEMORY
    assert '"free": 444596224' in a.say("info")  # it still holds its 600 MiB of 1 GiB
    late = plugged.probe("fill", "alloc", str(64 * MIB))
    assert late["got"] == GIB  # a second budget only the node can see
    for p in (a, b):
        rc, err = p.close()
        assert rc == 0 and err.count("unusable") == 1, err


def test_a_lock_word_the_container_wrote_is_never_a_hang(plugged: Container) -> None:
    """The lock word names a live process that never lets go: allocations are refused after
    a few seconds, never a hang."""
    j = plugged.popen([str(TJOIN), "/run/tessera/ledger", "60"])
    try:
        assert (j.stdout.readline() if j.stdout else "").startswith("joined")
        slot = next(s for s in plugged.read_ledger().slots if s.pid == j.pid)
        gen = int.from_bytes(plugged.ledger.read_bytes()[HEADER_SIZE + slot.index * 256 + 4:
                                                          HEADER_SIZE + slot.index * 256 + 8],
                             "little")
        with plugged.ledger.open("r+b") as f:
            f.seek(64)
            f.write((((slot.index + 1) << 32) | gen).to_bytes(8, "little"))
        t0 = time.monotonic()
        r = plugged.run([str(PROBE), "alloc", "alloc", str(MIB)], timeout=30)
        assert '"err": 2' in r.stdout or r.returncode == 3, r
        assert time.monotonic() - t0 < 15
    finally:
        j.send_signal(signal.SIGKILL)
        j.wait()


def test_a_writable_or_misshapen_budget_file_is_not_the_daemons(plugged: Container) -> None:
    plugged.budget_writable = True  # a file of one's own bind-mounted over it
    no_memory(plugged, "writable")
    plugged.budget_writable = False
    plugged.budget.close()
    os.truncate(plugged.budget_path, 8192)
    no_memory(plugged, "not the size of a budget file")


def test_loaded_from_the_plugins_path_the_library_never_runs_unbudgeted(
        hook_built: None, tmp_path: Path) -> None:
    """Something covers /run/tessera (no budget file, no marker): a library loaded from where
    the device plugin mounts it still refuses memory instead of passing everything through;
    the same library loaded from elsewhere, in a container tessera did not set up, is inert."""
    c = Container(tmp_path, "c1")
    c.mounted_budget = False
    assert c.probe("fill", "alloc", str(GIB))["got"] > 4 * GIB  # inert: not tessera's container
    c.lib_at_plugin_path = True
    no_memory(c, "budget file /run/tessera/budget missing")


def test_fuzz_the_ledger_under_the_sanitizers(hook_built: None, tmp_path: Path) -> None:
    """The ASan/UBSan library in a process allocating and freeing without pause while a second
    process truncates, grows and writes garbage into its ledger (what a container can do to
    a ledger mounted as a file), then new processes while any file at all is put in its place
    (the legacy directory mount): no crash, no sanitizer report, refusals only."""
    seconds = float(os.environ.get("TESSERA_LEDGER_FUZZ_S", "10"))
    subprocess.run(["make", "-s", "-C", str(ROOT / "hook"), f"PYTHON={sys.executable}",
                    "sanitize"], check=True)
    asan_rt = subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                             text=True, check=True).stdout.strip()
    asan = ROOT / "hook" / "build" / "asan"
    fuzz = ROOT / "node-daemon" / "tests" / "budget" / "ledger_fuzz.py"
    env = {"LD_PRELOAD": asan_rt,
           "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=0:exitcode=66"}
    c = Container(tmp_path, "c1", lib=asan / "libtessera.so")
    c.preload.write_text(f"{asan_rt}\n{asan / 'libtessera.so'}\n")
    c.managed = True
    c.daemon_ledger()
    c.set_simple()
    mutator = subprocess.Popen([sys.executable, str(fuzz), "mutate", str(c.ledger),
                                str(seconds), "27", "--in-place"], stdout=subprocess.PIPE,
                               text=True)
    runs = {"processes": 0, "lost": 0, "ok": 0, "refused": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:  # processes of half a second, one after the other
        churn = c.run([str(asan / "bin" / "tprobe"), "churn", "alloc", str(MIB), "0.5"],
                      env=env, timeout=60)
        assert churn.returncode == 0, (churn.returncode, churn.stderr[-3000:])
        assert "AddressSanitizer" not in churn.stderr and "runtime error" not in churn.stderr
        counts = json.loads(churn.stdout.strip().splitlines()[-1])
        runs["processes"] += 1
        runs["lost"] += "truncated under this process" in churn.stderr
        runs["ok"] += counts["ok"]
        runs["refused"] += counts["refused"]
    damage, _ = mutator.communicate(timeout=60)
    print(f"\n[figures] libtessera (ASan) {seconds:g}s beside in-place damage "
          f"{damage.strip()}: {runs}")
    assert runs["ok"] > 0 and runs["lost"] > 0, runs
    # new processes, any file in the ledger's place (the legacy mount of its directory)
    legacy = Container(tmp_path, "c2", lib=asan / "libtessera.so")
    legacy.preload.write_text(f"{asan_rt}\n{asan / 'libtessera.so'}\n")
    legacy.set_simple()
    mutator = subprocess.Popen([sys.executable, str(fuzz), "mutate", str(legacy.ledger),
                                str(seconds), "28"], stdout=subprocess.PIPE, text=True)
    runs = {"ok": 0, "refused": 0}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        r = legacy.run([str(asan / "bin" / "tprobe"), "alloc", "alloc", str(MIB)], env=env,
                       timeout=60)
        assert r.returncode in (0, 3), (r.returncode, r.stderr[-3000:])
        assert "AddressSanitizer" not in r.stderr and "runtime error" not in r.stderr, r.stderr
        runs["ok" if '"err": 0' in r.stdout else "refused"] += 1
    mutator.communicate(timeout=60)
    print(f"[figures] new processes beside any damage: {runs}")
    assert runs["ok"] + runs["refused"] > 0
