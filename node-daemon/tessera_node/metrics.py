"""The node daemon's Prometheus metrics (on --metrics-port, 9420): per GPU, per MIG instance,
per container tessera set up, what it wrote and what failed."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from tessera_node.device.state import DeviceSnapshot, model_of

_GPU = ["gpu", "uuid", "model"]
GPU_MEMORY_TOTAL = Gauge("tessera_gpu_memory_total_bytes", "GPU memory in total.", _GPU)
GPU_MEMORY_USED = Gauge("tessera_gpu_memory_used_bytes", "GPU memory in use.", _GPU)
GPU_UTILIZATION = Gauge("tessera_gpu_utilization_percent",
                        "Busy share of the last second (absent where NVML does not say: "
                        "MIG-enabled GPUs).", _GPU)
GPU_MIG_MODE = Gauge("tessera_gpu_mig_mode", "1 for the GPU's current MIG mode.",
                     [*_GPU, "mode"])
_MIG = ["gpu", "gpu_uuid", "profile", "start", "gi", "uuid"]
MIG_MEMORY_TOTAL = Gauge("tessera_mig_instance_memory_total_bytes",
                         "Memory of one MIG instance.", _MIG)
MIG_MEMORY_USED = Gauge("tessera_mig_instance_memory_used_bytes",
                        "Memory in use on one MIG instance.", _MIG)
NVML_UP = Gauge("tessera_node_nvml_up", "1 when the last NVML read succeeded.")
REPORT_WRITES = Counter("tessera_node_report_writes_total",
                        "Writes of the daemon's own Node (inventory and reports), by result.",
                        ["result"])
API_WRITES = Counter("tessera_node_api_writes_total",
                     "Every write the daemon sent to the API server, by kind.", ["kind"])
ERRORS = Counter("tessera_node_errors_total", "Failures, by stage (logged).", ["stage"])
MIG_INSTANCES = Gauge("tessera_mig_instances", "MIG instances per GPU and profile.",
                      ["gpu", "profile"])
MIG_APPLIES = Counter("tessera_node_mig_applies_total",
                      "MIG layout applies on one GPU, by outcome (the node entry's phase).",
                      ["outcome"])
MIG_APPLY_SECONDS = Histogram("tessera_node_mig_apply_seconds",
                              "Duration of one GPU's MIG apply (reads, plans, nvidia-smi).",
                              ["outcome"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
                                                    120, 300))
MIG_ON_DEMAND = Counter("tessera_node_mig_on_demand_total",
                        "MIG instances made for claims (migMode OnDemand) and destroyed when "
                        "they were released, by action and result.", ["action", "result"])
MIG_ON_DEMAND_SECONDS = Histogram("tessera_node_mig_on_demand_seconds",
                                  "From a claim's prepare asking an instance to NVML showing "
                                  "it with its compute instance.",
                                  buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
SMI_COMMANDS = Counter("tessera_node_nvidia_smi_commands_total",
                       "nvidia-smi commands run, by kind (enable-mig, create-gi, …) and result.",
                       ["command", "result"])
SMI_SECONDS = Histogram("tessera_node_nvidia_smi_seconds", "Duration of one nvidia-smi "
                        "command, by kind.", ["command"],
                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120))
AUDIT_RUNS = Counter("tessera_node_audit_runs_total",
                     "Audits (NVML per-process figures against budgets), by result.",
                     ["result"])
AUDIT_FOREIGN = Gauge("tessera_node_foreign_gpu_processes",
                      "GPU processes in no container tessera set up (confirmed), per GPU or "
                      "MIG UUID.", ["gpu"])
AUDIT_FOREIGN_BYTES = Gauge("tessera_node_foreign_gpu_memory_bytes",
                            "Device memory those processes hold, per GPU or MIG UUID.", ["gpu"])
AUDIT_STOPS = Counter("tessera_node_audit_stops_total",
                      "Processes the audit killed (SIGKILL), by finding "
                      "(over_budget, tampered, foreign) and result (ok, failed).",
                      ["kind", "result"])
RESIZES = Counter("tessera_node_resizes_total", "Live resizes this node decided, by outcome "
                  "(Applied, Refused: GPU memory).", ["outcome"])
ALLOCATIONS = Counter("tessera_node_allocations_total", "Device plugin Allocate calls, by "
                      "resource and result (ok, refused).", ["resource", "result"])
ALLOCATE_SECONDS = Histogram("tessera_node_allocate_seconds", "Duration of one successful "
                             "Allocate (waiting for the pod watch included).", ["resource"],
                             buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5))
PODRESOURCES_CALLS = Counter("tessera_node_podresources_calls_total", "Calls to the kubelet's "
                             "PodResources API, by method (Get; List only where the kubelet "
                             "has no Get).", ["method"])
PODRESOURCES_REFUSED = Counter("tessera_node_podresources_refused_total", "Calls the "
                               "kubelet's PodResources API refused with RESOURCE_EXHAUSTED "
                               "(its rate limit: the daemon then keeps quiet for a while).")
# Counters with known label values start at 0, so that increase() sees the first audit
# failure and the first stop (a series that appears at 1 has no increase to show).
for _result in ("ok", "nvml_error", "api_error"):
    AUDIT_RUNS.labels(_result)
for _method in ("Get", "List"):
    PODRESOURCES_CALLS.labels(_method)
for _kind in ("over_budget", "tampered", "foreign"):
    for _result in ("ok", "failed"):
        AUDIT_STOPS.labels(_kind, _result)
POD_IDLE = Gauge("tessera_pod_gpu_idle_seconds",
                 "How long a pod has held GPU memory while its containers' SM use stayed under "
                 "its GPUQuota's idle.below (pods of namespaces with spec.idle; absent when "
                 "not idle).", ["namespace", "pod"])
POD_IDLE_MEMORY = Gauge("tessera_pod_gpu_idle_memory_bytes",
                        "GPU memory such an idle pod holds.", ["namespace", "pod"])
IDLE_ACTIONS = Counter("tessera_node_idle_actions_total",
                       "What the daemon did about idle holders, by action (Report, Evict) and "
                       "result (reported, evicted, blocked: a PodDisruptionBudget said not now, "
                       "gone, failed).", ["action", "result"])
FINDINGS = Gauge("tessera_node_findings", "What the daemon reports wrong or foreign on its "
                 "node, by kind.", ["kind"])

# -- DRA (--dra): the node's ResourceSlices ----------------------------------------------------
DRA_DEVICES = Gauge("tessera_node_dra_devices", "Devices this node's ResourceSlices publish, "
                    "as last written or found published.")
DRA_SLICE_WRITES = Counter("tessera_node_dra_slice_writes_total", "ResourceSlice writes, by "
                           "operation (create, update, delete) and result (ok, error).",
                           ["op", "result"])
DRA_PASSES = Counter("tessera_node_dra_publish_passes_total", "Publisher passes, by outcome "
                     "(unchanged: nothing written; written; error).", ["outcome"])
DRA_FIELDS_DROPPED = Gauge("tessera_node_dra_fields_dropped", "1 for each field the API "
                           "server dropped from this node's ResourceSlices (its consumable-"
                           "capacity gate is off): the loss the node reports.", ["field"])
for _outcome in ("unchanged", "written", "error"):
    DRA_PASSES.labels(_outcome)


def observe(snapshot: DeviceSnapshot) -> None:
    """Set the per-GPU and per-instance gauges to this snapshot (gone GPUs/instances too)."""
    for g in (GPU_MEMORY_TOTAL, GPU_MEMORY_USED, GPU_UTILIZATION, GPU_MIG_MODE,
              MIG_MEMORY_TOTAL, MIG_MEMORY_USED, MIG_INSTANCES):
        g.clear()
    for gpu in snapshot.gpus:
        model = model_of(gpu)
        labels = (str(gpu.index), gpu.uuid, model.id if model else "unknown")
        GPU_MEMORY_TOTAL.labels(*labels).set(gpu.memory_total_bytes)
        GPU_MEMORY_USED.labels(*labels).set(gpu.memory_used_bytes)
        if gpu.utilization_percent is not None:
            GPU_UTILIZATION.labels(*labels).set(gpu.utilization_percent)
        GPU_MIG_MODE.labels(*labels, gpu.mig_mode).set(1)
        for name in {i.profile for i in gpu.instances}:
            MIG_INSTANCES.labels(str(gpu.index), name).set(
                sum(i.profile == name for i in gpu.instances))
        for i in gpu.instances:
            mig = (str(gpu.index), gpu.uuid, i.profile, str(i.start), str(i.gi_id), i.uuid)
            if i.memory_total_bytes is not None:
                MIG_MEMORY_TOTAL.labels(*mig).set(i.memory_total_bytes)
            if i.memory_used_bytes is not None:
                MIG_MEMORY_USED.labels(*mig).set(i.memory_used_bytes)


# -- per container (the audit sets them each period; a container that ends loses its series) --

_CONTAINER = ["namespace", "pod", "container", "gpu"]
WAIT_BUCKET_EXPONENTS = (0, 4, 7, 10, 12, 14, 16, 18, 20, 23, 26)
"""Histogram bounds of the token wait, as powers of two microseconds (1 µs, 16 µs, 128 µs,
1 ms, 4 ms, 16 ms, 66 ms, 262 ms, 1 s, 8.4 s, 67 s): a subset of the ledger's log2 buckets,
so every count is exact."""


def wait_buckets(hist: Sequence[int]) -> list[tuple[str, float]]:
    """The ledger's launch-wait histogram (bucket b: waits of [2^(b-1), 2^b) µs, bucket 0
    under 1 µs, the last one everything above) as Prometheus cumulative buckets."""
    out: list[tuple[str, float]] = []
    last = len(hist) - 1
    for e in WAIT_BUCKET_EXPONENTS:
        if e >= last:
            break
        out.append((repr((1 << e) / 1e6), float(sum(hist[: e + 1]))))
    out.append(("+Inf", float(sum(hist))))
    return out


@dataclass(frozen=True)
class ContainerFigures:
    """One container's figures on one of its GPUs or MIG instances (``gpu``: its UUID)."""

    namespace: str
    pod: str
    container: str
    gpu: str
    memory_used_bytes: int
    """What NVML shows its processes hold there."""
    memory_budget_bytes: int | None = None
    """None: no limit (a whole MIG instance)."""
    core_budget_percent: float | None = None
    utilization_percent: float | None = None
    """Its processes' SM busy share since the last audit (None where NVML does not say)."""
    wait_hist: tuple[int, ...] = ()
    """The ledger's launch-wait histogram for this device (empty: no ledger yet)."""
    wait_seconds: float = 0.0
    over_budget: bool = False
    tampered: bool = False
    """Its ledger or what its processes see at /run/tessera is not what the daemon made."""
    claim: str = ""
    """The DRA claim it is (its name, in ``namespace``), "" for a device plugin's container."""

    @property
    def labels(self) -> list[str]:
        return [self.namespace, self.pod, self.container, self.gpu]


class ContainerCollector(Collector):
    """Serves the figures the audit last set, and only those."""

    def __init__(self) -> None:
        self.figures: tuple[ContainerFigures, ...] = ()

    def set(self, figures: Iterable[ContainerFigures]) -> None:
        self.figures = tuple(figures)

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        figs = self.figures
        gauges: list[tuple[str, str, Callable[[ContainerFigures], float | int | None]]] = [
            ("tessera_container_memory_budget_bytes", "A container's GPU memory budget on "
             "one GPU or MIG instance.", lambda f: f.memory_budget_bytes),
            ("tessera_container_memory_used_bytes", "GPU memory its processes hold there "
             "(NVML per-process figures).", lambda f: f.memory_used_bytes),
            ("tessera_container_core_budget_percent", "Its core budget there (percent of the "
             "GPU's SMs).", lambda f: f.core_budget_percent),
            ("tessera_container_utilization_percent", "Achieved SM busy share of its "
             "processes there since the last audit (absent on MIG: NVML does not say).",
             lambda f: f.utilization_percent),
            ("tessera_container_over_budget", "1 while it holds more memory there than its "
             "budget.", lambda f: 1 if f.over_budget else 0),
            ("tessera_container_tampered", "1 while its ledger is not the one tessera made, "
             "or a process of it sees other files at /run/tessera (treated as over "
             "budget).", lambda f: 1 if f.tampered else 0),
        ]
        for name, doc, value in gauges:
            g = GaugeMetricFamily(name, doc, labels=_CONTAINER)
            for f in figs:
                v = value(f)
                if v is not None:
                    g.add_metric(f.labels, float(v))
            yield g
        info = GaugeMetricFamily(
            "tessera_claim_info", "1 for each DRA claim prepared on the node, on each of its "
            "devices: joins the per-container series of its containers (same namespace, pod, "
            "container and gpu) to the claim.", labels=[*_CONTAINER, "claim"])
        for f in figs:
            if f.claim:
                info.add_metric([*f.labels, f.claim], 1.0)
        yield info
        h = HistogramMetricFamily("tessera_container_token_wait_seconds",
                                  "Time launches waited for core-budget tokens (the hook's "
                                  "ledger).", labels=_CONTAINER)
        for f in figs:
            if f.wait_hist:
                h.add_metric(f.labels, wait_buckets(f.wait_hist), f.wait_seconds)
        yield h


CONTAINERS = ContainerCollector()
REGISTRY.register(CONTAINERS)


# -- the core controller: work-conserving fair share per GPU / MIG instance ------------------

_QUOTA = ["namespace", "quota"]
CORE_LENT = Counter("tessera_quota_core_lent_seconds_total",
                    "GPU-seconds of core budget a GPUQuota's containers left idle and lent "
                    "to others (one GPU for one second = 1).", _QUOTA)
CORE_BORROWED = Counter("tessera_quota_core_borrowed_seconds_total",
                        "GPU-seconds beyond their budgets a GPUQuota's containers were given "
                        "from what others left idle.", _QUOTA)
CORE_BUSY = Counter("tessera_container_core_busy_seconds_total",
                    "GPU-seconds a container kept its GPU or MIG instance busy (on MIG: its "
                    "share of the instance's launches).", _CONTAINER)
CORE_BUDGET = Counter("tessera_container_core_budget_seconds_total",
                      "GPU-seconds of core budget a container held: rate(busy) / "
                      "rate(budget) is its achieved share vs budget.", _CONTAINER)
CORE_SHARE = Gauge("tessera_container_core_share",
                   "Achieved busy share of the GPU or MIG instance in the core controller's "
                   "last period (fraction).", _CONTAINER)
CORE_CONTROL_CPU = Counter("tessera_node_core_control_cpu_seconds_total",
                           "CPU time the core controllers spent in their periods (reading "
                           "utilisation and ledgers, deciding, writing budget files).")
CORE_CONTROLLED_UNITS = Gauge("tessera_node_core_controlled_units",
                              "GPUs and MIG instances a core controller runs for now.")


@dataclass(frozen=True)
class CoreOwner:
    """Whose a controlled container is, for the metrics' labels."""

    namespace: str = ""
    pod: str = ""
    container: str = ""
    quota: str = ""
    """The GPUQuota's name in ``namespace`` ("" when none)."""


def observe_core_shares(gpu: str, owners: Mapping[str, CoreOwner],
                        report: Mapping[str, Mapping[str, float]]) -> None:
    """One controller period on ``gpu`` (GPU or MIG UUID, or an index standalone): its report
    (per controlled container: ``seconds``, ``busy``, ``target``, ``lent``, ``borrowed``)."""
    for name, r in report.items():
        secs = r.get("seconds")
        if not secs or "busy" not in r:
            continue
        c = core_series(gpu, name, owners.get(name) or CoreOwner(container=name))
        c[0].inc(r["lent"] * secs)
        c[1].inc(r["borrowed"] * secs)
        c[2].inc(r["busy"] * secs)
        c[3].inc(r["target"] * secs)
        c[4].set(r["busy"])


def core_series(gpu: str, name: str, o: CoreOwner) -> tuple[Any, ...]:
    """A controlled container's series (created at 0 the first time: a container whose GPU
    stays idle, so that no period measures anything, still shows them, and so does its
    quota's lent and borrowed time). Looked up once per container, not ten times a second."""
    key = (gpu, name, o)
    c = _children.get(key)
    if c is None:
        if len(_children) >= 4096:
            _children.clear()
        labels = (o.namespace, o.pod, o.container, gpu)
        c = _children[key] = (CORE_LENT.labels(o.namespace, o.quota),
                              CORE_BORROWED.labels(o.namespace, o.quota),
                              CORE_BUSY.labels(*labels), CORE_BUDGET.labels(*labels),
                              CORE_SHARE.labels(*labels))
    return c


def forget_core_container(gpu: str, owner: CoreOwner) -> None:
    """A controlled container ended (its per-container series go; the quota's counters stay)."""
    for key in [k for k in _children if k[0] == gpu and k[2] == owner]:
        del _children[key]
    labels = (owner.namespace, owner.pod, owner.container, gpu)
    for m in (CORE_BUSY, CORE_BUDGET, CORE_SHARE):
        with contextlib.suppress(KeyError):
            m.remove(*labels)


_children: dict[tuple[str, str, CoreOwner], tuple[Any, ...]] = {}
