"""A real Kubernetes node of the test bed: kubelet + containerd + runc + kube-proxy.

Each node lives in namespaces of its own, held by a small holder process:

- a **mount namespace** (private propagation) in which the node's directories are mounted at
  the standard places: `<node>/root/run` on /run, `<node>/root/var/lib` on /var/lib,
  `<node>/root/var/log` on /var/log. So every node has its own
  /var/lib/kubelet/device-plugins (the kubelet's registration socket path is fixed and ignores
  --root-dir, kubernetes/kubernetes#120626), containerd root and state, CNI state and pod logs,
  at the paths a real node has them; nothing a node mounts is seen by the host;
- a **network namespace** joined to the host by a veth pair (network.py): the node's
  InternalIP, its own CNI bridge and iptables;
- a **UTS namespace** whose hostname is the node name;
- its own **cgroup root** (cgroups.py), where all its processes are found at teardown.

The node's simulated GPUs (`tessera_sim` node file, fake libcuda.so.1/libnvidia-ml.so.1,
nvidia-smi) are in its /var/lib/tessera/gpu (GPU_DIR).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.kubeconfig import write_kubeconfig
from tessera_e2e.controlplane.pins import containerd_major, load_containerd_version
from tessera_e2e.controlplane.pki import Pki, issue
from tessera_e2e.controlplane.processes import Component, RunDirectory
from tessera_e2e.nodes.cgroups import NodeCgroup
from tessera_e2e.nodes.config import (
    CNI_CONF_DIR,
    CONTAINERD_SOCKET,
    KUBELET_PORT,
    KUBELET_ROOT,
    NodeSettings,
    cni_conflist,
    containerd_toml,
    dump_yaml,
    kube_proxy_config,
    kubelet_config,
)
from tessera_e2e.nodes.images import PAUSE, Image, import_images
from tessera_e2e.nodes.network import TestbedNetwork, run

# Inside the node: where its own directories are mounted (host side: <node>/root/<same>).
NODE_MOUNTS = ("run", "var/lib", "var/log")
GPU_DIR = "/var/lib/tessera/gpu"
START_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class NodeGPUs:
    """One node's simulated GPUs with a topology: ``models`` (``MODEL[:mig]`` each) and, in
    ``python -m tessera_sim node``'s forms, the NVLinks (``"0-1,2-3"``, ``"0-1:4"``,
    ``"all"``; default none) and each GPU's NUMA node (``"0,0,1,1"``; default all 0).
    A plain tuple of models is the same with no topology."""

    models: tuple[str, ...]
    nvlink: str = ""
    numa: str = ""


GPUs = tuple[str, ...] | NodeGPUs
"""What ``LocalCluster(gpu_models=...)`` takes per node."""


def node_gpus(spec: GPUs) -> NodeGPUs:
    """A node's GPUs with their topology (none for a plain tuple of models)."""
    return spec if isinstance(spec, NodeGPUs) else NodeGPUs(spec)

# Each node's simulated GPUs, by node index (cycled): different models tell nodes apart.
# LocalCluster(gpu_models=...) gives other nodes (the demo's, or a test's NodeGPUs).
GPU_MODELS: tuple[GPUs, ...] = (("H100-80GB",), ("A100-40GB",))


@dataclass(frozen=True)
class NodeBinaries:
    kubelet: Path
    kube_proxy: Path
    containerd_bin: Path  # containerd, containerd-shim-runc-v2, ctr
    sim_build: Path  # sim/build: lib/, bin/


class Node:
    """One node; `start()` it after the API server is up; `stop()` removes everything."""

    def __init__(
        self,
        index: int,
        run_dir: RunDirectory,
        network: TestbedNetwork,
        binaries: NodeBinaries,
        pki: Pki,
        server: str,
        images: dict[str, Image],
        gpu_models: Sequence[GPUs] = (),
    ) -> None:
        self.index = index
        self.gpu_models = tuple(gpu_models) or GPU_MODELS
        self.name = f"node-{index}"
        self.run_dir = run_dir
        self.network = network
        self.binaries = binaries
        self.pki = pki
        self.server = server
        self.images = images
        self.path = run_dir.path / "nodes" / self.name
        self.cgroup = NodeCgroup(f"tessera-{run_dir.path.name}-{self.name}")
        self.holder: Component | None = None
        self.daemons: dict[str, Component] = {}
        self.settings = NodeSettings(
            name=self.name,
            node_ip=network.plan.node_ip(index),
            pod_subnet=network.plan.pod_subnet(index),
            cluster_cidr=network.plan.cluster_cidr,
            cgroup_root=self.cgroup.root,
            sandbox_image=PAUSE,
            ca_cert=str(pki.ca_cert),
            serving_cert=str(self.path / "pki" / "kubelet.crt"),
            serving_key=str(self.path / "pki" / "kubelet.key"),
            kubelet_kubeconfig=str(self.path / "kubelet.kubeconfig"),
            proxy_kubeconfig=str(self.path / "kube-proxy.kubeconfig"),
            resolv_conf=str(self.path / "resolv.conf"),
            containerd_major=containerd_major(load_containerd_version()),
        )

    @property
    def ip(self) -> str:
        return self.settings.node_ip

    @property
    def holder_pid(self) -> int:
        assert self.holder is not None, "node not started"
        return self.holder.process.pid

    def host_path(self, inside: str) -> Path:
        """Where a path inside the node (under one of NODE_MOUNTS) is on the host."""
        return self.path / "root" / inside.lstrip("/")

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> None:
        """Namespaces, network, configuration, containerd (with the images), kubelet and
        kube-proxy; returns once they run (the caller waits for the Node to be Ready)."""
        self._record()
        self.cgroup.create()
        self._start_holder()
        self.network.attach(self.index, self.holder_pid)
        self._write_files()
        self._start_containerd()
        import_images(self.nsenter("-m"), self.binaries.containerd_bin / "ctr",
                      CONTAINERD_SOCKET, self.images)
        self.start_kubelet()
        self._launch("kube-proxy", [str(self.binaries.kube_proxy),
                                    f"--config={self.path / 'kube-proxy.yaml'}"])

    def start_kubelet(self) -> None:
        self._launch("kubelet", [
            str(self.binaries.kubelet),
            f"--config={self.path / 'kubelet.yaml'}",
            f"--kubeconfig={self.settings.kubelet_kubeconfig}",
            f"--hostname-override={self.name}",
            f"--node-ip={self.ip}",
            f"--root-dir={KUBELET_ROOT}",
            "--v=2",
        ])

    def restart_kubelet(self, kill: bool = False) -> None:
        """Stop only the kubelet (SIGTERM, or SIGKILL as in a crash) and start it again; its
        containers keep running. Returns once the new kubelet serves its API."""
        kubelet = self.daemons.pop("kubelet")
        if kill:
            kubelet.process.kill()
            kubelet.process.wait()
        else:
            kubelet.stop()
        self.start_kubelet()
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            self.check_alive()
            with contextlib.suppress(OSError), socket.create_connection((self.ip, KUBELET_PORT),
                                                                        timeout=1):
                return
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"{self.name}: the restarted kubelet does not listen on "
                                        f"{self.ip}:{KUBELET_PORT}")
            time.sleep(0.1)

    def stop(self) -> list[str]:
        """Stop the node as a machine that goes away: every process (daemons, shims,
        containers) killed, cgroups removed, its network namespace gone with its interfaces
        and iptables rules, the host's veth end deleted. Returns what could not be removed."""
        for name in ("kubelet", "kube-proxy"):
            if name in self.daemons:
                self.daemons.pop(name).stop()
        self.cgroup.kill_all()  # containers, shims, containerd, the namespace holder
        for component in [*self.daemons.values(), *([self.holder] if self.holder else [])]:
            component.process.wait()
        self.daemons = {}
        self.holder = None
        left = [str(path) for path in self.cgroup.remove()]
        self.network.detach(self.index)
        return left

    # -- helpers -----------------------------------------------------------------------------

    def nsenter(self, *namespaces: str) -> list[str]:
        """argv prefix that runs a command in this node's namespaces (-m, -n, -u)."""
        return ["nsenter", "-t", str(self.holder_pid), *namespaces, "--"]

    def exec_on_node(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """Run a command on the node (all its namespaces), e.g. `iptables-save`."""
        return subprocess.run([*self.nsenter("-m", "-n", "-u"), *argv], capture_output=True,
                              text=True, check=False)

    def _record(self) -> None:
        """What the sweep of a killed run needs to clean up after this node."""
        self.path.mkdir(parents=True)
        (self.path / "node.json").write_text(json.dumps({
            "cgroup": self.cgroup.name, "veth": self.network.plan.veth(self.index),
        }))

    def _start_holder(self) -> None:
        for inside in NODE_MOUNTS:
            self.host_path(inside).mkdir(parents=True)
        self.holder = self.run_dir.start(
            f"{self.name}-namespaces",
            ["unshare", "--mount", "--net", "--uts", "--propagation", "private", "--",
             sys.executable, "-c", "import signal; signal.pause()", str(self.path)],
            cgroup_procs=self.cgroup.procs_file,
        )
        deadline = time.monotonic() + 10
        mine = os.readlink("/proc/self/ns/net")
        while os.readlink(f"/proc/{self.holder_pid}/ns/net") == mine:
            if time.monotonic() > deadline or self.holder.exited() is not None:
                raise ControlPlaneError(
                    f"{self.name}: unshare did not create namespaces (needs root): "
                    f"{self.holder.last_log_line()}"
                )
            time.sleep(0.01)
        for inside in NODE_MOUNTS:
            run([*self.nsenter("-m"), "mount", "--bind", str(self.host_path(inside)),
                 f"/{inside}"], f"{self.name}: mounting its /{inside}")
        run([*self.nsenter("-u"), "hostname", self.name], f"{self.name}: setting its hostname")

    def _write_files(self) -> None:
        pki_dir = self.path / "pki"
        pki_dir.mkdir()
        issue(self.pki, pki_dir / "kubelet", self.name, server_ips=[self.ip])
        kubelet_client = issue(self.pki, pki_dir / "kubelet-client", f"system:node:{self.name}",
                               "system:nodes")
        proxy_client = issue(self.pki, pki_dir / "kube-proxy", "system:kube-proxy")
        write_kubeconfig(Path(self.settings.kubelet_kubeconfig), self.server, self.pki,
                         kubelet_client)
        write_kubeconfig(Path(self.settings.proxy_kubeconfig), self.server, self.pki,
                         proxy_client)
        (self.path / "resolv.conf").write_text("nameserver 127.0.0.1\n")
        (self.path / "containerd.toml").write_text(containerd_toml(self.settings))
        (self.path / "kubelet.yaml").write_text(dump_yaml(kubelet_config(self.settings)))
        (self.path / "kube-proxy.yaml").write_text(dump_yaml(kube_proxy_config(self.settings)))
        cni = self.host_path(CNI_CONF_DIR)
        cni.mkdir(parents=True)
        (cni / "10-tessera.conflist").write_text(cni_conflist(self.settings))
        self._write_gpus()

    def _write_gpus(self) -> None:
        from tessera_sim.node import GPUSpec, Topology, write_node

        gpu = self.host_path(GPU_DIR)
        # nvidia-smi (the simulator's, in C) finds lib/ beside its bin/ (RUNPATH $ORIGIN/../lib)
        shutil.copytree(self.binaries.sim_build / "lib", gpu / "lib", symlinks=True)
        (gpu / "bin").mkdir()
        shutil.copy2(self.binaries.sim_build / "bin" / "nvidia-smi", gpu / "bin" / "nvidia-smi")
        gpus = node_gpus(self.gpu_models[self.index % len(self.gpu_models)])
        write_node(gpu / "node.conf", [GPUSpec.parse(model) for model in gpus.models],
                   Topology.parse(gpus.nvlink, gpus.numa, len(gpus.models)), seed=self.name)

    def _start_containerd(self) -> None:
        env = dict(os.environ)
        env["PATH"] = f"{self.binaries.containerd_bin}:{env.get('PATH', os.defpath)}"
        self._launch("containerd", [str(self.binaries.containerd_bin / "containerd"),
                                    f"--config={self.path / 'containerd.toml'}"], env)
        socket = self.host_path(CONTAINERD_SOCKET)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not socket.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                log = self.daemons["containerd"].log_path
                raise ControlPlaneError(f"{self.name}: containerd has no socket after "
                                        f"{START_TIMEOUT_S:.0f}s: {log}")
            time.sleep(0.05)

    def _launch(self, daemon: str, argv: Sequence[str], env: dict[str, str] | None = None
                ) -> None:
        self.daemons[daemon] = self.run_dir.start(
            f"{self.name}-{daemon}", [*self.nsenter("-m", "-n", "-u"), *argv], env,
            cgroup_procs=self.cgroup.procs_file,
        )

    def check_alive(self) -> None:
        for name, component in self.daemons.items():
            code = component.exited()
            if code is not None:
                raise ControlPlaneError(
                    f"{self.name}: {name} exited with code {code}: {component.last_log_line()}"
                    f" -- see its log: {component.log_path}"
                )


def sweep_node(path: Path) -> None:
    """After a killed run: kill what its node left (shims, containers), remove its cgroups
    and the host end of its veth (the node's namespaces die with their last process)."""
    try:
        record = json.loads((path / "node.json").read_text())
    except (OSError, ValueError):
        return
    cgroup = NodeCgroup(str(record["cgroup"]))
    cgroup.kill_all()
    cgroup.remove()
    subprocess.run(["ip", "link", "delete", str(record["veth"])], capture_output=True,
                   check=False)
