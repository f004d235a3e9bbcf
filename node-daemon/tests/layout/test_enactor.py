"""SmiEnactor's I/O around the pure plan: the kubelet's PodResources is consulted, devices
are withdrawn before they are destroyed, a failing command's output reaches the outcome, a
reset runs with NVML closed, and every command holds the GPU's host lock (which an orphaned
nvidia-smi keeps until it exits).  nvidia-smi here is a shell script; NVML an in-memory
reader (the simulator-backed runs are in node_integration)."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from gpu_model import instance, new_gpu

from tessera_node.device.hostlock import GPULocks, LockTimeout
from tessera_node.device.smi import NvidiaSmi
from tessera_node.device.state import DeviceSnapshot, GPUState
from tessera_node.layout.desired import GPUTarget
from tessera_node.layout.enact import MAX_COMMANDS, SmiEnactor
from tessera_node.layout.plan import plan
from tessera_node.settings import DEFAULTS

RECHECK_S = DEFAULTS.retry_interval_s


class Reader:
    def __init__(self, gpu: GPUState) -> None:
        self.snapshot = DeviceSnapshot((gpu,))
        self.paused_count = 0

    def read(self) -> DeviceSnapshot:
        return self.snapshot

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        self.paused_count += 1
        yield


class Pods:
    def __init__(self, held: Mapping[str, Sequence[str]]) -> None:
        self.held = held
        self.calls = 0

    def holders(self) -> Mapping[str, Sequence[str]]:
        self.calls += 1
        return self.held


class Advertiser:
    def __init__(self, ran: Path) -> None:
        self.ran = ran
        self.withdrawn: list[tuple[str, tuple[str, ...], bool]] = []
        self.changed_gpus: list[str] = []

    def withdraw(self, gpu_uuid: str, devices: Sequence[str]) -> None:
        self.withdrawn.append((gpu_uuid, tuple(devices), self.ran.exists()))

    def changed(self, gpu_uuid: str) -> None:
        self.changed_gpus.append(gpu_uuid)


def script(tmp_path: Path, body: str) -> NvidiaSmi:
    path = tmp_path / "nvidia-smi"
    path.write_text(f"#!/bin/sh\necho \"$@\" >> {tmp_path}/ran\n{body}\n")
    path.chmod(0o755)
    return NvidiaSmi(str(path))


def seven_1g() -> GPUState:
    g = new_gpu(mig=True)
    return replace(g, instances=tuple(instance("H100-80GB", "1g.10gb", s) for s in range(7)))


WHOLE = GPUTarget("p", 1, True, ("7g.80gb",))


def test_a_pod_holding_an_instance_is_asked_for_and_stops_the_change(tmp_path: Path) -> None:
    g = seven_1g()
    pods = Pods({g.instances[3].uuid: ["team/infer-3"]})
    e = SmiEnactor(script(tmp_path, "exit 0"), Reader(g), GPULocks(str(tmp_path)), pods,
                   recheck_s=RECHECK_S)
    out = e.apply(plan(WHOLE, g))
    assert pods.calls >= 1
    assert (out.phase, out.reason) == ("WaitingForIdle", "InUse")
    assert "pod team/infer-3" in out.message and "1g.10gb@3" in out.message
    assert not (tmp_path / "ran").exists()  # nvidia-smi never ran


def test_devices_are_withdrawn_before_destroying_and_a_failure_carries_stderr(
        tmp_path: Path) -> None:
    g = seven_1g()
    adv = Advertiser(tmp_path / "ran")
    smi = script(tmp_path, "echo 'Unable to destroy compute instance ID  0 from GPU  0 GPU "
                 "instance ID  7: In use by another client' >&2; exit 19")
    e = SmiEnactor(smi, Reader(g), GPULocks(str(tmp_path)), advertiser=adv,
                   recheck_s=RECHECK_S)
    out = e.apply(plan(WHOLE, g))
    assert (out.phase, out.reason) == ("Failed", "CommandFailed")
    assert "In use by another client" in out.message and "exit 19" in out.message
    assert "-dci" in out.message
    assert adv.withdrawn == [(g.uuid, tuple(i.uuid for i in g.instances), False)]
    assert adv.changed_gpus == [g.uuid]
    assert (tmp_path / "ran").read_text().split("\n")[0] == (
        "mig -i 0 -gi 7,8,9,10,11,12,13 -dci")


def test_every_command_holds_the_gpu_lock_and_a_reset_runs_with_nvml_closed(
        tmp_path: Path) -> None:
    a100 = replace(new_gpu("A100-40GB"), mig_pending="enabled")
    reader = Reader(a100)
    locks = GPULocks(str(tmp_path))
    state = tmp_path / "lock-state"
    smi = script(tmp_path, f"flock -n {locks.path(0)} true && echo free >> {state} || "
                 f"echo held >> {state}")
    e = SmiEnactor(smi, reader, locks, recheck_s=RECHECK_S)
    out = e.apply(plan(GPUTarget("p", 1, True, ("7g.40gb",)), a100))
    # the reader never shows the reset done: the enactor gives up instead of looping
    assert out.phase == "Failed" and f"after {MAX_COMMANDS}" in out.message
    ran = (tmp_path / "ran").read_text().splitlines()
    assert set(ran) == {"-r -i 0"} and len(ran) == MAX_COMMANDS
    assert reader.paused_count == MAX_COMMANDS
    assert set(state.read_text().split()) == {"held"}  # by nvidia-smi, while it ran
    assert e.allow_reset


def test_an_orphaned_holder_of_the_lock_is_waited_for(tmp_path: Path) -> None:
    locks = GPULocks(str(tmp_path), wait_s=0.3)
    locks.dir.mkdir(exist_ok=True)
    orphan = subprocess.Popen(["flock", str(locks.path(2)), "sleep", "1.5"])
    try:
        time.sleep(0.3)
        with pytest.raises(LockTimeout), locks.held(2):
            pass
        with locks.held(1):  # another GPU is free
            pass
        orphan.wait(5)
        with locks.held(2) as fd:
            assert fd >= 0
    finally:
        orphan.kill()
        orphan.wait()


def test_the_placement_check_refuses_an_old_nvidia_smi_and_accepts_a_new_one(
        tmp_path: Path) -> None:
    g = seven_1g()
    old = script(tmp_path, "echo 'Invalid combination of input arguments.'; exit 2")
    e = SmiEnactor(old, Reader(g), GPULocks(str(tmp_path)), recheck_s=0)
    assert e.refusal() is not None  # not checked yet: acts on nothing
    e.prepare()
    assert "minimal disruption" in (e.refusal() or "")
    new = script(tmp_path, "echo 'GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1'")
    e.smi = new
    e.prepare()
    assert e.refusal() is None
