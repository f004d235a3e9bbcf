"""The node daemon's Prometheus metrics (on --metrics-port, 9420): per GPU, per MIG instance,
what it wrote and what failed."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from tessera_node.device.state import DeviceSnapshot
from tessera_node.inventory import model_of

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
SMI_COMMANDS = Counter("tessera_node_nvidia_smi_commands_total",
                       "nvidia-smi commands run, by kind (enable-mig, create-gi, …) and result.",
                       ["command", "result"])
SMI_SECONDS = Histogram("tessera_node_nvidia_smi_seconds", "Duration of one nvidia-smi "
                        "command, by kind.", ["command"],
                        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 120))
FINDINGS = Gauge("tessera_node_findings", "What the daemon reports wrong or foreign on its "
                 "node, by kind.", ["kind"])


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


# -- the core controller: work-conserving fair share per GPU / MIG instance ------------------

_QUOTA = ["quota"]
_CONTAINER = ["device", "quota", "container"]
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
                   "Achieved busy share of the GPU in the controller's last period.", _CONTAINER)
CORE_TARGET = Gauge("tessera_container_core_budget", "Core budget, fraction of the GPU.",
                    _CONTAINER)


def observe_core_shares(device: str, quota_of: dict[str, str],
                        report: dict[str, dict[str, float]]) -> None:
    """One controller period on ``device``: its report (per container: ``seconds``,
    ``busy``, ``target``, ``lent``, ``borrowed``), containers labelled with their quotas."""
    for name, r in report.items():
        secs = r.get("seconds")
        if not secs or "busy" not in r:
            continue
        quota = quota_of.get(name, "")
        key = (device, quota, name)
        c = _children.get(key)
        if c is None:  # label lookups once per container, not ten times a second
            if len(_children) >= 4096:
                _children.clear()
            c = _children[key] = (CORE_LENT.labels(quota), CORE_BORROWED.labels(quota),
                                  CORE_BUSY.labels(*key), CORE_BUDGET.labels(*key),
                                  CORE_SHARE.labels(*key), CORE_TARGET.labels(*key))
        c[0].inc(r["lent"] * secs)
        c[1].inc(r["borrowed"] * secs)
        c[2].inc(r["busy"] * secs)
        c[3].inc(r["target"] * secs)
        c[4].set(r["busy"])
        c[5].set(r["target"])


_children: dict[tuple[str, str, str], tuple[Any, ...]] = {}
