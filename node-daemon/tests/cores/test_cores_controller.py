"""The controller's plumbing with a fake NVML: attribution through ledger PIDs, tokens
interpolated over the NVML window, rates written back in place."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tessera_node.budget.formats import BudgetEntry, BudgetFile
from tessera_node.budget.ledger import (
    DEV,
    DEV_OFFSET,
    FILE_SIZE,
    HEADER_SIZE,
    MAGIC,
    MAX_DEV,
    NSLOTS,
    SLOT_SIZE,
    VERSION,
)
from tessera_node.cores.controller import Controller, Tenant


def make_ledger(path: Path, pid: int, tokens: float, waits: int = 0) -> None:
    raw = bytearray(FILE_SIZE)
    struct.pack_into("<7I", raw, 0, MAGIC, VERSION, NSLOTS, MAX_DEV, HEADER_SIZE, SLOT_SIZE, 1)
    struct.pack_into(DEV.format, raw, DEV_OFFSET, 0, 0, int(tokens * 1000), 0, 0, waits, 0, 0)
    struct.pack_into("<iIQ", raw, HEADER_SIZE, pid, 1, 0)
    path.write_bytes(bytes(raw))


class FakeNvml:
    def __init__(self) -> None:
        self.busy: dict[int, float] = {}
        self.window: tuple[float, float] | None = None

    def sample(self) -> tuple[dict[int, float], tuple[float, float] | None]:
        return dict(self.busy), self.window


def one_tenant(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lend: bool = True
               ) -> tuple[BudgetFile, FakeNvml, Controller]:
    """Container "a" (budget 40 %, PID 4242) that took 1000 tokens/s; an NVML window."""
    budget = BudgetFile(tmp_path / "budget")
    budget.update([BudgetEntry(memory=1 << 30, cores=40, rate=100, burst=1)])
    ledger = tmp_path / "ledger"
    # read_ledger reports liveness from OFD locks; nobody holds one here, so patch liveness
    import tessera_node.budget.ledger as led

    monkeypatch.setattr(led, "_slot_locked", lambda fd, i: True)
    nvml = FakeNvml()
    tenant = Tenant(name="a", budget=budget, ledger=ledger, lend=lend)
    ctl = Controller(nvml, [tenant])
    make_ledger(ledger, pid=4242, tokens=0, waits=5)
    tenant.readings.append((1000.0, 0.0, 0))
    tenant.readings.append((1000.2, 200.0, 5))  # 1000 tokens/s, and it waited for them
    nvml.window = (1000.0, 1000.1)
    return budget, nvml, ctl


def test_controller_sets_rates_from_measurement(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget, nvml, ctl = one_tenant(tmp_path, monkeypatch)
    nvml.busy = {4242: 0.2, 999: 0.3}  # 999 is someone else
    report = ctl.step()
    assert report["a"]["busy"] == 0.2
    assert abs(report["a"]["tokens"] - 100.0) < 1e-6  # interpolated over the NVML window
    # cost = 0.02 busy-s / 100 tokens; alone on the GPU and wanting more (it waited for
    # tokens) it may borrow all of it (work-conserving): rate = 1.0 * 0.99 / 2e-4
    rate = budget.read().entries[0].rate
    assert abs(rate - 1.0 * 0.99 / 2e-4) < 1.0
    assert report["a"]["share"] == 1.0 and abs(report["a"]["borrowed"] - 0.6) < 1e-9
    assert budget.read().entries[0].memory == 1 << 30  # everything else kept


def test_hard_capped_container_gets_its_budget_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    budget, nvml, ctl = one_tenant(tmp_path, monkeypatch, lend=False)
    nvml.busy = {4242: 0.2}
    report = ctl.step()
    assert report["a"]["share"] == 0.4 and report["a"]["borrowed"] == 0
    assert abs(budget.read().entries[0].rate - 0.4 * 0.99 / 2e-4) < 1.0


def test_controller_without_window_keeps_rates(tmp_path: Path) -> None:
    budget = BudgetFile(tmp_path / "budget")
    budget.update([BudgetEntry(cores=40, rate=123, burst=1)])
    ctl = Controller(FakeNvml(), [Tenant(name="a", budget=budget, ledger=tmp_path / "none")])
    assert ctl.step() == {}
    assert budget.read().entries[0].rate == 123


def test_attribution_by_start_time_across_pid_namespaces() -> None:
    import os

    from tessera_node.budget.ledger import LedgerSlot, LedgerView
    from tessera_node.cores.attribution import attribute, proc_identity

    me = proc_identity(os.getpid())
    assert me is not None and me[1] > 0 and me[2] > 0
    zero = (0,) * 16
    mine = LedgerSlot(0, me[0], True, zero, 0.0, me[1], me[2])
    stale = LedgerSlot(1, me[0], True, zero, 0.0, me[1] + 1, me[2])  # same PID, another one
    # another container's PID 1 started in the same clock tick: same PID and start time, its
    # own namespace (a Job's pods start together)
    twin = LedgerSlot(2, me[0], True, zero, 0.0, me[1], me[2] + 1)
    older_library = LedgerSlot(3, me[0], True, zero, 0.0, me[1])  # no namespace recorded
    assert attribute(LedgerView((), (mine,)), {os.getpid(): 0.25}) == 0.25
    assert attribute(LedgerView((), (stale,)), {os.getpid(): 0.25}) == 0.0
    assert attribute(LedgerView((), (twin,)), {os.getpid(): 0.25}) == 0.0
    assert attribute(LedgerView((), (older_library,)), {os.getpid(): 0.25}) == 0.25


def test_identities_are_read_again_unless_they_name_a_live_slot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A PID's identity names a live slot: it is that process still (start ticks are unique),
    so /proc is not read again; one that names no live slot is read again after the TTL, since
    the PID may belong to another process by then."""
    import tessera_node.cores.attribution as ctl_mod

    reads: list[int] = []
    owners = {100: (7, 1000, 4026531836), 200: (9, 2000, 4026531836)}
    monkeypatch.setattr(ctl_mod, "proc_identity", lambda pid: reads.append(pid) or owners[pid])
    clock = [0.0]
    monkeypatch.setattr(ctl_mod.time, "monotonic", lambda: clock[0])
    ids = ctl_mod.Identities()
    live = {(7, 1000, 4026531836)}
    assert ids(100, live) == owners[100] and ids(200, live) == owners[200]
    for step in range(1, 30):  # three seconds of periods
        clock[0] = step * 0.1
        ids(100, live)
        ids(200, live)
    assert reads.count(100) == 1 and 2 <= reads.count(200) <= 4
    owners[100] = (3, 5000, 4026532000)  # the slot's process died, its PID went to another
    clock[0] += 2 * ctl_mod.IDENTITY_TTL_S
    assert ids(100, set()) == owners[100]


def test_metrics_lent_borrowed_and_achieved_share() -> None:
    from prometheus_client import REGISTRY

    from tessera_node.metrics import CoreOwner, forget_core_container, observe_core_shares

    def value(name: str, **labels: str) -> float:
        v = REGISTRY.get_sample_value(name, labels)
        return 0.0 if v is None else v

    before = (value("tessera_quota_core_lent_seconds_total", namespace="ns1", quota="q"),
              value("tessera_quota_core_borrowed_seconds_total", namespace="ns2", quota="q"))
    report = {
        "idle": {"seconds": 0.1, "busy": 0.0, "target": 0.2, "lent": 0.17, "borrowed": 0.0,
                 "share": 0.2, "rate": 1.0},
        "busy": {"seconds": 0.1, "busy": 0.8, "target": 0.8, "lent": 0.0, "borrowed": 0.17,
                 "share": 0.97, "rate": 1.0},
        "unmeasured": {"target": 0.5, "share": 0.5, "lent": 0.0, "borrowed": 0.0, "rate": 1.0},
    }
    busy = CoreOwner("ns2", "p2", "main", "q")
    owners = {"idle": CoreOwner("ns1", "p1", "main", "q"), "busy": busy,
              "unmeasured": CoreOwner("ns3", "p3", "main", "q")}
    observe_core_shares("GPU-x", owners, report)
    assert value("tessera_quota_core_lent_seconds_total", namespace="ns1", quota="q") \
        - before[0] == pytest.approx(0.017)
    assert value("tessera_quota_core_borrowed_seconds_total", namespace="ns2", quota="q") \
        - before[1] == pytest.approx(0.017)
    labels = {"namespace": "ns2", "pod": "p2", "container": "main", "gpu": "GPU-x"}
    assert value("tessera_container_core_share", **labels) == 0.8
    assert value("tessera_container_core_busy_seconds_total", **labels) == pytest.approx(0.08)
    assert value("tessera_container_core_budget_seconds_total", **labels) == \
        pytest.approx(0.08)
    assert REGISTRY.get_sample_value("tessera_container_core_share", {
        "namespace": "ns3", "pod": "p3", "container": "main", "gpu": "GPU-x"}) is None
    forget_core_container("GPU-x", busy)  # the container ended: its series go
    assert REGISTRY.get_sample_value("tessera_container_core_share", labels) is None
    assert value("tessera_quota_core_borrowed_seconds_total", namespace="ns2", quota="q") > 0
