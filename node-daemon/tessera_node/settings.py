"""The node daemon's settings and their defaults: the one place they are defined.

``tessera-node run`` turns each into a flag whose default is, in this order, the environment
variable named in :data:`ENV` (what a DaemonSet sets, e.g. ``NODE_NAME`` from
``spec.nodeName``), else the value here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Options:
    node_name: str = ""
    """This node's name (required: the daemon reads and writes this Node only)."""
    kubeconfig: str | None = None
    """kubeconfig file; None: in-cluster service account, then ~/.kube/config."""
    driver_root: str = "/"
    """Where the NVIDIA driver's files are: ``/`` on a host install, ``/run/nvidia/driver``
    under NVIDIA's driver container; libnvidia-ml.so.1 is looked up below it."""
    nvidia_smi: str = ""
    """Path of nvidia-smi; empty: ``<driver root>/usr/bin/nvidia-smi``, then ``bin/``."""
    state_dir: str = "/var/lib/tessera"
    """Host directory the daemon owns: the per-GPU locks of MIG changes, the installed
    libtessera (``lib/<version>/``) and the containers' budget files and ledgers
    (``containers/``)."""
    device_plugin_dir: str = "/var/lib/kubelet/device-plugins"
    """The kubelet's device-plugin directory: tessera's plugin sockets, the kubelet's
    registration socket, and where another GPU device plugin's socket shows."""
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 9420
    """/metrics, /healthz and /readyz (9400 is NVIDIA's DCGM exporter's)."""
    poll_interval_s: float = 5.0
    """How often NVML is read (inventory, MIG changes made by hand, metrics)."""
    resync_interval_s: float = 300.0
    """How often the whole state is reconciled again even when nothing was heard."""
    stuck_after_s: float = 60.0
    """A watch, or NVML, failing this long makes /healthz fail (the kubelet restarts us)."""
    retry_interval_s: float = 30.0
    """A MIG change that failed (an nvidia-smi error) is tried again after this long."""
    allow_gpu_reset: bool = True
    """Whether the daemon may reset an idle GPU to finish a MIG mode change that waits for
    one (Ampere); false: the node entry says the change is pending a reset."""
    device_plugin: bool = True
    """Serve the kubelet device plugin (``tessera.dev/vgpu``, ``tessera.dev/mig-<profile>``)."""
    shares_per_unit: int = 10
    """``tessera.dev/vgpu`` shares advertised per GPU (MIG disabled) or shared MIG instance."""
    share_policy: str = "pack"
    """GetPreferredAllocation: ``pack`` fills GPUs in use first, ``spread`` the least used."""
    device_visibility: str = "volume-mounts"
    """How Allocate makes a container's GPUs visible: ``cdi`` (CDI device names),
    ``volume-mounts`` (the NVIDIA container toolkit's volume-mount device list) or ``sim``
    (the simulated node: its libraries and node state are mounted, as the toolkit would)."""
    sim_node: str = ""
    """The simulated node's description file (``sim`` visibility only); its state file is
    ``<sim node>.state``."""
    libtessera: str = "/opt/tessera/lib/libtessera.so"
    """The libtessera build the daemon installs for containers (the node image's), at a host
    path under the state directory versioned by its content (an upgrade never rewrites a
    library a container has mapped)."""
    pod_resources_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet's PodResources API: which container holds which devices."""
    budget_wait_s: float = 30.0
    """How long libtessera waits on a container's first GPU call for a pending budget file
    before it refuses GPU memory."""
    confirm_interval_s: float = 0.5
    """How often the kubelet's PodResources are polled while an allocation waits for its pod
    (every ``poll_interval`` otherwise)."""

    on_demand_idle_s: float = 30.0
    """MIG on demand: an instance of an on-demand GPU that nothing holds or asks is
    destroyed once it has been so this long. Device plugin: no pod holds it and the operator
    no longer asks it (the grace covers a pod being bound to it). DRA: no prepared claim
    holds it and no claim is allocated it (unprepare destroys a claim's own; this takes what
    no claim has, such as the instance of a claim deleted before its prepare was recorded)."""

    audit_interval_s: float = 10.0
    """How often the audit compares NVML's per-process memory with the containers' budgets
    and looks for GPU processes outside them (also how often the per-container metrics are
    refreshed); a finding counts once two audits in a row see it."""
    core_interval_s: float = 0.1
    """The core controllers' period: how often each GPU's utilisation is read and the token
    rates of its core-budgeted containers set (lending and reclaim happen within periods)."""
    audit_slack_mib: int = 0
    """Device memory a container may hold beyond its budget before the audit calls it over
    budget (what the hook cannot count: module code and data; 0: none)."""

    # -- DRA (issue 31; docs/dra.md): the driver gpu.tessera.dev -----------------------------
    dra: bool = False
    """Offer this node's GPUs through Dynamic Resource Allocation: publish its ResourceSlices
    and serve the DRA kubelet plugin (claims become budgets). Never with the device plugin
    on the same node (the chart runs one or the other per node pool): both would hand out
    the same GPUs."""
    kubelet_root: str = "/var/lib/kubelet"
    """The kubelet's ``--root-dir``: the DRA plugin registers in its ``plugins_registry/`` and
    serves in ``plugins/gpu.tessera.dev/``."""
    cdi_dir: str = "/var/run/cdi"
    """Where the DRA plugin writes each prepared claim's CDI spec (a directory the container
    runtime reads CDI specs from)."""


DEFAULTS = Options()

ENV = {
    "node_name": "NODE_NAME",
    "kubeconfig": "KUBECONFIG",
    "driver_root": "TESSERA_DRIVER_ROOT",
    "nvidia_smi": "TESSERA_NVIDIA_SMI",
    "state_dir": "TESSERA_STATE_DIR",
    "device_plugin_dir": "TESSERA_DEVICE_PLUGIN_DIR",
    "metrics_host": "TESSERA_METRICS_HOST",
    "metrics_port": "TESSERA_METRICS_PORT",
    "poll_interval_s": "TESSERA_POLL_INTERVAL",
    "resync_interval_s": "TESSERA_RESYNC_INTERVAL",
    "stuck_after_s": "TESSERA_STUCK_AFTER",
    "retry_interval_s": "TESSERA_RETRY_INTERVAL",
    "allow_gpu_reset": "TESSERA_ALLOW_GPU_RESET",
    "on_demand_idle_s": "TESSERA_ON_DEMAND_IDLE",
    "audit_interval_s": "TESSERA_AUDIT_INTERVAL",
    "audit_slack_mib": "TESSERA_AUDIT_SLACK_MIB",
    "core_interval_s": "TESSERA_CORE_INTERVAL",
    "device_plugin": "TESSERA_DEVICE_PLUGIN",
    "shares_per_unit": "TESSERA_SHARES_PER_UNIT",
    "share_policy": "TESSERA_SHARE_POLICY",
    "device_visibility": "TESSERA_DEVICE_VISIBILITY",
    "sim_node": "TESSERA_SIM_NODE",
    "libtessera": "TESSERA_LIBTESSERA",
    "pod_resources_socket": "TESSERA_POD_RESOURCES_SOCKET",
    "budget_wait_s": "TESSERA_BUDGET_WAIT",
    "confirm_interval_s": "TESSERA_CONFIRM_INTERVAL",
    # DRA
    "dra": "TESSERA_DRA",
    "kubelet_root": "TESSERA_KUBELET_ROOT",
    "cdi_dir": "TESSERA_CDI_DIR",
}
"""The environment variable each setting falls back to when its flag is not given."""

VISIBILITIES = ("cdi", "volume-mounts", "sim")
POLICIES = ("pack", "spread")
CONTAINERS_DIR = "containers"
"""Under the state directory: one directory per allocation (budget file, ledger)."""
LIB_DIR = "lib"
"""Under the state directory: one directory per installed libtessera version."""
ALLOCATE_WAIT_S = 10.0
"""How long an Allocate that finds no candidate pod waits for the pod watch to show one (the
kubelet may hear of a pod before the daemon does)."""
PREFERRED_WAIT_S = 2.0
"""How long a GetPreferredAllocation that finds no candidate without an allocation waits for
the pod watch to show the pod the kubelet is admitting (its placement record, its budget)."""
FORGET_PENDING_S = 300.0
"""A pending allocation the kubelet never shows as held is removed after this long."""
PODRESOURCES_QPS = 20.0
PODRESOURCES_BURST = 2
"""The daemon's own pace on the kubelet's PodResources API: at most this many calls a second
(and this many at once). The kubelet refuses calls past qps 100, burst 10, for all its
clients together (RESOURCE_EXHAUSTED), so the daemon keeps to a fifth of it: in any one
second at most QPS + BURST calls."""
PODRESOURCES_BACKOFF_S = (0.5, 8.0)
"""After a RESOURCE_EXHAUSTED, no call for the first value, doubled at every refusal in a
row up to the second."""

# -- DRA (issue 31) ---------------------------------------------------------------------------
DRA_WITHDRAW_TIMEOUT_S = 30.0
"""How long the MIG enactor waits for the ResourceSlices without the devices it is about to
destroy to be written; past it the change fails (and is retried), nothing is destroyed."""
DRA_RETRY_S = 2.0
"""After a failed ResourceSlice write, the next try (the watch or a change may come sooner)."""

CLAIMS_DIR = "claims"
"""Under the state directory: one directory per prepared claim (budget file, ledger)."""
DRA_CHECKPOINT = "dra/checkpoint.json"
"""Under the state directory: the claims the DRA plugin prepared."""
CLAIM_READ_TIMEOUT_S = 30.0
"""How long prepare waits for the API server's answer on a ResourceClaim (the kubelet gives
the whole call 45 s)."""
