"""What a container sees of its node's GPUs, on the test bed's real kubelets: only what it was
allocated. The device plugin's ``sim`` visibility mounts exactly the units' device files
(a GPU's ``nvidia<minor>``; a MIG instance's, its GPU's and its GPU and compute instances'
access capabilities), as NVIDIA's container toolkit mounts the ``/dev`` nodes; the
simulator's NVML and CUDA inside enumerate only those, re-indexed from 0.

A cluster of its own: node-0 has three H100s (a pod with a whole GPU's budget, a pod whose
two containers each hold one share, a pod with two GPUs), node-1 two H100s, one partitioned
into three whole ``1g.10gb`` instances and one into two shared ones (a pod with a whole
instance, a pod with a share of one). In every container ``nvidia-smi -L``, NVML
(``nvml-info``) and nvidia-smi's memory totals are checked against what the kubelet says the
container holds (PodResources) and its budget.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tessera.api.names import API_VERSION, VGPU
from tessera.api.resources import mig_resource_name
from tessera.mig.catalog import profile
from tessera.models import get_model
from tessera_e2e.controlplane.cache import default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.gpubed.bed import SHARES, Bed, gpu_bed, gpu_pod, vgpu
from tessera_e2e.gpubed.daemons import KubeletNodeDaemon
from tessera_e2e.operator.replicas import wait_until
from tessera_node.deviceplugin.devices import unit_of
from tessera_node.deviceplugin.podresources import PodResourcesClient

pytestmark = [pytest.mark.integration]

GPUS = (("H100-80GB",) * 3, ("H100-80GB",) * 2)
H100_MIB = get_model("H100-80GB").memory_mib
INSTANCE_MIB = profile("H100-80GB", "1g.10gb").memory_mib
MIG_1G = mig_resource_name("1g.10gb")
NS = "visibility"
REPORT = ("nvidia-smi -L; echo ==; nvml-info; echo ==; "
          "nvidia-smi --query-gpu=uuid,memory.total --format=csv,noheader,nounits; echo ==; "
          "nvidia-smi; echo END; exec sleep 3600")
"""Each container's command: four sections, then it stays (PodResources lists running pods)."""

PODS: dict[str, dict[str, Any]] = {
    "whole": gpu_pod("whole", REPORT, vgpu(H100_MIB, cores=100)),
    "shares": gpu_pod("shares", REPORT, vgpu(2048), more={"b": (REPORT, vgpu(2048))}),
    "two": gpu_pod("two", REPORT, vgpu(2048, shares=2)),
    "mig-whole": gpu_pod("mig-whole", REPORT, {MIG_1G: "1"}, node="node-1"),
    "mig-shared": gpu_pod("mig-shared", REPORT, vgpu(3072), node="node-1"),
}
BUDGET_MIB = {("whole", "main"): H100_MIB, ("shares", "main"): 2048, ("shares", "b"): 2048,
              ("two", "main"): 1024, ("mig-whole", "main"): INSTANCE_MIB,
              ("mig-shared", "main"): 3072}
"""What nvidia-smi shows as each of a container's units' memory: its budget per unit (a
whole instance: all of it)."""


def partition(name: str, index: int, count: int, sharing: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": name},
            "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-1"}},
                     "gpus": {"indices": [index]},
                     "layout": {"profiles": [{"name": "1g.10gb", "count": count}]},
                     "sharing": sharing}}


@pytest.fixture(scope="module")
def bed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Bed[KubeletNodeDaemon]]:
    started = time.monotonic()
    cluster = LocalCluster(bin_dir, default_layout(), nodes=len(GPUS), gpu_models=GPUS,
                           report=lambda line: print(f"[cluster] {line}"))
    try:
        cluster.start()
    except ControlPlaneError as error:
        pytest.fail(f"local cluster: {error}", pytrace=False)
    try:
        with gpu_bed(cluster, tmp_path_factory.mktemp("tessera-visibility")) as b:
            print(f"\n[figures] visibility: cluster and tessera ready in "
                  f"{time.monotonic() - started:.0f}s")
            yield b
    finally:
        cluster.stop(keep_logs=request.session.testsfailed > 0)


def sections(log: str) -> list[list[str]]:
    """A container's report: ``-L``, ``nvml-info``, ``--query-gpu``, the default table."""
    assert log.rstrip().endswith("END"), log
    out: list[list[str]] = [[]]
    for line in log.rstrip().removesuffix("END").splitlines():
        if line == "==":
            out.append([])
        else:
            out[-1].append(line)
    assert len(out) == 4, log
    return out


def listing(lines: list[str]) -> list[tuple[str, str]]:
    """``nvidia-smi -L`` as (GPU or MIG, UUID) in order, checking the indices count from 0."""
    out, gpu, mig = [], 0, 0
    for line in lines:
        uuid = line.split("(UUID: ")[1].rstrip(")")
        if line.startswith("GPU "):
            assert line.startswith(f"GPU {gpu}: "), lines
            out.append(("GPU", uuid))
            gpu, mig = gpu + 1, 0
        else:
            assert re.match(rf"  MIG \S+\s+Device\s+{mig}: ", line), lines
            out.append(("MIG", uuid))
            mig += 1
    return out


def expected(host: list[tuple[str, str]], units: set[str]) -> list[tuple[str, str]]:
    """The node's ``-L`` reduced to a container's units: its GPUs, and its MIG devices under
    their GPUs."""
    parents, gpu = set(), ""
    for kind, uuid in host:
        gpu = uuid if kind == "GPU" else gpu
        if kind == "MIG" and uuid in units:
            parents.add(gpu)
    out, gpu = [], ""
    for kind, uuid in host:
        gpu = uuid if kind == "GPU" else gpu
        if uuid in units or (kind == "GPU" and uuid in parents):
            out.append((kind, uuid))
    return out


def test_each_container_sees_exactly_its_units(bed: Bed[KubeletNodeDaemon]) -> None:
    started = time.monotonic()
    bed.kubectl("create", "namespace", NS)
    bed.cluster.wait_for_service_account(NS)
    bed.quota(NS)
    for name in ("whole", "shares", "two"):
        bed.apply(NS, PODS[name])
    bed.apply("default", partition("vis-whole", 0, 3, "Whole"))
    bed.apply("default", partition("vis-shares", 1, 2, "Shares"))
    wait_until("node-1 advertising its whole and its shared instances", lambda: (
        a if (a := bed.allocatable("node-1")).get(MIG_1G) == "3"
        and a.get(VGPU) == str(2 * SHARES) else None), 180, 1)
    partitioned = time.monotonic()
    for name in ("mig-whole", "mig-shared"):
        bed.apply(NS, PODS[name])
    reports: dict[tuple[str, str], list[list[str]]] = {}
    for (pod, container) in BUDGET_MIB:
        bed.wait_phase(NS, pod, {"Running"})
        log = wait_until(f"{pod}/{container}'s report", lambda p=pod, c=container: (
            text if (text := bed.logs(NS, p, c)).rstrip().endswith("END") else None), 60, 0.5)
        reports[(pod, container)] = sections(log)
    ran = time.monotonic()
    host = {node: listing(d.smi("-L").stdout.splitlines()) for node, d in bed.daemons.items()}
    held: dict[tuple[str, str], set[str]] = {}
    for node in bed.daemons:
        client = PodResourcesClient(bed.daemons[node].podres.listen)
        pods = [(NS, p) for p, spec in PODS.items()
                if spec["spec"]["nodeSelector"]["kubernetes.io/hostname"] == node]
        for h in client.held(pods):
            held.setdefault((h.ref.pod, h.ref.container), set()).update(
                unit_of(d) for d in h.device_ids)
    placed = {}
    for (pod, container), (smi_l, nvml, query, table) in reports.items():
        node = PODS[pod]["spec"]["nodeSelector"]["kubernetes.io/hostname"]
        units = held[(pod, container)]
        placed[f"{pod}/{container}"] = sorted(u[:12] for u in units)
        want = expected(host[node], units)
        where = f"{pod}/{container} holding {sorted(units)}"
        # nvidia-smi -L: exactly its GPUs (and its MIG devices under their GPU), from 0
        assert listing(smi_l) == want, (where, smi_l)
        # NVML: the same devices, through the count, handles by index and MIG handles
        gpus = [line.split(", ") for line in nvml if re.match(r"\d+, ", line)]
        migs = [line.split(", ") for line in nvml if re.match(r"\d+:\d+, ", line)]
        assert [g[2] for g in gpus] == [u for k, u in want if k == "GPU"], (where, nvml)
        assert [m[2] for m in migs] == [u for k, u in want if k == "MIG"], (where, nvml)
        assert nvml[-1] == f"gpus {len(gpus)}", (where, nvml)
        # memory: each unit shows the container's budget there
        budget = str(BUDGET_MIB[(pod, container)])
        if migs:
            assert [m[3] for m in migs] == [budget] * len(migs), (where, nvml)
            rows = re.findall(r"^\|\s+\d+\s+\d+\s+\d+\s+\d+\s+\|\s+\d+MiB / (\d+)MiB", "\n".join(
                table), re.M)
            assert rows == [budget] * len(migs), (where, table)
        else:
            assert query == [f"{u}, {budget}" for _, u in want], (where, query)
            assert [g[3] for g in gpus] == [budget] * len(gpus), (where, nvml)
    # the pod of two shares holds two GPUs; each other container one unit
    assert {k: len(v) for k, v in held.items()} == {
        k: 2 if k == ("two", "main") else 1 for k in BUDGET_MIB}, held
    print(f"\n[figures] visibility: partition ready {partitioned - started:.0f}s, every "
          f"container's report {ran - started:.0f}s after the first pod; placed {placed}")
