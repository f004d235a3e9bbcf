"""What a node's containerd, CNI, kubelet and kube-proxy are told (pure rendering, no I/O).

Paths here are the ones *inside* the node's mount namespace, where the node's own directories
are mounted at the standard places (/run, /var/lib, /var/log; see node.py). Settings that
matter and why:

- containerd (2.x, configuration version 3): `restrict_oom_score_adj = true` (this kind of VM
  refuses to lower oom_score_adj, and runc then fails every sandbox with "can't get final
  child's PID from pipe: EOF"); the sandbox image is our own `pause`, pinned; runc with
  cgroupfs; CDI on, its specs read from the node's own `/var/run/cdi` (for DRA drivers).
- CNI: the bridge plugin with host-local IPAM on the node's own /24, hairpin on (a pod can
  reach a Service backed by itself), no masquerade (pod addresses are routed, see
  network.py), then portmap.
- kubelet: cgroupfs under the node's own cgroup root, `failCgroupV1: false` stated (cgroup
  v1 hosts; 1.35 refuses v1 by default), image GC at 100 % and relaxed hard eviction (the
  images cannot be pulled back), a short node lease so the node lifecycle controller notices
  a stopped node within seconds, client CA + webhook authorisation for `logs`/`exec`;
  `seccompDefault: true` as on a hardened production node: a container that states no
  seccomp profile runs under the runtime's default one (no `unshare`, no `mount`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

NODE_LEASE_SECONDS = 12  # renewed every quarter: 3 s
NODE_STATUS_UPDATE = "4s"
CONTAINERD_SOCKET = "/run/containerd/containerd.sock"
CNI_CONF_DIR = "/var/lib/cni/net.d"
CNI_BIN_DIR = "/usr/lib/cni"  # Debian's containernetworking-plugins
RUNC = "/usr/sbin/runc"  # Debian's runc
CDI_SPEC_DIRS = ("/var/run/cdi",)
"""Where containerd reads CDI specs: the node's own /run (each node has its own), not the
host's /etc/cdi, which every node of the bed would share."""
KUBELET_ROOT = "/var/lib/kubelet"
KUBELET_PORT = 10250  # on the node's own address: every node has its own network namespace
RELAXED_EVICTION = {
    "memory.available": "1Mi",
    "nodefs.available": "1%",
    "nodefs.inodesFree": "1%",
    "imagefs.available": "1%",
    "imagefs.inodesFree": "1%",
}


@dataclass(frozen=True)
class NodeSettings:
    """Everything node-specific the configuration files need."""

    name: str
    node_ip: str
    pod_subnet: str
    cluster_cidr: str
    cgroup_root: str
    sandbox_image: str
    ca_cert: str
    serving_cert: str
    serving_key: str
    kubelet_kubeconfig: str
    proxy_kubeconfig: str
    resolv_conf: str
    containerd_major: int = 2
    """The containerd it runs: 2 (configuration version 3) or 1 (version 2)."""


DISABLED_PLUGINS = (
    "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
    "io.containerd.snapshotter.v1.devmapper",
    "io.containerd.internal.v1.opt",  # would create /opt/containerd on the host
    "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing",
)


def containerd_toml(node: NodeSettings) -> str:
    return (containerd_2_toml(node) if node.containerd_major >= 2
            else containerd_1_toml(node))


def containerd_2_toml(node: NodeSettings) -> str:
    """containerd 2's configuration, version 3: the CRI plugin is two plugins there
    (``io.containerd.cri.v1.images``: snapshotter, the pinned sandbox image;
    ``io.containerd.cri.v1.runtime``: runtimes, CNI, CDI)."""
    images = "plugins.'io.containerd.cri.v1.images'"
    runtime = "plugins.'io.containerd.cri.v1.runtime'"
    disabled = [*DISABLED_PLUGINS, "io.containerd.snapshotter.v1.erofs"]
    return "\n".join([
        "version = 3",
        "root = '/var/lib/containerd'",
        "state = '/run/containerd'",
        f"disabled_plugins = {json.dumps(disabled)}",
        "[grpc]",
        f"  address = '{CONTAINERD_SOCKET}'",
        f"[{images}]",
        "  snapshotter = 'overlayfs'",
        f"[{images}.pinned_images]",
        f"  sandbox = '{node.sandbox_image}'",
        f"[{runtime}]",
        "  restrict_oom_score_adj = true",
        "  enable_cdi = true",
        f"  cdi_spec_dirs = {json.dumps(list(CDI_SPEC_DIRS))}",
        f"[{runtime}.containerd]",
        "  default_runtime_name = 'runc'",
        f"[{runtime}.containerd.runtimes.runc]",
        "  runtime_type = 'io.containerd.runc.v2'",
        f"[{runtime}.containerd.runtimes.runc.options]",
        f"  BinaryName = '{RUNC}'",
        "  SystemdCgroup = false",
        f"[{runtime}.cni]",
        f"  bin_dirs = {json.dumps([CNI_BIN_DIR])}",
        f"  conf_dir = '{CNI_CONF_DIR}'",
        "",
    ])


def containerd_1_toml(node: NodeSettings) -> str:
    """containerd 1.7's configuration, version 2 (the oldest Kubernetes release's nodes):
    one CRI plugin, CDI on as in version 3."""
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    disabled = [*DISABLED_PLUGINS, "io.containerd.snapshotter.v1.aufs"]
    return "\n".join([
        "version = 2",
        'root = "/var/lib/containerd"',
        'state = "/run/containerd"',
        f"disabled_plugins = {json.dumps(disabled)}",
        "[grpc]",
        f'  address = "{CONTAINERD_SOCKET}"',
        f"[{cri}]",
        f'  sandbox_image = "{node.sandbox_image}"',
        "  restrict_oom_score_adj = true",
        "  enable_cdi = true",
        f"  cdi_spec_dirs = {json.dumps(list(CDI_SPEC_DIRS))}",
        f"[{cri}.containerd]",
        '  snapshotter = "overlayfs"',
        '  default_runtime_name = "runc"',
        f"[{cri}.containerd.runtimes.runc]",
        '  runtime_type = "io.containerd.runc.v2"',
        f"[{cri}.containerd.runtimes.runc.options]",
        f'  BinaryName = "{RUNC}"',
        "  SystemdCgroup = false",
        f"[{cri}.cni]",
        f'  bin_dir = "{CNI_BIN_DIR}"',
        f'  conf_dir = "{CNI_CONF_DIR}"',
        "",
    ])


def cni_conflist(node: NodeSettings) -> str:
    return json.dumps({
        "cniVersion": "1.0.0",
        "name": "tessera",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": node.pod_subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2) + "\n"


def kubelet_config(node: NodeSettings) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.node_ip,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": node.serving_cert,
        "tlsPrivateKeyFile": node.serving_key,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": node.ca_cert},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": node.cgroup_root,
        "cgroupsPerQOS": True,
        "failCgroupV1": False,
        "failSwapOn": False,
        "enforceNodeAllocatable": [],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": dict(RELAXED_EVICTION),
        "nodeLeaseDurationSeconds": NODE_LEASE_SECONDS,
        "nodeStatusUpdateFrequency": NODE_STATUS_UPDATE,
        "resolvConf": node.resolv_conf,
        "serializeImagePulls": False,
        "registerNode": True,
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
        "shutdownGracePeriod": "0s",
        "seccompDefault": True,
    }


def kube_proxy_config(node: NodeSettings) -> dict[str, Any]:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": node.proxy_kubeconfig},
        "hostnameOverride": node.name,
        "bindAddress": node.node_ip,
        "clusterCIDR": node.cluster_cidr,
        "nodePortAddresses": ["primary"],  # the node's InternalIP, not every local address
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # The node's netns is fresh: nothing to tune, and conntrack sysctls are global.
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }


def dump_yaml(document: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(document), sort_keys=False)
