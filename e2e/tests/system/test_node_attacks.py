"""A hostile tenant against tessera on the test bed's real kubelets (issue 27): each attack
runs in a budgeted pod, as a tenant would run it, and tessera holds: the tenant's process is
held to its budget by libtessera or stopped by the node daemon's audit within the audit
window, and the daemon never goes down. tessera-node runs as in the device plugin's tests
(``gpu_bed``: the node's namespaces, ``--audit-interval 2``); the kubelets run with
``seccompDefault: true``, and tessera's webhook gives a GPU pod that names no profile
RuntimeDefault and refuses ``Unconfined``; the pod that needs ``unshare`` names a permissive
profile an administrator installed on the node (``Localhost``). The routes and what holds
each: hook/README.md, "Threat model"."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.nodes.config import KUBELET_ROOT
from tessera_e2e.operator.replicas import wait_until
from tessera_node.audit.runner import REASON_OVER_BUDGET, REASON_TAMPERED
from tessera_node.budget.formats import BudgetEntry, BudgetFile

pytestmark = pytest.mark.integration

NODE = "node-1"  # one A100-40GB
STOP = {"overBudget": "Stop", "foreignProcesses": "Report"}  # examples/team-quota.yaml's Stop
WINDOW_S = 15.0
"""Attack to outcome: a few audits (2 s apart) with the pod's log polled."""


@pytest.fixture(scope="module")
def bed(node_cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
        ) -> Iterator[Bed]:
    with gpu_bed(node_cluster, tmp_path_factory.mktemp("tessera-attacks")) as b:
        yield b


def line_seen(bed: Bed, ns: str, pod: str, text: str, timeout: float = 90,
              container: str | None = None) -> float:
    """When ``text`` first shows in the pod's log (polled)."""
    wait_until(f"{text!r} in {pod}'s log", lambda: text in bed.logs(ns, pod, container),
               timeout, 0.25)
    return time.monotonic()


def daemon_alive(bed: Bed, pid: int) -> None:
    """The node's tessera-node is the process it was (never restarted) and healthy."""
    d = bed.daemons[NODE]
    assert d.proc is not None and d.proc.poll() is None and d.proc.pid == pid, \
        d.log.read_text()[-3000:]
    assert d.get("/healthz")[0] == 200


def test_a_tenant_truncating_its_ledger_does_not_take_the_daemon_down(
        bed: Bed, node_namespace: str) -> None:
    """``: > /run/tessera/ledger; sleep 3`` killed tessera-node with SIGBUS (it kept the
    ledger mapped for the core controller). Now the daemon reads on, reports the container
    (an Event, a metric) and, the quota saying Stop, stops its GPU process at once."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, enforcement=STOP)
    d = bed.daemons[NODE]
    assert d.proc is not None
    pid = d.proc.pid
    bed.apply(ns, gpu_pod("truncator", "cuda-alloc 500 120 & sleep 3; : > /run/tessera/ledger; "
                          "echo truncated; sleep 3; wait $!; echo alloc=$?; sleep 60",
                          vgpu(1024, cores=50), node=NODE))  # core budget: controlled
    attacked = line_seen(bed, ns, "truncator", "truncated")
    stopped = line_seen(bed, ns, "truncator", "alloc=137", WINDOW_S)
    assert stopped - attacked < WINDOW_S
    events = wait_until("the Event", lambda: bed.events(ns, "truncator", REASON_TAMPERED), 30)
    assert "container main: its ledger was truncated to 0 bytes" in events[0], events
    assert "stopped (SIGKILL)" in " ".join(events), events
    assert d.metric("tessera_container_tampered", namespace=ns, pod="truncator") == 1
    time.sleep(3)  # the controller's periods and more audits over the truncated ledger
    daemon_alive(bed, pid)


def test_a_raw_driver_process_in_a_pod_with_two_gpu_containers_is_stopped(
        bed: Bed, node_namespace: str) -> None:
    """Container a of a two-container pod runs a process that goes around libtessera
    (cuda-raw: the driver's entry points from libcuda's symbol table) holding 3 GiB of its
    1 GiB budget. It was classed foreign (the registry had no container IDs) and never
    stopped; now it is a's, over a's budget, and stopped; b's process is untouched."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, enforcement=STOP)
    bed.apply(ns, gpu_pod("pair", "cuda-raw 3072 120; echo raw=$?; sleep 60",
                          vgpu(1024), node=NODE,
                          more={"b": ("cuda-alloc 500 60; echo b=$?; sleep 60", vgpu(1024))}))
    attacked = line_seen(bed, ns, "pair", "raw allocated 3072", container="main")
    line_seen(bed, ns, "pair", "allocated 500", container="b")
    stopped = line_seen(bed, ns, "pair", "raw=137", WINDOW_S, container="main")
    assert stopped - attacked < WINDOW_S
    assert "b=" not in bed.logs(ns, "pair", "b")  # b's process still holds its memory
    events = wait_until("the Event", lambda: [
        m for m in bed.events(ns, "pair", REASON_OVER_BUDGET) if "stopped" in m], 30)
    assert events[0].startswith("container main holds 3072 MiB"), events
    assert not bed.daemons[NODE].metric("tessera_node_foreign_gpu_processes")


def fake_budget(tmp: Path) -> str:
    """A budget file a tenant writes for itself: 64 GiB on its GPU (base64)."""
    p = tmp / "fake"
    with BudgetFile(p) as f:
        f.update([BudgetEntry(index=0, memory=64 << 30)])
    return base64.b64encode(p.read_bytes()).decode()


def test_a_budget_faked_in_a_user_namespace_is_refused_or_stopped(
        bed: Bed, node_namespace: str, tmp_path: Path) -> None:
    """``unshare -Urm`` and a bind mount over /run/tessera/budget. The runtime's default
    seccomp profile refuses the user namespace (the webhook gives it to a GPU pod naming
    none, and refuses ``Unconfined``); a pod under a permissive profile an administrator
    installed gets it, and then: a writable fake is not the runtime's read-only mount
    (libtessera refuses memory); one remounted read-only passes the library, but its process
    sees another budget file than the daemon's: tampering, stopped at once."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, enforcement=STOP)
    bed.apply(ns, gpu_pod("defaulted", "unshare -Urm true; echo unshare=$?", vgpu(1024),
                          node=NODE))
    line_seen(bed, ns, "defaulted", "unshare=1")
    unconfined = gpu_pod("unconfined", "true", vgpu(1024), node=NODE)
    unconfined["spec"]["securityContext"] = {"seccompProfile": {"type": "Unconfined"}}
    out = bed.cluster.kubectl("create", "-n", ns, "-f", "-", input=json.dumps(unconfined))
    assert out.returncode != 0 and "seccompProfile is Unconfined: not allowed in a pod with " \
        "a GPU budget" in out.stderr, out.stderr
    node = next(n for n in bed.cluster.nodes if n.name == NODE)
    profile = node.host_path(f"{KUBELET_ROOT}/seccomp/permissive.json")
    profile.parent.mkdir(parents=True, exist_ok=True)
    profile.write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')
    weak = "unshare -Urm sh -c 'mount --bind /tmp/fake /run/tessera/budget && cuda-info && " \
           "cuda-alloc 3000'; echo weak=$?"
    strong = ("unshare -Urm sh -c 'mount --bind /tmp/fake /run/tessera/budget && "
              "mount -o remount,ro,bind /run/tessera/budget && cuda-info && "
              "cuda-alloc 3000 120'; echo strong=$?")
    pod = gpu_pod("faker", f"echo $FAKE | base64 -d > /tmp/fake; {weak}; {strong}; sleep 60",
                  vgpu(1024), node=NODE, env={"FAKE": fake_budget(tmp_path)})
    pod["spec"]["containers"][0]["securityContext"] = {
        "seccompProfile": {"type": "Localhost", "localhostProfile": "permissive.json"}}
    bed.apply(ns, pod)
    line_seen(bed, ns, "faker", "weak=")
    logs = bed.logs(ns, "faker")
    assert "weak=1" in logs and "allocated 3000\n" not in logs.split("weak=")[0], logs
    assert "writable (not the read-only mount the runtime made)" in logs, logs
    attacked = line_seen(bed, ns, "faker", "allocated 3000")
    stopped = line_seen(bed, ns, "faker", "strong=137", WINDOW_S)
    assert stopped - attacked < WINDOW_S
    events = wait_until("the Event", lambda: bed.events(ns, "faker", REASON_TAMPERED), 30)
    assert "sees another budget file at /run/tessera/budget" in events[0], events


def test_a_zeroed_or_deleted_ledger_is_not_a_second_budget(bed: Bed,
                                                          node_namespace: str) -> None:
    """A process holds 600 of 1024 MiB; the tenant deletes the ledger (it cannot: a mount
    point), zeroes its header: the next process gets no memory (not a fresh budget), and the
    daemon treats the container as over budget at once: Stop, so the first process goes."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, enforcement=STOP)
    bed.apply(ns, gpu_pod("zeroer", "cuda-alloc 600 120 & sleep 3; "
                          "rm /run/tessera/ledger; echo rm=$?; "
                          "dd if=/dev/zero of=/run/tessera/ledger bs=4096 count=1 "
                          "conv=notrunc 2>/dev/null; echo zeroed; "
                          "cuda-alloc 600 60; echo second=$?; wait $!; echo first=$?; "
                          "sleep 60", vgpu(1024), node=NODE))
    attacked = line_seen(bed, ns, "zeroer", "zeroed")
    line_seen(bed, ns, "zeroer", "second=")
    logs = bed.logs(ns, "zeroer")
    assert "rm=1" in logs, logs  # the ledger is a mount point of the container's
    assert "second=1" in logs and logs.count("allocated 600") == 1, logs
    stopped = line_seen(bed, ns, "zeroer", "first=137", WINDOW_S)
    assert stopped - attacked < WINDOW_S
    events = bed.events(ns, "zeroer", REASON_TAMPERED)
    assert any("its ledger: not a version-1 ledger" in m for m in events), events


def test_zeroed_counts_over_the_budget_are_stopped_at_the_first_audit(
        bed: Bed, node_namespace: str) -> None:
    """The tenant zeroes the ledger's counts but keeps its header: a second process then
    gets memory through libtessera (only the node can know: the ledger does not account for
    what NVML shows), and the daemon stops both at once, saying why."""
    ns = node_namespace
    bed.cluster.wait_for_service_account(ns)
    bed.quota(ns, enforcement=STOP)
    zero = ("dd if=/dev/zero of=/run/tessera/ledger bs=128 seek=1 count=8 conv=notrunc "
            "2>/dev/null; dd if=/dev/zero of=/run/tessera/ledger bs=4096 seek=1 count=64 "
            "conv=notrunc 2>/dev/null")
    bed.apply(ns, gpu_pod("counts", f"cuda-alloc 600 120 & sleep 3; {zero}; echo zeroed; "
                          "cuda-alloc 600 120; echo second=$?; wait $!; echo first=$?; "
                          "sleep 60", vgpu(1024), node=NODE))
    attacked = line_seen(bed, ns, "counts", "zeroed")
    stopped = line_seen(bed, ns, "counts", "first=137", WINDOW_S)
    assert stopped - attacked < WINDOW_S
    assert "second=137" in bed.logs(ns, "counts")
    events = [m for m in bed.events(ns, "counts", REASON_OVER_BUDGET) if "stopped" in m]
    assert events and "its ledger accounts for 600 MiB of them" in events[0], events
