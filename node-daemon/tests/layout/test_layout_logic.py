"""MIG enactment's pure parts: plans from NVML state (minimal disruption, busy instances,
mode changes and resets), their batching into nvidia-smi commands, what a crash between or
inside commands leaves and how the next plan recovers from it, reading nvidia-smi's output,
and the per-GPU work queue's retries."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from gpu_model import Refused, instance, model_id, new_gpu, run
from hypothesis import given, settings
from hypothesis import strategies as st

from tessera.dra.partitions import Bounds
from tessera.mig.planner import fit, maximal_layouts
from tessera_node.device.state import GPUState
from tessera_node.layout.commands import (
    commands,
    failure_reason,
    failure_text,
    next_command,
    pending_needs_reboot,
)
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.enact import placement_support
from tessera_node.layout.plan import GPUPlan, Outcome, plan
from tessera_node.layout.queue import PlanQueue

H100 = "H100-80GB"
LAYOUTS = [tuple(sorted(x)) for x in maximal_layouts(H100)] + [
    ("1g.10gb",), ("3g.40gb",), ("2g.20gb", "1g.10gb"), ("7g.80gb",)]


def target(profiles: tuple[str, ...] | None, policy: str = "WaitForIdle",
           deleting: bool = False) -> GPUTarget:
    return GPUTarget("p", 1, profiles is not None, tuple(sorted(profiles or ())),
                     policy, deleting)  # type: ignore[arg-type]


def built(profiles: tuple[str, ...], model: str = H100) -> GPUState:
    g = new_gpu(model, mig=True)
    return replace(g, instances=tuple(instance(model, p.profile, p.start)
                                      for p in fit(model, list(profiles))))


def converge(t: GPUTarget, g: GPUState, ampere: bool = False,
             holders: dict[str, list[str]] | None = None) -> tuple[GPUState, list[str]]:
    """Plan, run the first command, read again, until done (as the enactor does)."""
    ran: list[str] = []
    for _ in range(16):
        p = plan(t, g, holders)
        if p.done or p.blocked:
            return g, ran
        c = next_command(p)
        assert c is not None
        g = run(g, c, ampere)
        ran.append(c.action)
    raise AssertionError(f"no convergence: {ran}")


@settings(max_examples=100, deadline=None)
@given(have=st.one_of(st.none(), st.sampled_from(LAYOUTS)),
       want=st.one_of(st.none(), st.sampled_from(LAYOUTS)), ampere=st.booleans())
def test_plans_converge_one_command_per_step_kind_keeping_unchanged_instances(
        have: tuple[str, ...] | None, want: tuple[str, ...] | None, ampere: bool) -> None:
    g = built(have) if have is not None else new_gpu()
    t = target(want)
    end, ran = converge(t, g, ampere)
    assert plan(t, end).done
    assert len(ran) == len(set(ran)), f"a step kind ran twice: {ran}"
    assert (end.mig_mode == "enabled") == (want is not None)
    assert sorted(i.profile for i in end.instances) == sorted(want or ())
    assert all(i.has_compute_instance for i in end.instances)
    if have is not None and want is not None:  # unchanged instances keep IDs and UUIDs
        before = {(i.profile, i.start): i for i in g.instances}
        kept = [i for i in end.instances if (i.profile, i.start) in before]
        assert all(before[(i.profile, i.start)] == i for i in kept)
        if set(have) <= set(want) and sorted(have) != sorted(want):
            assert "destroy-gi" not in ran or len(kept) < len(have)
    if g.mig_mode == "enabled" and have == want:
        assert ran == []


@settings(max_examples=100, deadline=None)
@given(have=st.sampled_from(LAYOUTS), want=st.one_of(st.none(), st.sampled_from(LAYOUTS)),
       crash_at=st.integers(0, 6), part=st.integers(0, 3))
def test_a_crash_inside_or_between_commands_converges_without_orphans_or_duplicates(
        have: tuple[str, ...], want: tuple[str, ...] | None, crash_at: int,
        part: int) -> None:
    """A command cut short (only its first ``part`` items done), then planning from what
    the GPU shows: the same end state, no GI without CI, no instance twice."""
    g, t = built(have), target(want)
    for n in range(16):
        p = plan(t, g)
        if p.done:
            break
        c = next_command(p)
        assert c is not None
        g = run(g, c, part=part if n == crash_at else None)
    assert plan(t, g).done
    assert sorted(i.profile for i in g.instances) == sorted(want or ())
    assert all(i.has_compute_instance for i in g.instances)
    assert len({(i.start) for i in g.instances}) == len(g.instances)


def test_instances_are_created_at_the_planners_starts_in_one_batched_command() -> None:
    g = new_gpu(mig=True)
    p = plan(target(("3g.40gb", "2g.20gb", "2g.20gb")), g)
    assert [str(c) for c in commands(p)] == [
        "nvidia-smi mig -i 0 -cgi 2g.20gb:0,2g.20gb:2,3g.40gb:4"]
    g = run(g, commands(p)[0])
    assert [str(c) for c in commands(plan(target(("3g.40gb", "2g.20gb", "2g.20gb")), g))] == [
        "nvidia-smi mig -i 0 -gi 3,4,2 -cci"]


def test_a_change_destroys_only_what_must_go_in_one_command_per_kind() -> None:
    g = built(("1g.10gb",) * 7)
    p = plan(target(("3g.40gb",) + ("1g.10gb",) * 3), g)
    assert [str(c) for c in commands(p)] == [
        "nvidia-smi mig -i 0 -gi 7,8,9,10 -dci", "nvidia-smi mig -i 0 -gi 7,8,9,10 -dgi",
        "nvidia-smi mig -i 0 -cgi 3g.40gb:0"]  # the 1g at 4, 5, 6 stay
    gone = {i.uuid for i in g.instances if i.gi_id in (7, 8, 9, 10)}
    assert set(commands(p)[0].devices) == gone  # withdrawn before destroying


def busy_gpu(processes: tuple[str, ...] = ("pid 42 (python3)",)) -> GPUState:
    g = built(("1g.10gb",) * 7)
    insts = list(g.instances)
    insts[0] = replace(insts[0], processes=processes)
    return replace(g, instances=tuple(insts))


def test_a_busy_instance_in_the_way_waits_or_refuses_naming_processes_and_pods() -> None:
    g = busy_gpu()
    want = ("4g.40gb", "1g.10gb", "1g.10gb", "1g.10gb")
    waiting = plan(target(want), g)
    assert (waiting.phase, waiting.reason, waiting.steps) == ("WaitingForIdle", "InUse", ())
    assert "pid 42 (python3) on 1g.10gb@0" in waiting.message
    refused = plan(target(want, "Refuse"), g)
    assert refused.phase == "Failed" and "pid 42 (python3)" in refused.message
    # a pod holding the instance (kubelet PodResources) is as busy as a process
    idle = built(("1g.10gb",) * 7)
    held = plan(target(want), idle, {idle.instances[0].uuid: ["team/infer-0"]})
    assert held.phase == "WaitingForIdle" and "pod team/infer-0" in held.message
    # once idle the change goes ahead; a busy instance that stays is never in the way
    assert plan(target(want), idle).steps
    keeps_busy = plan(target(("1g.10gb",) * 7 + ()), g)
    assert keeps_busy.done


def test_mode_changes_wait_for_idle_gpus_and_ampere_resets_only_when_allowed() -> None:
    a100 = new_gpu("A100-40GB")
    t = target(("3g.20gb",))
    _, ran = converge(t, a100, ampere=True)
    assert ran == ["enable-mig", "reset-gpu", "create-gi", "create-ci"]
    pending = replace(a100, mig_pending="enabled")
    assert plan(t, pending, allow_reset=False).phase == "Pending"
    assert "--allow-gpu-reset" in plan(t, pending, allow_reset=False).message
    gone = target(None, deleting=True)
    off_pending = replace(built(("3g.20gb",), "A100-40GB"), instances=(),
                          mig_pending="disabled")
    stuck = plan(gone, off_pending, allow_reset=False)
    assert stuck.phase == "Failed" and "reset deletion cannot finish" in stuck.message
    busy = replace(pending, processes=("pid 7 (trainer)",))
    assert plan(t, busy).phase == "WaitingForIdle"
    assert "pid 7 (trainer)" in plan(t, busy, allow_reset=True).message
    assert plan(target(None), replace(new_gpu(), processes=("pid 7 (x)",))).done
    assert plan(t, replace(new_gpu(), processes=("pid 7 (x)",))).phase == "WaitingForIdle"


def test_a_layout_the_gpu_cannot_hold_fails_with_the_planners_reason() -> None:
    p = plan(target(("4g.40gb", "4g.40gb")), new_gpu(mig=True))
    assert (p.phase, p.reason) == ("Failed", "LayoutDoesNotFit")
    assert "4g.40gb" in p.message


def test_nvidia_smi_output_is_read_for_reboots_failures_and_placement_support() -> None:
    warn = ("Warning: MIG mode is in pending enable state for GPU 00000000:27:00.0:GPU "
            "requires reset\nReboot the system or try nvidia-smi --gpu-reset to make MIG "
            "mode effective on GPU 00000000:27:00.0\nAll done.")
    assert pending_needs_reboot(warn)
    assert not pending_needs_reboot(warn.replace("GPU requires reset", "Not Supported"))
    assert failure_reason("Unable to enable MIG Mode for GPU x: GPU requires reset") == (
        "RebootRequired")
    assert failure_reason("Failed to create GPU instances: Insufficient Resources") == (
        "CommandFailed")
    c = next_command(plan(target(("7g.80gb",)), new_gpu(mig=True)))
    assert c is not None
    assert failure_text(c, 23, "Unable to create\nFailed to create GPU instances: X") == (
        "`nvidia-smi mig -i 0 -cgi 7g.80gb:0` failed (exit 23): Unable to create Failed to "
        "create GPU instances: X")
    assert placement_support("smi", 0, "GPU  0 Profile ID 19 Placements: {0}:1") is None
    why = placement_support("/x/nvidia-smi", 2, "Invalid combination of input arguments.")
    assert why is not None and "minimal disruption" in why and "/x/nvidia-smi" in why
    assert "cannot run" in (placement_support("s", -1, "No such file") or "")


def test_the_model_refuses_what_the_driver_refuses() -> None:
    g = busy_gpu()
    c = next_command(plan(target(("7g.80gb",)), replace(
        g, instances=tuple(replace(i, processes=()) for i in g.instances))))
    assert c is not None and c.action == "destroy-ci"
    with pytest.raises(Refused):
        run(g, c)
    assert model_id(g) == H100


class Recorder:
    def __init__(self, outcomes: list[Outcome]) -> None:
        self.outcomes = outcomes
        self.applied: list[GPUPlan] = []

    def prepare(self) -> None:
        return None

    def refusal(self) -> str | None:
        return None

    def apply(self, plan: GPUPlan) -> Outcome:
        self.applied.append(plan)
        return self.outcomes.pop(0)


def test_the_work_queue_retries_failures_after_the_interval_only() -> None:
    async def go() -> None:
        now = [0.0]
        rec = Recorder([Outcome("Failed", "boom"), Outcome("Ready")])
        woke: list[int] = []
        work = PlanQueue(rec, lambda: woke.append(1), retry_s=10, clock=lambda: now[0])
        p = plan(target(("7g.80gb",)), new_gpu(mig=True))
        work.submit(p)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if work.outcome(p) is not None:
                break
        assert work.outcome(p) == Outcome("Failed", "boom") and woke
        work.submit(p)  # too early: not again
        await asyncio.sleep(0.05)
        assert len(rec.applied) == 1
        now[0] = 11.0
        work.submit(p)
        for _ in range(50):
            await asyncio.sleep(0.01)
            if work.outcome(p) == Outcome("Ready"):
                break
        assert work.outcome(p) == Outcome("Ready") and len(rec.applied) == 2
        work.submit(p)  # done: never again
        await asyncio.sleep(0.05)
        assert len(rec.applied) == 2
        await work.close()
    asyncio.run(go())


@settings(max_examples=100, deadline=None)
@given(have=st.sampled_from(LAYOUTS), want=st.one_of(st.none(), st.sampled_from(LAYOUTS)),
       busy=st.sets(st.integers(0, 6), max_size=3), by_pod=st.booleans(),
       policy=st.sampled_from(["WaitForIdle", "Refuse"]))
def test_a_busy_instance_is_never_destroyed_and_the_gpu_never_switched_under_it(
        have: tuple[str, ...], want: tuple[str, ...] | None, busy: set[int], by_pod: bool,
        policy: str) -> None:
    g = built(have)
    used = [i for k, i in enumerate(g.instances) if k in busy]
    holders: dict[str, list[str]] = {}
    if by_pod:
        holders = {i.uuid: [f"ns/pod-{i.gi_id}"] for i in used}
    else:
        g = replace(g, instances=tuple(replace(i, processes=(f"pid {i.gi_id}",))
                                       if i in used else i for i in g.instances))
    t = target(want, policy)
    for _ in range(16):
        p = plan(t, g, holders)
        if p.done or p.blocked:
            break
        c = next_command(p)
        assert c is not None
        if used:
            assert c.action not in ("disable-mig", "reset-gpu")
        assert not {i.gi_id for i in used} & {s.gi_id for s in p.steps
                                              if s.action.startswith("destroy")}
        g = run(g, c)
    still = {(i.profile, i.start) for i in g.instances}
    assert all((i.profile, i.start) in still for i in used)  # every busy one is still there
    if p.blocked:
        assert p.phase == ("Failed" if policy == "Refuse" else "WaitingForIdle")
        assert p.reason == "InUse"
        assert used and any(  # names the busy instances in the way (not those that stay)
            (f"pod ns/pod-{i.gi_id}" if by_pod else f"pid {i.gi_id}") in p.message
            for i in used)
    else:
        assert p.done


ON_DEMAND = GPUTarget("p", 1, True, on_demand=Bounds())


@settings(max_examples=60, deadline=None)
@given(have=st.one_of(st.none(), st.sampled_from(LAYOUTS)), ampere=st.booleans())
def test_an_on_demand_gpu_gets_mig_enabled_and_keeps_every_instance_it_has(
        have: tuple[str, ...] | None, ampere: bool) -> None:
    """OnDemand declares no instances: MIG is enabled, and whatever instances the GPU holds
    (the claims') stay where they are, idle or not; nothing is created."""
    g = built(have) if have is not None else new_gpu()
    end, ran = converge(ON_DEMAND, g, ampere)
    assert plan(ON_DEMAND, end).done and end.mig_mode == "enabled"
    assert [(i.profile, i.start, i.uuid) for i in end.instances] == [
        (i.profile, i.start, i.uuid) for i in g.instances]
    assert not {"destroy-gi", "destroy-ci", "create-gi"} & set(ran), ran


def test_an_on_demand_instance_without_its_compute_instance_is_left_to_its_maker() -> None:
    """Being made (``-cgi … -C`` is one command) or left by a daemon killed mid-command:
    the plan neither destroys it nor runs a second ``-cci`` that would race the maker's;
    the kubelet plugin's prepare, asked again, completes it."""
    g = built(("3g.40gb", "1g.10gb"))
    half = replace(g, instances=(g.instances[0], replace(g.instances[1], uuid="", ci_id=None)))
    assert plan(ON_DEMAND, half).done
