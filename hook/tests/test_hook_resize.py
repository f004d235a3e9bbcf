"""Live resize on the node: the daemon's decision (tessera_node.deviceplugin.resize) and the
budget file it rewrites, obeyed by a process that keeps running in a test container."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from tessera_hook_harness import GIB, GPU_UUID, MIB, Container

from tessera.api.budget import BudgetAnnotation, PerShareBudget
from tessera.api.names import ANNOTATION_BUDGET, ANNOTATION_BUDGET_RESIZE
from tessera.api.resize import ResizeStatus
from tessera_node.budget.writer import BudgetWriter
from tessera_node.deviceplugin.budgets import container_budget, entries
from tessera_node.deviceplugin.resize import commitments, decide

CLIENT = Path(__file__).with_name("resize_client.py")
GPU_MEMORY = 80 * GIB


def annotations(memory_mib: int, cores: int, state: str = "Approved") -> dict[str, str]:
    budget = BudgetAnnotation(containers={"main": PerShareBudget.from_totals(1, memory_mib, cores)})
    return {ANNOTATION_BUDGET: budget.to_annotation(),
            ANNOTATION_BUDGET_RESIZE: ResizeStatus("r1", state).to_annotation()}  # type: ignore[arg-type]


class Client:
    def __init__(self, c: Container) -> None:
        self.p = c.popen([sys.executable, str(CLIENT)], stdin=subprocess.PIPE)
        assert self.ask_line() == "ready", self.p.stderr.read() if self.p.stderr else ""

    def ask_line(self) -> str:
        assert self.p.stdout is not None
        return self.p.stdout.readline().strip()

    def ask(self, cmd: str) -> str:
        assert self.p.stdin is not None
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()
        return self.ask_line()

    def close(self) -> None:
        self.p.kill()
        self.p.wait()


def test_grow_shrink_and_refused_for_gpu_memory(hook_built: None, tmp_path: Path) -> None:
    writer = BudgetWriter(tmp_path, pending_wait_ms=0)
    c = Container(tmp_path, "main")  # its budget file is the writer's for key "main"
    assert c.budget_path == writer.budget_path("main")
    units = [GPU_UUID]
    admitted = annotations(1024, 30, "Applied")
    first = entries(container_budget(admitted, "main"), units, False, {})
    writer.ready("main", first)
    client = Client(c)
    try:
        assert client.ask("alloc 768") == "ok"
        assert client.ask("alloc 512") == "err 2"  # over 1 GiB: CUDA_ERROR_OUT_OF_MEMORY

        # grow to 2 GiB beside 40 GiB committed to others on this 80 GiB GPU: applied; the
        # running process's very next allocation obeys the new budget
        others = {GPU_UUID: [40 * GIB]}
        out = decide(annotations(2048, 40), "main", units, writer.read("main").entries,
                     {GPU_UUID: GPU_MEMORY}, others)
        assert out is not None and out.applied and out.entries is not None, out
        t0 = time.monotonic()
        writer.ready("main", list(out.entries))  # what the daemon does on Applied
        assert client.ask("alloc 512") == "ok"
        obeyed = time.monotonic() - t0
        assert obeyed < 1.0, obeyed  # one round trip to the process; no restart, no poll
        e = writer.read("main").entries[0]
        assert e.memory == 2 * GIB and e.cores == 40 and e.uuid == GPU_UUID
        assert ResizeStatus.parse(out.annotation_patch()[ANNOTATION_BUDGET_RESIZE]) == \
            ResizeStatus("r1", "Applied")

        # the controller's rate is kept across a resize (it owns rate and burst)
        writer.ready("main", [e.__class__(**{**e.__dict__, "rate": 1234.0, "burst": 12.0})])
        out = decide(annotations(512, 20), "main", units, writer.read("main").entries,
                     {GPU_UUID: GPU_MEMORY}, others)
        assert out is not None and out.applied
        assert out.entries is not None and out.entries[0].rate == 1234.0
        # shrink to 512 MiB below the 1,280 MiB held: allocations kept, new ones refused
        writer.ready("main", list(out.entries))
        assert c.read_ledger().live_bytes(0) == 1280 * MIB  # kept
        assert client.ask("used") == f"used {512 * MIB}"  # the view clamps used to the budget
        assert client.ask("alloc 1") == "err 2"
        assert client.ask("free") == "ok"  # 768 MiB held: still over 512
        assert client.ask("alloc 1") == "err 2"
        assert client.ask("free") == "ok"  # nothing held: under again
        assert client.ask("alloc 256") == "ok"

        # refused for GPU memory: 48 GiB beside 40 GiB on an 80 GiB GPU (the daemon writes
        # nothing then: tests/deviceplugin/test_deviceplugin_resize.py)
        before = writer.read("main")
        out = decide(annotations(48 * 1024, 40), "main", units, before.entries,
                     {GPU_UUID: GPU_MEMORY}, others)
        assert out is not None and not out.applied
        assert out.status.state == "Refused"
        assert out.status.reason.startswith(f"on this node: memory budgets on {GPU_UUID} "
                                            "would exceed its 81920 MiB"), out.status.reason
        assert out.entries is None
        assert client.ask("alloc 300") == "err 2"  # still the 512 MiB budget
    finally:
        client.close()
        c.budget.close()


def test_nothing_to_decide_without_an_approved_request() -> None:
    for state in ("Applied", "Refused"):
        assert decide(annotations(1024, 30, state), "main", [GPU_UUID], [],
                      {GPU_UUID: GPU_MEMORY}, {}) is None
    assert decide({}, "main", [GPU_UUID], [], {GPU_UUID: GPU_MEMORY}, {}) is None
    # an approved budget without this container is refused, with the reason
    out = decide(annotations(1024, 30), "other", [GPU_UUID], [], {GPU_UUID: GPU_MEMORY}, {})
    assert out is not None and out.status.state == "Refused"
    assert "no budget for container other" in out.status.reason
    assert json.loads(commitments({GPU_UUID: GPU_MEMORY}, {GPU_UUID: [GIB, 2 * GIB]})) == {
        GPU_UUID: {"committed": 3 * GIB, "containers": 2, "memory": GPU_MEMORY}}
