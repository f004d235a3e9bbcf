"""charts/tessera installed with the real helm onto a cluster of two real nodes.

One cluster for the module, the tests in order: install (operator 2/2 Ready, one Ready daemon
per node, webhooks patched with the operator's CA, libtessera installed by each daemon on its
host under ``<state dir>/lib/<content digest>``), a MIG GPUPartition enacted by the chart's
daemon (through the simulator's nvidia-smi in its driver root) and reset, a budgeted
``tessera.dev/vgpu`` pod admitted, scheduled, allocated by the chart's daemon and run under
its budget, upgrade to a new image (with a libtessera build that differs) and a changed
value (GPU pod creates all through the rollout are all admitted; the quota's count, the running
pod's budget and the old libtessera survive; a new pod runs under the new daemon), uninstall
(only the CRDs stay; no webhook, Lease, Secret or tessera Node key is left). Timings go to
stderr (`pytest -s`) for e2e/README.md. The whole chain against the chart-installed tessera
is test_whole_chain.py and test_core_sharing.py (the ``chart_bed`` fixture).
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tessera.api.names import (
    API_VERSION,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    MIG_PREFIX,
    PREFIX,
    VGPU,
    VGPU_CORES,
    VGPU_MEMORY,
)
from tessera_e2e.chart.bed import (
    LIBTESSERA_BUILD,
    NS,
    TAG,
    chart_cluster,
    daemon_pods,
    deployment_ready,
    install,
    operator_pods,
    ready,
    release_values,
    say,
    wait_daemons_ready,
)
from tessera_e2e.chart.helm import Helm, get_json
from tessera_e2e.chart.tessera_images import ensure_tessera_images
from tessera_e2e.controlplane.cache import Layout, default_layout
from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.gpubed.bed import claim_pod, resize_pod
from tessera_e2e.gpubed.daemons import node_smi
from tessera_e2e.operator.admission_probe import DryRunCreates
from tessera_e2e.operator.quotas import wait_admitting
from tessera_e2e.operator.replicas import wait_until
from tessera_e2e.paths import REPO
from tessera_node.container.library import version_of
from tessera_node.container.response import preload_line
from tessera_node.settings import DEFAULTS, LIB_DIR

pytestmark = [pytest.mark.integration, pytest.mark.oldest_kubernetes]

NEW_TAG = "0.1.0-upgrade"
TEAM = "team-a"
LIBTESSERA = LIBTESSERA_BUILD / "libtessera.so"


def _rebuilt_libtessera(into: Path, tag: str) -> Path:
    """The same libtessera with a build note naming ``tag``: another build of the library, as
    a new release's would be, so its content digest (its install version) differs."""
    note = into / "build-note"
    note.write_text(f"tessera {tag}\n")
    out = subprocess.run(["objcopy", "--add-section", f".note.tessera.build={note}",
                          str(LIBTESSERA), str(into / "libtessera.so")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, f"objcopy (binutils): {out.stderr}"
    return into


class Installed:
    def __init__(self, cluster: LocalCluster, helm: Helm, new_lib: Path) -> None:
        self.cluster = cluster
        self.helm = helm
        self.new_lib = new_lib  # the libtessera of the NEW_TAG image
        self.values: dict[str, Any] = {}

    def kubectl(self, *args: str, input: str | None = None) -> Any:
        out = self.cluster.kubectl(*args, input=input)
        assert out.returncode == 0, f"kubectl {' '.join(args)}: {out.stderr}"
        return out


@pytest.fixture(scope="module")
def bed(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Installed]:
    hook_builds = {TAG: LIBTESSERA_BUILD,
                   NEW_TAG: _rebuilt_libtessera(tmp_path_factory.mktemp("lib"), NEW_TAG)}
    try:
        with chart_cluster(bin_dir, tmp_path_factory.mktemp("helm"), hook_builds,
                           lambda: request.session.testsfailed > 0) as (cluster, helm):
            yield Installed(cluster, helm, hook_builds[NEW_TAG] / "libtessera.so")
    except ControlPlaneError as error:
        pytest.fail(str(error), pytrace=False)


def test_install_brings_up_the_operator_and_a_daemon_per_node(bed: Installed) -> None:
    cluster = bed.cluster
    names = [node.name for node in cluster.nodes]
    bed.values = release_values(cluster)
    install(cluster, bed.helm, bed.values)
    assert deployment_ready(cluster)
    operators = operator_pods(cluster)
    assert len(operators) == 2 and all(ready(p) for p in operators)
    daemons = daemon_pods(cluster)
    assert sorted(p["spec"]["nodeName"] for p in daemons) == sorted(names)
    assert all(ready(p) for p in daemons), [p["status"] for p in daemons]
    # the namespace states the PodSecurity level the daemon needs (privileged, hostPID)
    assert get_json(cluster, "namespace", NS)["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "privileged"
    # the operator set the chart's webhook configurations' CA to its serving certificate's
    secret = get_json(cluster, "secret", "tessera-webhook-tls", "-n", NS)

    def patched(kind: str, name: str) -> bool:
        hooks = get_json(cluster, kind, name)["webhooks"]
        return len(hooks) > 0 and all(h["clientConfig"].get("caBundle") == secret["data"][
            "ca.crt"] for h in hooks)

    for kind, name in (("mutatingwebhookconfiguration", "tessera-pods"),
                       ("validatingwebhookconfiguration", "tessera-resources")):
        wait_until(f"{name} caBundle", functools.partial(patched, kind, name), 60)
    # each daemon reported its node's GPUs, advertises tessera's shares to its kubelet, and
    # installed the image's libtessera on its host, versioned by content
    for node in cluster.nodes:
        labels = get_json(cluster, "node", node.name)["metadata"]["labels"]
        assert any(k.startswith(PREFIX) for k in labels), labels
        wait_until(f"{node.name} advertising {VGPU}", lambda node=node: get_json(
            cluster, "node", node.name)["status"].get("allocatable", {}).get(VGPU) == str(
            DEFAULTS.shares_per_unit), 60)
        lib = node.host_path(f"{DEFAULTS.state_dir}/{LIB_DIR}")
        assert [p.name for p in lib.iterdir()] == [version_of(LIBTESSERA.read_bytes())]
        installed = lib / version_of(LIBTESSERA.read_bytes())
        assert (installed / "libtessera.so").read_bytes() == LIBTESSERA.read_bytes()
        assert (installed / "ld.so.preload").read_text() == preload_line()


def _smi(bed: Installed, node: int, *args: str) -> str:
    out = node_smi(bed.cluster.nodes[node], *args)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def _gpart_row(bed: Installed, name: str) -> list[str]:
    out = bed.cluster.kubectl("get", "gpart", name, "--no-headers")
    return out.stdout.split() if out.returncode == 0 else []


def test_a_mig_partition_is_enacted_by_the_installed_daemon_and_reset(bed: Installed) -> None:
    """The chart's daemon runs nvidia-smi from the driver root it mounts (the simulator's
    launcher runs the image's Python): node-0's H100 is split into seven 1g.10gb instances,
    reported Ready, visible through NVML on the host; deleting the partition
    (deletionPolicy Reset) turns MIG off again."""
    started = time.monotonic()
    name = "chart-mig"
    bed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "GPUPartition", "metadata": {"name": name},
        "spec": {"nodeSelector": {"matchLabels": {"kubernetes.io/hostname": "node-0"}},
                 "layout": {"profiles": [{"name": "1g.10gb", "count": 7}]},
                 "sharing": "Whole", "deletionPolicy": "Reset"}}))
    try:
        # NAME SELECTED READY LAYOUT AGE
        wait_until("the partition Ready", lambda: _gpart_row(bed, name)[1:4] == [
            "1", "1", "7x1g.10gb"], 180, 1)
        say(f"MIG partition enacted by the chart's daemon: {time.monotonic() - started:.1f}s")
        assert _smi(bed, 0, "mig", "-lgi").count("MIG 1g.10gb") == 7
        assert _smi(bed, 0, "--query-gpu=mig.mode.current",
                    "--format=csv,noheader").split() == ["Enabled"]
        assert _smi(bed, 1, "--query-gpu=mig.mode.current",
                    "--format=csv,noheader").split() == ["Disabled"]  # not selected
        wait_until("node-0 advertising 7 instances", lambda: get_json(
            bed.cluster, "node", "node-0")["status"].get("allocatable", {}).get(
            f"{MIG_PREFIX}1g.10gb") == "7", 60, 1)
    finally:
        bed.kubectl("delete", "gpupartition", name, "--wait=false")
    wait_until("the partition removed after its reset", lambda: bed.cluster.kubectl(
        "get", "gpupartition", name).returncode != 0, 180, 1)
    assert _smi(bed, 0, "--query-gpu=mig.mode.current",
                "--format=csv,noheader").split() == ["Disabled"]
    wait_until("node-0 advertising whole-GPU shares again", lambda: get_json(
        bed.cluster, "node", "node-0")["status"].get("allocatable", {}).get(VGPU) == str(
        DEFAULTS.shares_per_unit), 60, 1)
    say(f"MIG partition enacted and reset: {time.monotonic() - started:.1f}s")


def _quota_used(bed: Installed) -> dict[str, Any]:
    q = get_json(bed.cluster, "gpuquota", "team", "-n", TEAM)
    used: dict[str, Any] = (q.get("status") or {}).get("used") or {}
    return used


def test_a_gpu_pod_is_admitted_and_counted_through_the_installed_webhooks(
        bed: Installed) -> None:
    bed.kubectl("create", "namespace", TEAM)
    bed.cluster.wait_for_service_account(TEAM)
    bed.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "tessera.dev/v1alpha1", "kind": "GPUQuota",
        "metadata": {"name": "team", "namespace": TEAM},
        "spec": {"hard": {"memory": "10Gi", "cores": 100, "pods": 4}}}))
    wait_until("the quota counted", lambda: "pods" in _quota_used(bed), 60)
    # the API server refuses GPU pods until its quota controller has counted the managed
    # ResourceQuota ("status unknown for quota"), a moment after tessera made it
    wait_admitting(bed.cluster, TEAM, timeout_s=60)
    # The chart's daemon allocates it: libtessera (from lib/<digest>) holds it to 2048 MiB.
    started = time.monotonic()
    _create_gpu_pod(bed, "gpu", "cuda-info && cuda-alloc 2000 && cuda-alloc 2100; "
                    "exec sleep 3600", 2048)
    pod = get_json(bed.cluster, "pod", "gpu", "-n", TEAM)
    assert pod["metadata"]["annotations"].get(f"{PREFIX}budget"), pod["metadata"]
    wait_until("the pod counted", lambda: _quota_used(bed).get("pods") == 1, 60)
    wait_until("the pod running", lambda: get_json(bed.cluster, "pod", "gpu", "-n", TEAM)[
        "status"].get("phase") == "Running", 120, 0.5)
    say(f"budgeted vgpu pod create to Running: {time.monotonic() - started:.1f}s")
    lines = wait_until("the pod's CUDA programs done", lambda: (
        out if "cuda-alloc: cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY" in (
            out := bed.kubectl("logs", "-n", TEAM, "gpu").stdout.splitlines()) else None), 60)
    # cuMemGetInfo inside shows the budget, not the GPU's memory; past it, out of memory
    assert next(x for x in lines if x.startswith("0 ")).split()[-2:] == ["2048", "2048"], lines
    assert "allocated 2000" in lines and "allocated 2100" not in lines, lines


def _gpu_pod(name: str, command: str, memory_mib: int) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": TEAM},
        "spec": {"containers": [{"name": "main", "image": "tessera.local/workload:1",
                                 "imagePullPolicy": "Never", "command": ["sh", "-c", command],
                                 "resources": {"limits": {
                                     VGPU: "1", VGPU_MEMORY: str(memory_mib),
                                     VGPU_CORES: "50"}}}],
                 "restartPolicy": "Never", "terminationGracePeriodSeconds": 1}})


def _create_gpu_pod(bed: Installed, name: str, command: str, memory_mib: int) -> None:
    bed.kubectl("create", "-f", "-", input=_gpu_pod(name, command, memory_mib))


def test_upgrade_to_a_new_image_and_value_keeps_the_count_and_old_libtessera(
        bed: Installed) -> None:
    before = _quota_used(bed)
    assert before.get("pods") == 1, before
    old_daemons = {p["metadata"]["uid"] for p in daemon_pods(bed.cluster)}
    old_operators = {p["metadata"]["uid"] for p in operator_pods(bed.cluster)}
    # The live GPUQuota CRD as an older release left it (no printer columns): Helm never
    # upgrades crds/, the documented `kubectl apply --server-side` of the chart's does.
    bed.kubectl("patch", "crd", "gpuquotas.tessera.dev", "--type=json", "-p",
                '[{"op": "remove", "path": "/spec/versions/0/additionalPrinterColumns"}]')
    values = json.loads(json.dumps(bed.values))
    values["image"]["tag"] = NEW_TAG
    values["operator"]["leaseDurationSeconds"] = 20
    started = time.monotonic()
    # GPU pods are created all through the rollout (server-side dry runs through the pod
    # webhook, failurePolicy Fail): a replica going away must not fail one
    with DryRunCreates(bed.cluster.kubectl, lambda i: _gpu_pod(f"probe-{i}", "true", 1024)
                       ) as creates:
        out = bed.helm.upgrade(NS, values)
        say(f"helm upgrade to Ready: {time.monotonic() - started:.1f}s")
        assert out.returncode == 0, out.stderr + out.stdout
        assert deployment_ready(bed.cluster)
        wait_daemons_ready(bed.cluster, lambda p: p["metadata"]["uid"] not in old_daemons
                           and p["spec"]["containers"][0]["image"].endswith(NEW_TAG))
        wait_until("the old operator pods gone", lambda: not {
            p["metadata"]["uid"] for p in operator_pods(bed.cluster)} & old_operators, 120, 1)
        seen = creates.ok
        wait_until("creates after the rollout", lambda: creates.ok >= seen + 5, 30)
    say(f"dry-run GPU pod creates during the upgrade: {creates.ok} admitted, "
        f"{len(creates.failed)} failed")
    assert creates.failed == [], creates.failed
    operators = get_json(bed.cluster, "deployment", "tessera-operator", "-n", NS)
    container = operators["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].endswith(f":{NEW_TAG}")
    assert "--lease-duration=20" in container["args"]
    crd = get_json(bed.cluster, "crd", "gpuquotas.tessera.dev")
    assert "additionalPrinterColumns" not in crd["spec"]["versions"][0]  # Helm left it
    bed.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                f"{REPO / 'charts' / 'tessera' / 'crds'}/")  # the docs' command
    crd = get_json(bed.cluster, "crd", "gpuquotas.tessera.dev")
    shipped = yaml.safe_load((REPO / "crds" / "gpuquotas.tessera.dev.yaml").read_text())
    assert crd["spec"]["versions"][0]["additionalPrinterColumns"] == shipped["spec"][
        "versions"][0]["additionalPrinterColumns"]
    # the count survived the operators' rollout (the recount finds the pod again)
    wait_until("quota recounted by the new operators", lambda: _quota_used(bed) == before, 60)
    # both versions of libtessera, each under its content digest: a running container keeps
    # the one it mapped, new containers get the new one
    versions = {version_of(LIBTESSERA.read_bytes()), version_of(bed.new_lib.read_bytes())}
    assert len(versions) == 2
    for node in bed.cluster.nodes:
        lib = node.host_path(f"{DEFAULTS.state_dir}/{LIB_DIR}")
        assert {p.name for p in lib.iterdir()} == versions
    # the running pod kept its budget through the daemons' restart
    info = bed.kubectl("exec", "-n", TEAM, "gpu", "--", "cuda-info").stdout.splitlines()
    assert next(x for x in info if x.startswith("0 ")).split()[-2:] == ["2048", "2048"], info
    # and the new daemon allocates: a new pod runs under its budget
    _create_gpu_pod(bed, "after", "cuda-alloc 1000 && cuda-alloc 1100", 1024)
    done = wait_until("the new pod done", lambda: (
        p if (p := get_json(bed.cluster, "pod", "after", "-n", TEAM))["status"].get("phase")
        in ("Succeeded", "Failed") else None), 120, 0.5)
    logs = bed.kubectl("logs", "-n", TEAM, "after").stdout.splitlines()
    assert done["status"]["phase"] == "Failed", logs
    assert "allocated 1000" in logs and "allocated 1100" not in logs, logs


def test_a_dra_pool_of_the_chart_prepares_claims_and_resizes_one(bed: Installed) -> None:
    """``helm upgrade`` with ``nodeDaemon.dra.nodeLabels`` picking node-1: its daemon is
    replaced by ``tessera-node-dra``, which registers with the kubelet, publishes the GPU and
    prepares a claim through the chart's mounts (the kubelet's plugin sockets, the CDI
    directory). The claim's container sees its 4 GiB, and ``tessera resize`` grows it to 8 GiB
    through the chart's operator (it reads the claim and labels its pod). On 1.34, whose API
    server drops consumable capacity, the claim takes the whole GPU and its resize is refused
    with why."""
    node = bed.cluster.nodes[1].name
    values = json.loads(json.dumps(bed.values))
    values["image"]["tag"] = NEW_TAG
    values["operator"]["leaseDurationSeconds"] = 20
    values.setdefault("nodeDaemon", {})["dra"] = {"nodeLabels": {"kubernetes.io/hostname": node}}
    started = time.monotonic()
    out = bed.helm.upgrade(NS, values)
    assert out.returncode == 0, out.stderr + out.stdout
    wait_daemons_ready(bed.cluster, lambda p: (p["spec"]["nodeName"] == node) == (
        p["metadata"]["labels"].get("tessera.dev/node-daemon") == "dra"))
    devices = wait_until(f"{node}'s ResourceSlice", lambda: [
        d for s in get_json(bed.cluster, "resourceslices", "--field-selector",
                            f"spec.nodeName={node}")["items"]
        if s["spec"]["driver"] == DRA_DRIVER for d in s["spec"].get("devices") or []], 90, 1)
    say(f"helm upgrade to a DRA pool, its slice published: {time.monotonic() - started:.1f}s")
    ns = "dra"
    bed.kubectl("create", "namespace", ns)
    bed.cluster.wait_for_service_account(ns)
    bed.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "share"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": DRA_DEVICE_CLASS,
            "capacity": {"requests": {"memory": "4Gi", "cores": "30"}}}}]}}}}))
    bed.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(claim_pod(
        "claimer", "cuda-info; exec sleep 3600", template="share", node=node)))
    try:
        wait_until("the claim's pod running", lambda: get_json(
            bed.cluster, "pod", "claimer", "-n", ns)["status"].get("phase") == "Running",
                   120, 0.5)

        def seen() -> int:
            info = bed.kubectl("exec", "-n", ns, "claimer", "--", "cuda-info").stdout
            return int(next(x for x in info.splitlines() if x.startswith("0 ")).split()[-2])

        whole = int(devices[0]["attributes"]["memoryMiB"]["int"])
        if bed.cluster.server_minor() < 36:  # the claim took the GPU whole: nothing to grow
            assert seen() == whole
            r = resize_pod(bed.cluster.kubeconfig, ns, "claimer", "--memory", "8Gi")
            assert r.returncode == 1 and "has device gpu0 whole" in r.stderr, (r.stdout,
                                                                               r.stderr)
            return
        assert seen() == 4096
        r = resize_pod(bed.cluster.kubeconfig, ns, "claimer", "--memory", "8Gi")
        assert r.returncode == 0, (r.stdout, r.stderr)
        assert seen() == 8192
    finally:
        bed.kubectl("delete", "namespace", ns, "--wait=true")


def test_uninstall_leaves_only_the_crds(bed: Installed) -> None:
    cluster = bed.cluster
    bed.kubectl("delete", "namespace", TEAM, "--wait=false")
    started = time.monotonic()
    out = bed.helm.uninstall(NS)
    say(f"helm uninstall: {time.monotonic() - started:.1f}s")
    assert out.returncode == 0, out.stderr + out.stdout
    for kind, name in (("mutatingwebhookconfiguration", "tessera-pods"),
                       ("validatingwebhookconfiguration", "tessera-resources"),
                       ("clusterrole", "tessera-operator"), ("clusterrole", "tessera-node"),
                       ("clusterrole", "tessera-uninstall"),
                       ("validatingadmissionpolicy", "tessera-pod-budget"),
                       ("validatingadmissionpolicy", "tessera-growth-holders"),
                       ("validatingadmissionpolicy", "tessera-pod-templates")):
        got = cluster.kubectl("get", kind, name)
        assert got.returncode != 0 and "NotFound" in got.stderr, (kind, name, got.stdout)
    for kind, name in (("lease", "tessera-operator"), ("secret", "tessera-webhook-tls"),
                       ("secret", "tessera-seal-key"),
                       ("deployment", "tessera-operator"), ("daemonset", "tessera-node"),
                       ("deployment", "tessera-scheduler"), ("lease", "tessera-scheduler"),
                       ("job", "tessera-uninstall")):
        got = cluster.kubectl("get", kind, name, "-n", NS)
        assert got.returncode != 0 and "NotFound" in got.stderr, (kind, name, got.stdout)
    wait_until("no tessera pods", lambda: not get_json(
        cluster, "pods", "-n", NS, "-l", "app.kubernetes.io/name=tessera")["items"], 60)
    for node in cluster.nodes:
        meta = get_json(cluster, "node", node.name)["metadata"]
        keys = [*meta.get("labels", {}), *meta.get("annotations", {})]
        assert not [k for k in keys if k.startswith(PREFIX)], keys
    crds = get_json(cluster, "crds")["items"]
    assert {c["metadata"]["name"] for c in crds} >= {"gpupartitions.tessera.dev",
                                                     "gpuquotas.tessera.dev"}
    # with the webhooks gone, a pod asking for tessera resources is no longer blocked
    bed.kubectl("create", "namespace", "after")
    cluster.wait_for_service_account("after")
    bed.kubectl("create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu", "namespace": "after"},
        "spec": {"containers": [{"name": "main", "image": "tessera.local/workload:1",
                                 "resources": {"limits": {VGPU: "1"}}}]}}))




def test_tessera_images_are_reproducible(tmp_path: Path) -> None:
    """Two builds from the same .deb files, wheels and libtessera: the same digests."""
    python = REPO / ".venv" / "bin" / "python"
    debs = default_layout().root / "tessera-images" / "debs"
    digests = []
    for run in ("one", "two"):
        layout = Layout(tmp_path / run)
        if debs.is_dir():  # the same .deb files (a new Debian update would be another input)
            shutil.copytree(debs, layout.root / "tessera-images" / "debs")
        built = ensure_tessera_images(layout, python, REPO / "hook" / "build", TAG)
        assert all(b.seconds > 0 for b in built.values())  # really built, not cached
        digests.append({ref: b.image.digest for ref, b in built.items()})
    assert digests[0] == digests[1]
