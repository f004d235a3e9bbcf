"""The audit's pure decisions: attribution, over budget, foreign processes, confirmation,
the namespace's enforcement, and the messages Events carry."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera_node.audit.logic import (
    AuditedContainer,
    AuditResult,
    ContainerKey,
    Enforcement,
    Files,
    GPUProcess,
    Sees,
    Tracker,
    attribute,
    audit,
    enforcement_of,
    foreign_message,
    over_budget_message,
    tampered_message,
)
from tessera_node.device.cgroups import CgroupOwner

MIB = 1 << 20
GPU0 = "GPU-00000000-0000-0000-0000-000000000000"
GPU1 = "GPU-11111111-1111-1111-1111-111111111111"
MIG0 = "MIG-22222222-2222-2222-2222-222222222222"
UNITS = (GPU0, GPU1, MIG0)
POD_A, POD_B = "aaaaaaaa-0000-0000-0000-000000000001", "bbbbbbbb-0000-0000-0000-000000000002"
CID = {n: n * 64 for n in "abcd"}


def ctr(name: str, pod_uid: str = POD_A, cid: str | None = None,
        limits: dict[str, int | None] | None = None,
        ledger: frozenset[tuple[int, int]] = frozenset()) -> AuditedContainer:
    return AuditedContainer(ContainerKey("ns", f"pod-{pod_uid[:1]}", name), pod_uid, cid,
                            limits if limits is not None else {GPU0: 100 * MIB}, ledger)


def proc(pid: int, unit: str = GPU0, used: int | None = 10 * MIB, pod: str | None = POD_A,
         cid: str | None = None, inner: int | None = None, start: int | None = 1000
         ) -> GPUProcess:
    owner = CgroupOwner(pod, cid) if pod else None
    return GPUProcess(pid, unit, used, f"pid {pid} (python3)", start, inner or pid, owner)


# -- attribution ------------------------------------------------------------------------------

def test_container_id_from_the_cgroup_is_exact() -> None:
    a, b = ctr("a", cid=CID["a"]), ctr("b", cid=CID["b"])
    assert attribute(proc(1, cid=CID["b"]), [a, b]) is b
    assert attribute(proc(1, cid=CID["a"]), [a, b]) is a


def test_another_container_of_the_pod_is_foreign_when_ids_are_known() -> None:
    a = ctr("a", cid=CID["a"])
    assert attribute(proc(1, cid=CID["c"]), [a]) is None  # e.g. a sidecar with a hostPath GPU


def test_without_ids_the_ledger_then_the_only_container_decides() -> None:
    a = ctr("a", ledger=frozenset({(7, 1000)}))
    b = ctr("b", ledger=frozenset({(8, 1000)}))
    assert attribute(proc(100, inner=8, cid=CID["c"]), [a, b]) is b
    assert attribute(proc(100, inner=9), [a, b]) is None  # two candidates, neither lists it
    assert attribute(proc(100, inner=9), [a]) is a  # the pod's only tessera container
    # the same PID started at another time is another process
    assert attribute(proc(100, inner=8, start=999), [a, b]) is None


def test_outside_any_pod_or_in_another_pod_is_foreign() -> None:
    a = ctr("a")
    assert attribute(proc(1, pod=None), [a]) is None
    assert attribute(proc(1, pod=POD_B), [a]) is None


# -- over budget --------------------------------------------------------------------------------

def test_over_budget_sums_the_containers_processes_per_unit() -> None:
    a = ctr("a", limits={GPU0: 100 * MIB, GPU1: 50 * MIB})
    r = audit([a], [proc(1, used=60 * MIB), proc(2, used=41 * MIB), proc(1, GPU1, 50 * MIB)])
    assert [(f.unit, f.used, f.limit, [p.pid for p in f.processes]) for f in r.over] == [
        (GPU0, 101 * MIB, 100 * MIB, [1, 2])]
    assert r.usage[(a.key, GPU1)] == 50 * MIB  # exactly at budget: not over
    assert r.foreign == ()


def test_slack_unlimited_and_unbudgeted_units() -> None:
    a = ctr("a", limits={GPU0: 100 * MIB, MIG0: None})
    r = audit([a], [proc(1, used=110 * MIB), proc(1, MIG0, 70 * 1024 * MIB),
                    proc(1, GPU1, 11 * MIB)], slack_bytes=10 * MIB)
    # within the slack on GPU0, no limit on its whole MIG instance; memory on a GPU its
    # budget does not name is over a budget of 0
    assert [(f.unit, f.limit) for f in r.over] == [(GPU1, 0)]


def test_a_pending_budget_names_nothing_so_any_memory_is_over() -> None:
    pending = ctr("a", limits={GPU0: 0})
    assert [f.unit for f in audit([pending], [proc(1, used=1)]).over] == [GPU0]
    assert audit([pending], [proc(1, used=0)]).over == ()


def test_memory_nvml_cannot_report_counts_as_zero() -> None:
    a = ctr("a")
    r = audit([a], [proc(1, used=None)])
    assert r.over == () and r.usage[(a.key, GPU0)] == 0


# -- properties ---------------------------------------------------------------------------------

containers = st.lists(st.builds(
    lambda name, pod, cid, limits, ledger: ctr(name, pod, cid, limits, ledger),
    st.sampled_from("abcd"), st.sampled_from([POD_A, POD_B]),
    st.none() | st.sampled_from(list(CID.values())),
    st.dictionaries(st.sampled_from(UNITS), st.none() | st.integers(0, 200 * MIB), max_size=3),
    st.frozensets(st.tuples(st.integers(1, 9), st.just(1000)), max_size=3),
), max_size=4, unique_by=lambda c: c.key)
processes = st.lists(st.builds(
    proc, st.integers(1, 50), st.sampled_from(UNITS), st.none() | st.integers(0, 150 * MIB),
    st.none() | st.sampled_from([POD_A, POD_B, "cccccccc-0000-0000-0000-000000000003"]),
    st.none() | st.sampled_from(list(CID.values())), st.integers(1, 9),
    st.none() | st.just(1000)), max_size=12)


@settings(max_examples=300)
@given(containers, processes, st.integers(0, 20 * MIB))
def test_every_byte_is_a_containers_or_foreign(cs: list[AuditedContainer],
                                               ps: list[GPUProcess], slack: int) -> None:
    r = audit(cs, ps, slack)
    held = [p for group in r.held.values() for p in group]
    assert sorted(map(id, held + list(r.foreign))) == sorted(map(id, ps))
    assert sum(r.usage.values()) + sum(p.used_bytes or 0 for p in r.foreign) == sum(
        p.used_bytes or 0 for p in ps)
    for p in ps:
        if p.owner is None or p.owner.pod_uid not in {c.pod_uid for c in cs}:
            assert p in r.foreign


@settings(max_examples=300)
@given(containers, processes, st.integers(0, 20 * MIB))
def test_over_budget_exactly_when_use_exceeds_budget_and_slack(
        cs: list[AuditedContainer], ps: list[GPUProcess], slack: int) -> None:
    r = audit(cs, ps, slack)
    by_key = {c.key: c for c in cs}
    want = set()
    for (key, unit), used in r.usage.items():
        limit = by_key[key].limits.get(unit, 0)
        if limit is not None and used > limit + slack:
            want.add((key, unit))
    assert {(f.key, f.unit) for f in r.over} == want
    for f in r.over:
        assert f.used == sum(p.used_bytes or 0 for p in f.processes)


@settings(max_examples=200)
@given(containers, processes, st.integers(0, 50 * MIB))
def test_a_larger_budget_never_adds_a_finding(cs: list[AuditedContainer],
                                              ps: list[GPUProcess], more: int) -> None:
    bigger = [AuditedContainer(c.key, c.pod_uid, c.container_id,
                               {u: None if v is None else v + more for u, v in c.limits.items()},
                               c.ledger_ids) for c in cs]
    before = {(f.key, f.unit) for f in audit(cs, ps).over}
    after = {(f.key, f.unit) for f in audit(bigger, ps).over}
    assert after <= before


# -- confirmation -------------------------------------------------------------------------------

def _result(over: bool, foreign: bool) -> AuditResult:
    a = ctr("a", limits={GPU0: 0})
    ps = ([proc(1, used=MIB)] if over else []) + ([proc(2, pod=None)] if foreign else [])
    return audit([a], ps)


@given(st.integers(1, 4), st.lists(st.booleans(), max_size=30))
def test_reported_once_per_episode_after_confirm_audits(confirm: int,
                                                        seen: list[bool]) -> None:
    t = Tracker(confirm)
    run = 0
    for s in seen:
        c = t.step(_result(s, s))
        run = run + 1 if s else 0
        assert len(c.over) == len(c.foreign) == (1 if run >= confirm else 0)
        assert [new for _, new in c.over] == ([run == confirm] if run >= confirm else [])
        assert [new for _, new in c.foreign] == ([run == confirm] if run >= confirm else [])


def test_a_pid_reused_by_another_process_is_a_new_finding() -> None:
    t = Tracker(1)
    first = t.step(AuditResult({}, (), (proc(5, pod=None, start=1),)))
    again = t.step(AuditResult({}, (), (proc(5, pod=None, start=2),)))
    assert [n for _, n in first.foreign] == [True] and [n for _, n in again.foreign] == [True]
    with pytest.raises(ValueError):
        Tracker(0)


# -- tampering: what only the node can know, treated like over budget at once -----------------

FILES = Files(budget=(64, 1001), ledger=(64, 1002))


def test_a_ledger_that_is_not_the_daemons_is_a_finding_at_the_first_audit() -> None:
    a = dataclasses.replace(ctr("a"), files=FILES, tampered="its ledger was truncated to 0 bytes")
    t = Tracker(2)
    first = t.step(audit([a], [proc(1, used=10 * MIB)]))
    assert [(x.key, x.why, [p.pid for p in x.processes], new)
            for x, new in first.tampered] == [(a.key, a.tampered, [1], True)]
    again = t.step(audit([a], []))  # no GPU process now: still a finding, not new
    assert [new for _, new in again.tampered] == [False]
    assert t.step(audit([dataclasses.replace(a, tampered=None)], [])).tampered == ()
    assert [n for _, n in t.step(audit([a], [])).tampered] == [True]  # a new episode


@pytest.mark.parametrize(("sees", "why"), [
    (Sees((64, 1001), (64, 1002)), None),
    (Sees((9, 9), (64, 1002)), "pid 1 (python3) sees another budget file at /run/tessera/budget"),
    (Sees(None, (64, 1002)), "pid 1 (python3) sees no budget file at /run/tessera/budget"),
    (Sees((64, 1001), (5, 5)), "pid 1 (python3) sees another ledger at /run/tessera/ledger"),
    (Sees((64, 1001), None), "pid 1 (python3) sees no ledger at /run/tessera/ledger"),
])
def test_a_process_that_sees_other_files_at_run_tessera_is_tampering(sees: Sees,
                                                                      why: str | None) -> None:
    """A process of the container in a mount namespace or root of its own (a fake budget
    bind-mounted in a user namespace, a chroot) finds other files there than the daemon's."""
    a = dataclasses.replace(ctr("a"), files=FILES)
    p = dataclasses.replace(proc(1), sees=sees)
    assert [x.why for x in audit([a], [p]).tampered] == ([why] if why else [])
    # not looked at (it went meanwhile), or the daemon knows no files: nothing
    assert audit([a], [proc(1)]).tampered == ()
    assert audit([ctr("a")], [p]).tampered == ()


def test_over_budget_the_ledger_does_not_account_for_counts_at_once() -> None:
    """NVML shows the container over budget while its ledger's processes account for no more
    than the budget: memory the library did not count (a process around it, counts the
    container zeroed). Confirmed at the first audit; with the ledger agreeing, at the second."""
    ledger_says = {GPU0: 60 * MIB}
    a = dataclasses.replace(ctr("a"), files=FILES, accounted=ledger_says)
    r = audit([a], [proc(1, used=60 * MIB), proc(2, used=60 * MIB)])
    assert r.over[0].evidence == "its ledger accounts for 60 MiB of them: memory the library " \
                                 "did not count"
    assert [new for _, new in Tracker(2).step(r).over] == [True]
    honest = dataclasses.replace(a, accounted={GPU0: 120 * MIB})  # e.g. a budget lowered
    r = audit([honest], [proc(1, used=60 * MIB), proc(2, used=60 * MIB)])
    t = Tracker(2)
    assert r.over[0].evidence is None and t.step(r).over == ()
    assert [new for _, new in t.step(r).over] == [True]


@settings(max_examples=200)
@given(containers, processes, st.lists(st.booleans(), min_size=1, max_size=4))
def test_evidence_only_makes_findings_sooner(cs: list[AuditedContainer], ps: list[GPUProcess],
                                             steps: list[bool]) -> None:
    """With the ledgers accounting for nothing, every over-budget finding of the plain audit
    is there too, confirmed no later; nothing else is."""
    plain, told = Tracker(2), Tracker(2)
    zero = [dataclasses.replace(c, accounted={}) for c in cs]
    for shown in steps:
        seen = ps if shown else []
        a = {(f.key, f.unit) for f, _ in plain.step(audit(cs, seen)).over}
        b = {(f.key, f.unit) for f, _ in told.step(audit(zero, seen)).over}
        assert a <= b <= {(f.key, f.unit) for f in audit(zero, seen).over}


def test_tampering_message() -> None:
    a = dataclasses.replace(ctr("a"), files=FILES, tampered="its ledger is gone")
    t = audit([a], [proc(3)]).tampered[0]
    assert tampered_message(t, ["pid 3 (python3)"]) == (
        "container a: its ledger is gone: treated as over its GPU memory budget (its GPU "
        "processes: pid 3 (python3)); stopped (SIGKILL): pid 3 (python3)")


# -- enforcement --------------------------------------------------------------------------------

def q(over: Any = None, foreign: Any = None) -> dict[str, Any]:
    e = {k: v for k, v in (("overBudget", over), ("foreignProcesses", foreign)) if v}
    return {"spec": {"enforcement": e} if e else {}}


@pytest.mark.parametrize(("quotas", "want"), [
    ([], Enforcement("Report", "Report")),
    ([q()], Enforcement("Report", "Report")),
    ([q("Stop")], Enforcement("Stop", "Report")),
    ([q(foreign="Stop"), q("Report", "Report")], Enforcement("Report", "Stop")),
    ([q("Kill", 3), {"spec": {"enforcement": "Stop"}}, {}], Enforcement("Report", "Report")),
])
def test_enforcement_is_the_strictest_of_the_namespaces_quotas(
        quotas: list[dict[str, Any]], want: Enforcement) -> None:
    assert enforcement_of(quotas) == want
    assert enforcement_of(reversed(quotas)) == want


def test_messages_say_what_was_done() -> None:
    a = ctr("a", limits={GPU0: 100 * MIB})
    f = audit([a], [proc(42, used=150 * MIB)]).over[0]
    assert over_budget_message(f) == (
        f"container a holds 150 MiB of GPU memory on {GPU0}, over its budget of 100 MiB "
        "(NVML per-process figures: pid 42 (python3)); reported only (GPUQuota "
        "enforcement.overBudget is not Stop)")
    assert over_budget_message(f, ["pid 42 (python3)"]).endswith(
        "; stopped (SIGKILL): pid 42 (python3)")
    p = proc(7, pod=None, used=512 * MIB)
    assert foreign_message(p, None) == (
        f"pid 7 (python3) outside any pod holds 512 MiB of GPU memory on {GPU0} and belongs "
        "to no container tessera set up; reported only (in no pod: no namespace's GPUQuota "
        "applies)")
    assert "in pod team/x" in foreign_message(proc(7), "team/x", ["pid 7 (python3)"])
    assert foreign_message(proc(7), "team/x", [], ["pid 7: gone"]).endswith(
        "could not stop: pid 7: gone")
