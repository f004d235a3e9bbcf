"""tessera-node changing MIG layouts on simulated GPU nodes, against the real API server:
apply/change/remove, busy instances, nvidia-smi failures, SIGKILL between commands, several
nodes, Ampere resets and Reset deletions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import FINALIZER_RESET
from tessera.api.partition import NodePartitionStatus
from tessera_e2e.gpubed.daemons import NodeDaemonProcess
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.paths import REPO

from .conftest import StartDaemon
from .test_node_daemon import events, reports

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

FAST = ["--resync-interval", "2", "--retry-interval", "1"]
WORKLOAD = REPO / "sim" / "tests" / "workload.py"


def pool_name(prefix: str) -> str:
    return f"{prefix}{int(time.time() * 1000) % 10**8}"


def apply_partition(cluster: Any, name: str, pool: str, profiles: dict[str, int] | None,
                    policy: str = "WaitForIdle", deletion: str = "Retain",
                    finalizers: list[str] | None = None) -> None:
    layout: dict[str, Any] = ({"migMode": "Disabled"} if profiles is None else
                              {"profiles": [{"name": k, "count": v}
                                            for k, v in profiles.items()]})
    body = {"apiVersion": "tessera.dev/v1alpha1", "kind": "GPUPartition",
            "metadata": {"name": name, **({"finalizers": finalizers} if finalizers else {})},
            "spec": {"nodeSelector": {"matchLabels": {"pool": pool}}, "layout": layout,
                     "disruptionPolicy": policy, "deletionPolicy": deletion}}
    out = cluster.kubectl("apply", "-f", "-", input=json.dumps(body))
    assert out.returncode == 0, out.stderr


def entry(cluster: Any, d: NodeDaemonProcess, part: str, phase: str,
          timeout: float = 40.0, generation: int | None = None) -> NodePartitionStatus:
    def check() -> NodePartitionStatus | None:
        e = reports(cluster, d.node).get(part)
        ok = e is not None and e.phase == phase and (
            generation is None or e.observed_generation == generation)
        return e if ok else None
    try:
        out: NodePartitionStatus = wait_until(f"{d.node} {part} {phase}", check, timeout)
    except TimeoutError as exc:
        raise TimeoutError(f"{exc}; entry now: {reports(cluster, d.node).get(part)}; log: "
                           f"{d.log.read_text()[-2500:]}") from None
    return out


def instances(e: NodePartitionStatus, gpu: int = 0) -> dict[tuple[str, int], tuple[Any, ...]]:
    """(profile, start) -> (GI ID, UUID) of one GPU in an entry."""
    g = next(g for g in e.gpus if g.index == gpu)
    return {(i.profile, i.start): (i.gi_id, i.uuid) for i in g.instances}


def smi_commands(d: NodeDaemonProcess) -> list[dict[str, Any]]:
    """The daemon's log lines for finished nvidia-smi MIG commands (not the start check)."""
    return [r for r in d.log_records() if r.get("msg") == "nvidia-smi done"
            and "-lgipp" not in r.get("argv", [])]


def cleanup(cluster: Any, *names: str) -> None:
    for n in names:
        cluster.kubectl("patch", "gpupartition", n, "--type=merge", "-p",
                        '{"metadata":{"finalizers":null}}')
    cluster.kubectl("delete", "gpupartition", *names, "--ignore-not-found", "--wait=false")


class Holder:
    """A CUDA process holding memory on one MIG device (or GPU) of a simulated node."""

    def __init__(self, d: NodeDaemonProcess, device: str) -> None:
        env = {**d.sim.env, "CUDA_VISIBLE_DEVICES": device}
        self.proc = subprocess.Popen([sys.executable, str(WORKLOAD), "hold", "64"], env=env,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "alloc 0"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def pool() -> Iterator[str]:
    yield pool_name("m")


def test_apply_change_and_remove_keep_unchanged_instances(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["H100-80GB"] * 2, {"pool": pool}, FAST)
    part = f"{pool}-p"
    try:
        apply_partition(chart, part, pool, {"1g.10gb": 7})
        e = entry(chart, d, part, "Ready")
        first = instances(e)
        assert sorted(first) == [("1g.10gb", s) for s in range(7)]
        assert all(uuid and uuid.startswith("MIG-") for _, uuid in first.values())
        cmds = [tuple(c["argv"]) for c in smi_commands(d)]
        assert ("mig", "-i", "0", "-cgi", ",".join(f"1g.10gb:{s}" for s in range(7))) in cmds
        assert len(cmds) == 6  # -mig 1, -cgi, -cci on each of two GPUs: batched
        lgi = d.sim.smi("mig", "-i", "0", "-lgi").stdout
        assert lgi.count("MIG 1g.10gb") == 7
        # change: the 1g instances that can stay keep their IDs and UUIDs
        apply_partition(chart, part, pool, {"3g.40gb": 1, "1g.10gb": 3})
        e = entry(chart, d, part, "Ready", generation=2)
        second = instances(e)
        kept = {k: v for k, v in second.items() if k[0] == "1g.10gb"}
        assert len(kept) == 3 and all(first[k] == v for k, v in kept.items())
        assert len(second) == 4
        assert d.metric("tessera_mig_instances", gpu="0", profile="3g.40gb") == 1
        assert (d.metric("tessera_node_nvidia_smi_commands_total", command="create-gi",
                         result="ok") or 0) == 4
        assert (d.metric("tessera_node_mig_applies_total", outcome="Ready") or 0) >= 4
        # remove: back to whole GPUs
        apply_partition(chart, part, pool, None)
        e = entry(chart, d, part, "Ready", generation=3)
        assert [(g.mig_enabled, g.instances) for g in e.gpus] == [(False, [])] * 2
        # the Event follows the status patch
        wait_until("the third NodeReady Event", lambda: [
            ev["reason"] for ev in events(chart, part)].count("NodeReady") == 3, 20, 0.2)
    finally:
        cleanup(chart, part)


def test_a_busy_instance_waits_for_idle_refuse_fails_and_the_change_goes_on_after(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["H100-80GB"], {"pool": pool}, FAST)
    part = f"{pool}-p"
    holder: Holder | None = None
    try:
        apply_partition(chart, part, pool, {"1g.10gb": 7})
        first = instances(entry(chart, d, part, "Ready"))
        busy_uuid = first[("1g.10gb", 0)][1]
        holder = Holder(d, busy_uuid)
        apply_partition(chart, part, pool, {"7g.80gb": 1})
        e = entry(chart, d, part, "WaitingForIdle", generation=2)
        assert f"pid {holder.proc.pid}" in (e.message or "") and e.reason == "InUse"
        assert "1g.10gb@0" in (e.message or "")
        assert instances(e) == first  # nothing destroyed, not even the idle ones
        apply_partition(chart, part, pool, {"7g.80gb": 1}, policy="Refuse")
        e = entry(chart, d, part, "Failed", generation=3)
        assert f"pid {holder.proc.pid}" in (e.message or "")
        assert "Refuse" in (e.message or "")
        apply_partition(chart, part, pool, {"7g.80gb": 1})
        entry(chart, d, part, "WaitingForIdle", generation=4)
        holder.stop()
        holder = None
        e = entry(chart, d, part, "Ready", generation=4)
        assert list(instances(e)) == [("7g.80gb", 0)]
    finally:
        if holder is not None:
            holder.stop()
        cleanup(chart, part)


FAULTS = [  # (NVML function behind the step, the layout whose change needs it)
    ("nvmlDeviceSetMigMode", {"2g.20gb": 2}),
    ("nvmlDeviceCreateGpuInstanceWithPlacement", {"2g.20gb": 3}),
    ("nvmlGpuInstanceCreateComputeInstance", {"2g.20gb": 3, "1g.10gb": 1}),
    ("nvmlComputeInstanceDestroy", {"3g.40gb": 1, "1g.10gb": 1}),
    ("nvmlGpuInstanceDestroy", {"3g.40gb": 1}),
]


def test_nvidia_smi_failing_at_each_step_fails_with_its_words_then_recovers(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["H100-80GB"], {"pool": pool}, FAST)
    part = f"{pool}-p"
    try:
        for generation, (fn, layout) in enumerate(FAULTS, start=1):
            d.sim.fault(fn, -1, 3)  # NVML_ERROR_NOT_SUPPORTED, as nvidia-smi reports it
            try:
                apply_partition(chart, part, pool, layout)
                e = entry(chart, d, part, "Failed", generation=generation)
                assert e.reason == "CommandFailed", e
                assert "Not Supported" in (e.message or "") and "nvidia-smi" in (
                    e.message or ""), e.message
                wait_until("a NodeFailed Event", lambda: any(
                    ev["reason"] == "NodeFailed" and "Not Supported" in ev["message"]
                    for ev in events(chart, part)))
            finally:
                d.sim.fault(fn, 0, 0)
            entry(chart, d, part, "Ready", generation=generation)  # retried, succeeds
        assert (d.metric("tessera_node_mig_applies_total", outcome="Failed") or 0) >= 5
    finally:
        cleanup(chart, part)


def test_sigkill_after_each_command_converges_without_orphans_or_duplicates(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["H100-80GB"], {"pool": pool}, FAST)
    part = f"{pool}-p"
    try:
        for generation, layout in enumerate(
                [{"3g.40gb": 1, "2g.20gb": 2}, {"1g.10gb": 4, "3g.40gb": 1}], start=1):
            # every NVML call a little slow: the daemon's read after a command takes long
            # enough to be killed in (the nvidia-smi before it has finished)
            d.sim.fault("nvmlDeviceGetCount_v2", -1, 0, 700_000)
            apply_partition(chart, part, pool, layout)
            kills = 0
            while True:
                done = len(smi_commands(d))
                e = reports(chart, d.node).get(part)
                if e is not None and e.phase == "Ready" and e.observed_generation == generation:
                    break
                try:
                    wait_until("the next nvidia-smi command", lambda done=done, g=generation: len(
                        smi_commands(d)) > done or ((e := reports(chart, d.node).get(part))
                        and e.phase == "Ready" and e.observed_generation == g), 60,
                        0.05)
                except TimeoutError as exc:
                    raise TimeoutError(f"{exc}: {d.log.read_text()[-2000:]}") from None
                if len(smi_commands(d)) == done:
                    continue
                assert d.proc is not None
                os.kill(d.proc.pid, signal.SIGKILL)  # right after a command
                d.proc.wait(10)
                kills += 1
                d.start()
            d.sim.fault("nvmlDeviceGetCount_v2", 0, 0)
            assert kills >= 3
            e = entry(chart, d, part, "Ready", generation=generation)
            want = sorted(p for p, n in layout.items() for _ in range(n))
            got = [i for g in e.gpus for i in g.instances]
            assert sorted(i.profile for i in got) == want  # no orphan, no duplicate
            assert all(i.uuid for i in got)  # every GI has its compute instance
            lgi = d.sim.smi("mig", "-i", "0", "-lgi").stdout
            assert sum(lgi.count(f"MIG {p} ") for p in layout) == len(want)
        assert (Path(d.args[d.args.index("--state-dir") + 1]) / "mig-gpu0.lock").exists()
    finally:
        cleanup(chart, part)


def test_three_nodes_share_a_partition_and_a_node_it_does_not_fit_fails_alone(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    h100 = [start_daemon(["H100-80GB"] * 2, {"pool": pool}, FAST) for _ in range(3)]
    a30 = start_daemon(["A30-24GB"], {"pool": pool}, FAST)
    part = f"{pool}-p"
    try:
        apply_partition(chart, part, pool, {"1g.10gb": 7})
        for d in h100:
            e = entry(chart, d, part, "Ready")
            assert [len(g.instances) for g in e.gpus] == [7, 7]
        e = entry(chart, a30, part, "Failed")
        assert e.reason == "LayoutDoesNotFit"
        assert "GPU 0 (A30-24GB)" in (e.message or "") and "1g.10gb" in (e.message or "")
        assert a30.sim.smi("--query-gpu=mig.mode.current", "--format=csv,noheader"
                           ).stdout.strip() == "Disabled"  # untouched
    finally:
        cleanup(chart, part)


def test_ampere_mode_changes_reset_idle_gpus_wait_for_busy_ones_and_reboots_fail(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    d = start_daemon(["A100-40GB"] * 2, {"pool": pool}, FAST)
    part = f"{pool}-p"
    holder = Holder(d, d.sim.smi("--query-gpu=uuid", "--format=csv,noheader", "-i", "1")
                    .stdout.strip())
    try:
        apply_partition(chart, part, pool, {"3g.20gb": 2})
        e = entry(chart, d, part, "WaitingForIdle")
        assert f"pid {holder.proc.pid}" in (e.message or "") and "GPU 1" in (e.message or "")
        wait_until("GPU 0 reset and on", lambda: "3g.20gb" in d.sim.smi(
            "mig", "-i", "0", "-lgi").stdout)  # GPU 0 was reset and goes on
        holder.stop()
        e = entry(chart, d, part, "Ready")
        assert [len(g.instances) for g in e.gpus] == [2, 2]
        resets = [c for c in smi_commands(d) if c["argv"][:1] == ["-r"]]
        assert [c["argv"] for c in resets] == [["-r", "-i", "0"], ["-r", "-i", "1"]]
        # a mode change only a reboot finishes (a passthrough VM): RebootRequired
        d.sim.fault("nvmlDeviceSetMigMode", -1, 16)
        try:
            apply_partition(chart, part, pool, None)
            e = entry(chart, d, part, "Failed", generation=2)
            assert e.reason == "RebootRequired", e.message
            assert "GPU requires reset" in (e.message or "")
        finally:
            d.sim.fault("nvmlDeviceSetMigMode", 0, 0)
        e = entry(chart, d, part, "Ready", generation=2)
        assert [g.mig_enabled for g in e.gpus] == [False, False]
    finally:
        holder.stop()
        cleanup(chart, part)


def test_reset_deletion_disables_mig_and_reports_ready_or_fails_when_it_cannot(
        chart: Any, start_daemon: StartDaemon, pool: str) -> None:
    h100 = start_daemon(["H100-80GB"], {"pool": pool, "side": "h"}, FAST)
    a100 = start_daemon(["A100-40GB"], {"pool": pool, "side": "a"},
                        [*FAST, "--allow-gpu-reset", "false"])
    part = f"{pool}-p"
    try:
        a100.sim.smi("-i", "0", "-mig", "1")
        a100.sim.smi("-r", "-i", "0")  # MIG enabled beforehand, by hand
        apply_partition(chart, part, pool, {"7g.80gb": 1}, deletion="Reset",
                        finalizers=[FINALIZER_RESET])
        entry(chart, h100, part, "Ready")
        e = entry(chart, a100, part, "Failed")  # 7g.80gb is not an A100-40GB profile
        assert e.reason == "LayoutDoesNotFit"
        assert chart.kubectl("delete", "gpupartition", part, "--wait=false").returncode == 0
        gen = json.loads(chart.kubectl("get", "gpupartition", part, "-o", "json").stdout)[
            "metadata"]["generation"]
        e = entry(chart, h100, part, "Ready", generation=gen)
        assert [(g.mig_enabled, g.instances) for g in e.gpus] == [(False, [])]
        e = entry(chart, a100, part, "Failed", generation=gen)
        assert "cannot finish" in (e.message or "") and e.reason == "ResetPending"
    finally:
        cleanup(chart, part)


def test_an_nvidia_smi_without_explicit_placements_changes_nothing_and_says_why(
        chart: Any, start_daemon: StartDaemon, pool: str, tmp_path: Path) -> None:
    old = tmp_path / "nvidia-smi"
    old.write_text("#!/bin/sh\n[ \"$1 $2\" = 'mig -lgipp' ] && { echo 'Invalid combination "
                   "of input arguments. Please run \"nvidia-smi -h\" for help.'; exit 2; }\n"
                   "exit 0\n")
    old.chmod(0o755)
    d = start_daemon(["H100-80GB"], {"pool": pool}, [*FAST, "--nvidia-smi", str(old)])
    part = f"{pool}-p"
    try:
        apply_partition(chart, part, pool, {"7g.80gb": 1})
        e = entry(chart, d, part, "Pending")
        assert "cannot guarantee minimal disruption" in (e.message or "")
        assert smi_commands(d) == []
    finally:
        cleanup(chart, part)
