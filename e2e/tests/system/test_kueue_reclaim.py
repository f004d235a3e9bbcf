"""Kueue over tessera on real nodes (issue 33): Kueue decides when and on which GPU model a
team's Jobs start, lends idle quota and takes it back; tessera holds every pod to its budget.

A cluster of its own: node-0 has an H100-80GB, node-1 an A100-40GB (real kubelets over
simulated GPUs); tessera's operator and node daemons run as the other system tests run them
(``gpu_bed``), and Kueue v0.17 with the recipe's manager configuration
(``examples/kueue/manager/kueue-config.yaml``), as ``test_kueue_build.py`` runs it. The queues
follow the recipe (docs/kueue.md): a ResourceFlavor per model (the label tessera's daemons
write), ClusterQueues over tessera's shared GPU resources with the recipe's preemption, and
in each team namespace a GPUQuota whose ``hard`` is what Kueue may admit there. Three scenes:

- **a flavor per model** (ClusterQueue ``models``, namespace team-c: one pod's quota on each
  model): two Jobs at once; Kueue gives one the H100 flavor and the other, the H100 quota
  being taken, the A100 flavor; each pod lands on its model's node and sees its budget there.
- **reclaim** (cohort ``reclaim``: ClusterQueue ``team-a`` with one slot of 16 GiB and 20% of
  the SMs nominal and 3 more it may borrow, ``team-b`` with 3 nominal slots it lends while
  idle, all on the H100): A's four Jobs run, three on B's quota; B submits three; Kueue
  preempts exactly three of A's (reclaimWithinCohort), B's pods run under their budgets, A's
  memory is gone from the GPU (NVML, per process, attributed to pods by their cgroups), and
  A's preempted Jobs run again once B's are done. Four slots are 65,536 MiB of the H100's
  81,559: a fifth pod does not fit the node, so B's pods cannot even be scheduled while A's
  hold the GPU.
- **admission fair sharing** (ClusterQueue ``shared``, ``UsageBasedAdmissionFairSharing``,
  team-a's and team-b's LocalQueues, one slot on the A100; beside it ``fifo``, the same
  without fair sharing): after team-a's heavy Job, team-a queues a Job and then team-b does;
  ``shared`` admits team-b's first, ``fifo`` team-a's.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Iterator
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import LABEL_GPU_PRODUCT, VGPU_CORES, VGPU_MEMORY
from tessera.api.quantity import quantity_value
from tessera.models import get_model
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.gpubed.bed import Bed, gpu_bed, gpu_pod
from tessera_e2e.gpubed.daemons import KubeletNodeDaemon
from tessera_e2e.kueue.manager import recipe_configuration
from tessera_e2e.kueue.objects import (
    Slot,
    admissible,
    cluster_queue,
    condition,
    flavor,
    local_queue,
    managed_namespace,
    queued_job,
)
from tessera_e2e.kueue.running import (
    admitted,
    admitted_at,
    apply,
    borrowed,
    evictions,
    flavor_of,
    get_json,
    kueue_on,
    preemption_events,
    wait_active,
    workload_of,
    workloads_by_job,
)
from tessera_e2e.operator.replicas import wait_until

pytestmark = [pytest.mark.integration]

H100, A100 = "H100-80GB", "A100-40GB"
NODE_OF = {H100: "node-0", A100: "node-1"}
FLAVOR_OF = {H100: "h100", A100: "a100"}
MODEL_SLOT = Slot(memory_mib=8192, cores=25)
RECLAIM_SLOT = Slot(memory_mib=16384, cores=20)
FAIR_SLOT = Slot(memory_mib=8192, cores=20)
B_RUNNING_WITHIN_S = 60
"""The stated bound: B's pods run under their budgets within this long of B's submission."""

CLUSTER_QUEUES = [
    cluster_queue("models", ["team-c"], {"h100": MODEL_SLOT.quotas(1),
                                         "a100": MODEL_SLOT.quotas(1)}),
    cluster_queue("team-a", ["team-a"], {"h100": RECLAIM_SLOT.quotas(1, borrowing=3)},
                  cohort="reclaim"),
    cluster_queue("team-b", ["team-b"], {"h100": RECLAIM_SLOT.quotas(3, borrowing=0)},
                  cohort="reclaim"),
    cluster_queue("shared", ["team-a", "team-b"], {"a100": FAIR_SLOT.quotas(1)},
                  fair_sharing=True),
    cluster_queue("fifo", ["team-a", "team-b"], {"a100": FAIR_SLOT.quotas(1)}),
]
LOCAL_QUEUES = [
    local_queue("team-c", "models", "models"),
    local_queue("team-a", "gpu", "team-a"), local_queue("team-b", "gpu", "team-b"),
    *(local_queue(ns, q, q) for q in ("shared", "fifo") for ns in ("team-a", "team-b")),
]
NAMESPACES = ("team-a", "team-b", "team-c")
OVER_BUDGET = "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY"


def ceiling(namespace: str) -> dict[str, Any]:
    """The namespace's GPUQuota ``hard`` as the recipe asks: all that Kueue may admit there,
    nominal + borrowing limit of every ClusterQueue its LocalQueues point to."""
    total: dict[str, Decimal] = defaultdict(Decimal)
    queues = {q["spec"]["clusterQueue"] for q in LOCAL_QUEUES
              if q["metadata"]["namespace"] == namespace}
    for cq in CLUSTER_QUEUES:
        if cq["metadata"]["name"] in queues:
            for resource, value in admissible(cq).items():
                total[resource] += value
    return {"memory": f"{int(total[VGPU_MEMORY])}Mi", "cores": int(total[VGPU_CORES]),
            "pods": 20}


@pytest.fixture(scope="module")
def bed(bin_dir: Path, kueue_binary: Path, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Bed[KubeletNodeDaemon]]:
    started = time.monotonic()
    cluster = LocalCluster(bin_dir, default_layout(), nodes=2, gpu_models=((H100,), (A100,)),
                           report=lambda line: print(f"[cluster] {line}"))
    try:
        cluster.start()
    except ControlPlaneError as error:
        pytest.fail(f"local cluster: {error}", pytrace=False)
    ready = False
    try:
        # Kueue first: its pod webhook (fail closed) must answer for the daemons' pods
        with kueue_on(cluster, kueue_binary), \
                gpu_bed(cluster, tmp_path_factory.mktemp("tessera-kueue")) as b:
            for ns in NAMESPACES:
                assert apply(cluster, [managed_namespace(ns)]).returncode == 0
                cluster.wait_for_service_account(ns)
            flavors = [flavor(FLAVOR_OF[m], m) for m in (H100, A100)]
            out = apply(cluster, [*flavors, *CLUSTER_QUEUES, *LOCAL_QUEUES])
            assert out.returncode == 0, out.stderr
            wait_active(cluster, [*CLUSTER_QUEUES, *LOCAL_QUEUES])
            for ns in NAMESPACES:  # max: the largest pod any scene runs
                b.quota(ns, hard=ceiling(ns), max_={"memory": "16Gi", "cores": 25})

            def labelled() -> bool:
                return all(get_json(cluster, "node", n)["metadata"]["labels"].get(
                    LABEL_GPU_PRODUCT) == m for m, n in NODE_OF.items())

            wait_until("each node labelled with its model by tessera-node", labelled, 60)
            ready = True
            print(f"\n[figures] kueue: cluster, Kueue, tessera and the queues ready in "
                  f"{time.monotonic() - started:.0f}s")
            yield b
    finally:
        cluster.stop(keep_logs=not ready or request.session.testsfailed > 0)


def budgeted(slot: Slot, hold_mib: int, seconds: int) -> str:
    """A pod's command: what its GPU looks like inside (NVML's name and memory total), an
    allocation just past its budget (refused), then ``hold_mib`` held for ``seconds``."""
    return (f"nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits; "
            f"cuda-alloc {slot.memory_mib + 16}; cuda-alloc {hold_mib} {seconds}")


def job(name: str, queue: str, command: str, slot: Slot) -> dict[str, Any]:
    return queued_job(name, queue, gpu_pod(name, command, slot.limits(), node=None)["spec"])


def submit(bed: Bed[Any], namespace: str, jobs: list[dict[str, Any]]) -> None:
    out = bed.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(
        {"apiVersion": "v1", "kind": "List", "items": jobs}))
    assert out.returncode == 0, out.stderr


def pods_of(bed: Bed[Any], namespace: str, job_name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = bed.get("pods", "-n", namespace, "-l",
                                          f"batch.kubernetes.io/job-name={job_name}")["items"]
    return items


def running_pod(bed: Bed[Any], namespace: str, job_name: str) -> dict[str, Any] | None:
    return next((p for p in pods_of(bed, namespace, job_name)
                 if p["status"].get("phase") == "Running"
                 and not p["metadata"].get("deletionTimestamp")), None)


def holding(bed: Bed[Any], namespace: str, pod: dict[str, Any], mib: int) -> bool:
    return f"allocated {mib}" in bed.logs(namespace, pod["metadata"]["name"]).splitlines()


def running_and_holding(bed: Bed[Any], namespace: str, jobs: list[str], mib: int
                        ) -> dict[str, dict[str, Any]] | None:
    """Each Job's running pod, once every one of them holds its ``mib``."""
    pods = {n: running_pod(bed, namespace, n) for n in jobs}
    held = {n: p for n, p in pods.items() if p is not None and holding(bed, namespace, p, mib)}
    return held if len(held) == len(jobs) else None


def check_budget(log: str, slot: Slot, model: str, hold_mib: int) -> None:
    """The pod saw its model with its budget as the GPU's memory, was refused past the
    budget and got what it held."""
    lines = log.splitlines()
    seen = {f"{name}, {slot.memory_mib}" for name in get_model(model).nvml_names}
    assert seen & set(lines), (seen, log)
    assert OVER_BUDGET in lines and f"allocated {slot.memory_mib + 16}" not in lines, log
    assert f"allocated {hold_mib}" in lines, log


def complete(bed: Bed[Any], namespace: str, job_name: str) -> bool:
    status = bed.get("job", "-n", namespace, job_name).get("status") or {}
    return int(status.get("succeeded") or 0) == 1


def test_a_flavor_per_model_puts_each_job_on_its_models_node(
        bed: Bed[KubeletNodeDaemon]) -> None:
    """Two Jobs in one apply, one pod's quota per model: Kueue admits one on the H100
    flavor and, that quota taken, the other on the A100 flavor; each pod runs on the node
    of its flavor's model and sees that model with its budget as the GPU's memory."""
    started = time.monotonic()
    names = ("model-1", "model-2")
    submit(bed, "team-c", [job(n, "models", budgeted(MODEL_SLOT, 8000, 1), MODEL_SLOT)
                           for n in names])

    def both_admitted() -> dict[tuple[str, str], dict[str, Any]] | None:
        wls = workloads_by_job(bed.cluster, "team-c")
        return wls if all(admitted(wls.get(("team-c", n))) for n in names) else None

    workloads = wait_until("both Workloads admitted", both_admitted, 60)
    model_of = {FLAVOR_OF[m]: m for m in FLAVOR_OF}
    models = {n: model_of[flavor_of(workloads[("team-c", n)], VGPU_MEMORY)] for n in names}
    assert sorted(models.values()) == sorted((H100, A100)), models
    placed = {}
    for name, model in models.items():
        wait_until(f"{name} complete", partial(complete, bed, "team-c", name), 90)
        (pod,) = pods_of(bed, "team-c", name)
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert pod["spec"]["nodeSelector"][LABEL_GPU_PRODUCT] == model, pod["spec"]
        node = pod["spec"]["nodeName"]
        assert node == NODE_OF[model], (name, model, node)
        assert bed.get("node", node)["metadata"]["labels"][LABEL_GPU_PRODUCT] == model
        check_budget(bed.logs("team-c", pod["metadata"]["name"]), MODEL_SLOT, model, 8000)
        placed[name] = f"{model} on {node}"
    print(f"\n[figures] kueue flavors: {placed}, both done "
          f"{time.monotonic() - started:.0f}s after the apply")


A_JOBS = [f"a-{i}" for i in range(4)]
B_JOBS = [f"b-{i}" for i in range(3)]
A_HOLD_MIB, B_HOLD_MIB = 16000, 15000
A_SECONDS, B_SECONDS = 25, 8


def test_b_reclaims_its_lent_quota_and_runs_under_budgets_while_a_requeues(
        bed: Bed[KubeletNodeDaemon]) -> None:
    cluster, node = bed.cluster, NODE_OF[H100]
    # the node holds four slots, not five: B's pods wait for A's to be gone
    assert 4 * RECLAIM_SLOT.memory_mib <= int(bed.allocatable(node)[VGPU_MEMORY]) \
        < 5 * RECLAIM_SLOT.memory_mib
    submit(bed, "team-a", [job(n, "gpu", budgeted(RECLAIM_SLOT, A_HOLD_MIB, A_SECONDS),
                               RECLAIM_SLOT) for n in A_JOBS])
    wait_until("A's four Workloads admitted", lambda: all(
        admitted(workload_of(cluster, "team-a", n)) for n in A_JOBS), 60)
    # one slot is A's own, three are B's idle quota lent through the cohort
    wait_until("team-a borrowing three slots", lambda: borrowed(
        cluster, "team-a", "h100", VGPU_MEMORY) == 3 * RECLAIM_SLOT.memory_mib, 30)
    first: dict[str, dict[str, Any]] = wait_until(
        "A's four pods running with their memory",
        lambda: running_and_holding(bed, "team-a", A_JOBS, A_HOLD_MIB), 90, 0.5)
    a_uid = {n: p["metadata"]["uid"] for n, p in first.items()}
    for pod in first.values():
        assert pod["spec"]["nodeName"] == node, pod["spec"]
        check_budget(bed.logs("team-a", pod["metadata"]["name"]), RECLAIM_SLOT, H100,
                     A_HOLD_MIB)
    before = bed.gpu_memory_by_pod(node)
    assert {before.get(uid) for uid in a_uid.values()} == {A_HOLD_MIB}, before

    # B wants its nominal quota, all of it lent to A
    submitted = time.monotonic()
    submit(bed, "team-b", [job(n, "gpu", budgeted(RECLAIM_SLOT, B_HOLD_MIB, B_SECONDS),
                               RECLAIM_SLOT) for n in B_JOBS])
    at: dict[str, float] = {}  # seconds after B's submission
    b_pods: dict[str, dict[str, Any]] = {}
    after: dict[str, int] = {}  # NVML's view when B's pods all hold their memory
    while len(at) < 3:
        assert time.monotonic() - submitted < 120, (at, bed.gpu_memory_by_pod(node))
        now = time.monotonic() - submitted
        if "returned" not in at and sum(bed.gpu_memory_by_pod(node).get(uid, 0)
                                        for uid in a_uid.values()) <= A_HOLD_MIB:
            at["returned"] = now  # at most the one slot of A's own still held
        if "running" not in at and all(running_pod(bed, "team-b", n) for n in B_JOBS):
            at["running"] = now
        if "running" in at and "allocated" not in at and (
                pods := running_and_holding(bed, "team-b", B_JOBS, B_HOLD_MIB)):
            at["allocated"], b_pods, after = now, pods, bed.gpu_memory_by_pod(node)
        time.sleep(0.25)

    workloads = {n: workload_of(cluster, "team-a", n) for n in A_JOBS}
    preempted = sorted(n for n, w in workloads.items() if w is not None and evictions(w))
    preemptions = sum(evictions(w) for w in workloads.values() if w is not None)
    needed = len(B_JOBS)  # B needs three slots; the cohort's four were all A's
    assert preemptions == len(preempted) == needed, (preemptions, preempted)
    def all_recorded() -> dict[str, list[str]] | None:  # Events are written asynchronously
        e = preemption_events(cluster, "team-a")
        return e if sum(len(m) for m in e.values()) >= needed else None

    try:
        events = wait_until("Kueue's Preempted Events on A's Workloads", all_recorded, 30)
    except TimeoutError as error:
        raise AssertionError(bed.kubectl("get", "events", "-n", "team-a").stdout) from error
    for n in preempted:
        w = workloads[n]
        assert w is not None
        (message,) = events[w["metadata"]["name"]]
        assert "due to reclamation within the cohort" in message, message
        assert a_uid[n] not in after, (n, after)  # nothing of it left on the GPU
    assert sum(len(m) for m in events.values()) == needed, events
    returned = sum(before[a_uid[n]] for n in preempted)
    for n, pod in b_pods.items():
        assert pod["spec"]["nodeName"] == node, pod
        assert after.get(pod["metadata"]["uid"]) == B_HOLD_MIB, (n, after)
        check_budget(bed.logs("team-b", pod["metadata"]["name"]), RECLAIM_SLOT, H100,
                     B_HOLD_MIB)
    assert at["allocated"] < B_RUNNING_WITHIN_S, at
    survivor = (set(A_JOBS) - set(preempted)).pop()

    # A's preempted Jobs are requeued, admitted again once B's are done, and finish
    wait_until("every Job of A and B complete", lambda: all(
        complete(bed, ns, n) for ns, names in (("team-a", A_JOBS), ("team-b", B_JOBS))
        for n in names), 180, 1)
    finished = time.monotonic() - submitted
    for n in A_JOBS:
        (pod,) = pods_of(bed, "team-a", n)  # the preempted run's pod is gone
        assert (pod["metadata"]["uid"] == a_uid[n]) == (n == survivor), (n, pod["metadata"])
        assert pod["spec"]["nodeName"] == node
        check_budget(bed.logs("team-a", pod["metadata"]["name"]), RECLAIM_SLOT, H100,
                     A_HOLD_MIB)
    for n in preempted:
        w = workload_of(cluster, "team-a", n)
        assert w is not None and evictions(w) == 1, w  # preempted once, then ran through
    # a pod deleted by Kueue's suspension is no failure: preemption spends no backoffLimit
    failed = {n: int(bed.get("job", "-n", "team-a", n)["status"].get("failed") or 0)
              for n in A_JOBS}
    assert not any(failed.values()), failed
    assert not any(bed.gpu_memory_by_pod(node).values()), "GPU memory left after every Job"
    print(f"\n[figures] kueue reclaim: B's 3 pods Running {at['running']:.1f}s and holding "
          f"their memory under their budgets {at['allocated']:.1f}s after B's submission "
          f"(stated bound {B_RUNNING_WITHIN_S}s); A's GPU memory returned: {returned} MiB "
          f"(NVML on {node}, {len(preempted)} pods), gone {at['returned']:.1f}s after B's "
          f"submission; preemptions {preemptions} for a reclaim of {needed} slots (needed "
          f"{needed}); A's preempted Jobs requeued and all Jobs done {finished:.0f}s after, "
          f"none of them failed")


HEAVY_SECONDS = 15
TEAMS = ("team-a", "team-b")


def test_admission_fair_sharing_admits_the_team_with_less_use_first(
        bed: Bed[KubeletNodeDaemon]) -> None:
    """In both ClusterQueues (one slot each): team-a's heavy Job holds the slot, then
    team-a queues a Job, then team-b does. FIFO admits team-a's first; admission fair
    sharing, team-a's decayed usage being above team-b's none, admits team-b's although it
    came later."""
    cluster = bed.cluster
    queues = ("shared", "fifo")
    submit(bed, "team-a", [job(f"heavy-{q}", q, f"cuda-alloc 8000 {HEAVY_SECONDS}",
                               FAIR_SLOT) for q in queues])
    wait_until("team-a's heavy Jobs admitted", lambda: all(
        admitted(workload_of(cluster, "team-a", f"heavy-{q}")) for q in queues), 60)
    nexts = {(q, ns): f"{ns}-next-{q}" for q in queues for ns in TEAMS}
    for ns in TEAMS:
        submit(bed, ns, [job(nexts[(q, ns)], q, "cuda-alloc 1000 3", FAIR_SLOT)
                         for q in queues])
        wait_until(f"{ns}'s next Workloads", partial(all_made, cluster, ns, [
            nexts[(q, ns)] for q in queues]), 30)
        if ns == "team-a":
            time.sleep(1.5)  # Kueue's FIFO order is the Workloads' creation, in seconds
    wls = workloads_by_job(cluster)
    for q in queues:  # the scene holds only if both still wait behind the heavy Job
        heavy = wls[("team-a", f"heavy-{q}")]
        assert admitted(heavy) and condition(heavy, "Finished") != "True", heavy["status"]
        assert not any(admitted(wls[(ns, nexts[(q, ns)])]) for ns in TEAMS), q
    queued = {ns: consumed(cluster, ns, "shared") for ns in TEAMS}  # while both wait
    assert queued["team-a"] > queued["team-b"] == 0, queued  # team-a's heavy use counted
    def all_admitted() -> dict[tuple[str, str], dict[str, Any]] | None:
        w = workloads_by_job(cluster)
        return w if all(admitted(w.get((ns, n))) for (_, ns), n in nexts.items()) else None

    wls = wait_until("the next Jobs admitted, one after the other", all_admitted,
                     HEAVY_SECONDS + 90, 1)
    when = {key: admitted_at(wls[(key[1], n)]) for key, n in nexts.items()}
    first = {}
    for q in queues:
        times = {ns: when[(q, ns)] for ns in TEAMS}
        assert times["team-a"] != times["team-b"], times  # one slot: one after the other
        first[q] = min(TEAMS, key=times.__getitem__)  # RFC 3339 sorts as time
    assert first == {"shared": "team-b", "fifo": "team-a"}, (first, when, queued)
    wait_until("every Job complete", lambda: all(
        complete(bed, ns, n) for (_, ns), n in nexts.items()), 90, 1)
    print(f"\n[figures] kueue admission fair sharing: admitted first after team-a's heavy "
          f"use: {first['shared']} (fair sharing) vs {first['fifo']} (FIFO); admitted at "
          f"{when}; the LocalQueues' usage in their status while both waited (weighted as "
          f"the recipe weighs, half-life 168h) {queued}")


def all_made(cluster: LocalCluster, namespace: str, jobs: list[str]) -> bool:
    """Whether Kueue has made the Workloads of all the Jobs."""
    wls = workloads_by_job(cluster, namespace)
    return all((namespace, n) in wls for n in jobs)


def consumed(cluster: LocalCluster, namespace: str, queue: str) -> float:
    """A LocalQueue's decayed usage as Kueue last wrote it, weighed as the recipe's
    configuration weighs resources (Kueue orders by it, with the penalties of recent
    admissions added in memory)."""
    lq = get_json(cluster, "localqueue", "-n", namespace, queue)
    status = ((lq.get("status") or {}).get("fairSharing") or {}).get(
        "admissionFairSharingStatus") or {}
    weights = recipe_configuration()["admissionFairSharing"]["resourceWeights"]
    return sum(float(weights.get(r, 1)) * float(quantity_value(str(v)))
               for r, v in (status.get("consumedResources") or {}).items())
