"""Test "containers" for libtessera: each process runs in a private mount namespace
(`unshare -m`) with the container's budget file and /etc/ld.so.preload bind-mounted
read-only and its ledger directory at /run/tessera, as the device plugin mounts them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HOOK = ROOT / "hook"
BUILD = HOOK / "build"
LIB = BUILD / "libtessera.so"
PROBE = BUILD / "bin" / "tprobe"
TRT = BUILD / "bin" / "trt"
SIM_LIB = ROOT / "sim" / "build" / "lib"
sys.path[:0] = [str(ROOT / "node-daemon"), str(ROOT / "sim")]

from tessera_node.budget.formats import BudgetEntry, BudgetFile  # noqa: E402
from tessera_node.budget.ledger import LedgerView, create_ledger, read_ledger  # noqa: E402
from tessera_node.container.response import CONTAINER_LIB_DIR, LIB_NAME  # noqa: E402
from tessera_sim.node import GPUSpec, node_description  # noqa: E402

PLUGIN_LIB = Path(CONTAINER_LIB_DIR) / LIB_NAME  # where the device plugin mounts the library
GIB = 1 << 30
MIB = 1 << 20
GPU_UUID = "GPU-11111111-2222-3333-4444-555555555555"


def node_text(ns_per_block: int = 1000, context_mib: int = 0) -> str:
    """One simulated H100, described from the model table by the simulator's own writer."""
    return node_description([GPUSpec("H100-80GB", uuid=GPU_UUID)],
                            default_ns_per_block=ns_per_block, context_mib=context_mib)


def missing_prerequisite() -> str | None:
    if not (SIM_LIB / "libcuda.so.1").exists():
        return "simulator not built (make -C sim): sim/build/lib/libcuda.so.1 missing"
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return "needs root and unshare(1) for private mount namespaces"
    return None


def ready_for_bench() -> bool:
    """A benchmark's setup: prerequisites checked (one stderr line when missing), the
    library built, the host's mount points there."""
    why = missing_prerequisite()
    if why:
        print(f"cannot run: {why}", file=sys.stderr)
        return False
    build()
    prepare_host_mountpoints()
    return True


def build() -> None:
    py = sys.executable
    subprocess.run(["make", "-s", "-C", str(HOOK), f"PYTHON={py}"], check=True)


def sim_env(tmp: Path) -> dict[str, str]:
    node = tmp / "node.ini"
    if not node.exists():
        node.write_text(node_text())
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TESSERA_", "LD_PRELOAD", "CUDA_"))
    }
    env["TESSERA_SIM_NODE"] = str(node)
    env["TESSERA_SIM_STATE"] = str(tmp / "node.state")
    env["LD_LIBRARY_PATH"] = str(SIM_LIB)
    return env


class Container:
    """One container: a budget file (written by us, the daemon) and a ledger directory."""

    def __init__(self, tmp: Path, name: str, lib: Path = LIB) -> None:
        self.dir = tmp / name
        self.rundir = self.dir / "run"
        self.rundir.mkdir(parents=True, exist_ok=True)
        self.budget_path = self.dir / "budget"
        self.preload = self.dir / "ld.so.preload"
        self.preload.write_text(f"{lib}\n")
        self.budget = BudgetFile(self.budget_path)
        self.env = sim_env(tmp)
        self.mounted_budget = True
        self.managed = False  # mount the device plugin's marker (a container tessera set up)
        self.marker = self.dir / "managed"
        self.marker.touch()
        self.as_plugin = False  # the files alone, as the device plugin mounts them
        self.budget_writable = False
        self.lib = lib
        self.lib_at_plugin_path = False  # the library mounted where the device plugin puts it

    def daemon_ledger(self) -> tuple[int, int]:
        """The ledger as the node daemon makes it: created before any process, named by the
        budget file (its device and inode), mounted as a file of its own."""
        self.ledger.unlink(missing_ok=True)
        ident = create_ledger(self.ledger)
        self.budget.ledger = ident
        self.as_plugin = True
        return ident

    def set(self, *entries: BudgetEntry) -> int:
        return self.budget.update(list(entries))

    def set_simple(
        self, memory: int | None = GIB, cores: float | None = None, rate: float = 0.0
    ) -> int:
        burst = max(1.0, rate / 20)
        return self.set(BudgetEntry(index=0, memory=memory, cores=cores, rate=rate, burst=burst))

    @property
    def ledger(self) -> Path:
        return self.rundir / "ledger"

    def read_ledger(self) -> LedgerView:
        return read_ledger(self.ledger)

    def argv(self, args: list[str]) -> list[str]:
        budget_ro = "" if self.budget_writable else "-o ro "
        if self.as_plugin:
            # a directory of the container's own with the files mounted one by one
            mounts = ("mount -t tmpfs tessera /run/tessera; "
                      "touch /run/tessera/ledger /run/tessera/budget /run/tessera/managed; "
                      f"mount --bind {self.ledger} /run/tessera/ledger; ")
        else:
            target = self.rundir / "budget"  # bind-mount target inside the ledger directory
            if self.mounted_budget:
                target.touch()
            elif target.exists():
                target.unlink()
            marker = self.rundir / "managed"
            if self.managed:
                marker.touch()
            elif marker.exists():
                marker.unlink()
            mounts = f"mount --bind {self.rundir} /run/tessera; "
        if self.as_plugin and not self.mounted_budget:
            mounts += "rm /run/tessera/budget; "
        if self.as_plugin and not self.managed:
            mounts += "rm /run/tessera/managed; "
        lib = ""
        if self.lib_at_plugin_path:
            self.preload.write_text(f"{PLUGIN_LIB}\n")
            lib = (f"mount -t tmpfs tessera {PLUGIN_LIB.parent}; touch {PLUGIN_LIB}; "
                   f"mount --bind -o ro {self.lib} {PLUGIN_LIB}; ")
        script = (
            "set -e; mount --make-rprivate /; "
            + mounts
            + (
                f"mount --bind {budget_ro}{self.budget_path} /run/tessera/budget; "
                if self.mounted_budget
                else ""
            )
            + (
                f"mount --bind -o ro {self.marker} /run/tessera/managed; "
                if self.managed
                else ""
            )
            + lib
            + f"mount --bind -o ro {self.preload} /etc/ld.so.preload; "
            'exec "$@"'
        )
        return ["unshare", "-m", "sh", "-c", script, "sh", *args]

    def popen(
        self, args: list[str], env: dict[str, str] | None = None, **kw: object
    ) -> subprocess.Popen[str]:
        e = dict(self.env)
        e.update(env or {})
        return subprocess.Popen(  # type: ignore[call-overload, no-any-return]
            self.argv(args), env=e, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kw
        )

    def run(
        self, args: list[str], env: dict[str, str] | None = None, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        e = dict(self.env)
        e.update(env or {})
        return subprocess.run(
            self.argv(args), env=e, text=True, capture_output=True, timeout=timeout, check=False
        )

    def probe(
        self, *args: str, env: dict[str, str] | None = None, timeout: float = 60
    ) -> dict[str, int]:
        r = self.run([str(PROBE), *args], env=env, timeout=timeout)
        lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
        assert r.returncode == 0 and lines, (
            f"probe {args} failed: rc={r.returncode} {r.stdout} {r.stderr}"
        )
        out: dict[str, int] = json.loads(lines[-1])
        out["_stderr"] = r.stderr  # type: ignore[assignment]
        return out


def prepare_host_mountpoints() -> None:
    Path("/run/tessera").mkdir(parents=True, exist_ok=True)
    PLUGIN_LIB.parent.mkdir(parents=True, exist_ok=True)  # an empty mount point
    pre = Path("/etc/ld.so.preload")
    if not pre.exists():
        pre.touch()  # an empty file preloads nothing; it is only a bind-mount target


def iter_methods() -> Iterator[str]:
    yield from ("direct", "dlsym", "dlvsym", "next", "default", "dlmopen", "libc")
    for kind in ("gpa", "gpa1", "nest"):
        for ver in (3020, 4000, 11020, 12000, 12090):
            for flags in (0, 1, 2):
                yield f"{kind}:{ver}:{flags}"


def trt(c: Container, *args: str, timeout: float = 60) -> dict[str, Any]:
    """The runtime-API program ``trt`` (tests/c/trt.c) run in container ``c``: its last JSON
    line, after asserting it exited 0."""
    r = c.run([str(TRT), *args], timeout=timeout)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and lines, f"trt {args}: rc={r.returncode} {r.stdout} {r.stderr}"
    out: dict[str, Any] = json.loads(lines[-1])
    return out
