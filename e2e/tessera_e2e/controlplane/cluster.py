"""A local cluster: etcd, kube-apiserver, kube-controller-manager, kube-scheduler, and N nodes.

Without nodes everything listens on 127.0.0.1 on free ports, and pods are scheduled but never
run. With nodes (node.py: kubelet + containerd + runc + kube-proxy, each node in namespaces of
its own) the API server listens on the test bed bridge's host address instead (network.py), so
that nodes and pods reach it. The API server shows admission webhooks a client certificate
(`write_admission_config`), so webhooks can refuse reviews that do not come from it.
Certificates are made for this run; everything lives in one run directory under the cache (see
processes.py for why stopping is reliable). The controller manager gives namespace deletion,
garbage collection, the `default` ServiceAccount, and the node lifecycle (a node silent for
NODE_MONITOR_GRACE is marked unreachable and tainted).
"""

from __future__ import annotations

import contextlib
import http.client
import itertools
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from tessera_e2e.controlplane.build import containerd_product
from tessera_e2e.controlplane.cache import Layout, default_layout
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.kubeconfig import write_kubeconfig
from tessera_e2e.controlplane.pki import Pki, issue, write_pki
from tessera_e2e.controlplane.processes import Component, RunDirectory, sweep_killed_runs
from tessera_e2e.nodes.config import CNI_BIN_DIR, RUNC
from tessera_e2e.nodes.images import ensure_images
from tessera_e2e.nodes.network import TestbedNetwork, delete_link
from tessera_e2e.nodes.node import GPUs, Node, NodeBinaries, sweep_node
from tessera_e2e.paths import REPO

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"  # the `kubernetes` Service: first address of SERVICE_CIDR
PORT_ATTEMPTS = 3
NODE_READY_TIMEOUT_S = 120.0
DEFAULT_NODES = 2  # `make cluster` and the node_cluster test fixture
APISERVER_STOP_GRACE_S = 2.0  # after nodes (see stop())
# The node lifecycle controller's timings, shortened so that tests see a stopped node's pods
# evicted within seconds (defaults 5 s / 50 s); the kubelets renew their lease every 3 s.
NODE_MONITOR_PERIOD = "2s"
NODE_MONITOR_GRACE = "20s"
SIM_BUILD = REPO / "sim" / "build"
# What nodes use from Debian's packages (`make sysdeps`): runc, the CNI plugins, iptables.
NODE_TOOLS = (RUNC, f"{CNI_BIN_DIR}/bridge", f"{CNI_BIN_DIR}/host-local",
              f"{CNI_BIN_DIR}/portmap", "/usr/sbin/iptables")

Reporter = Callable[[str], None]


class PortTakenError(ControlPlaneError):
    """A component could not bind its port: someone else listens there."""


def _report_to_stderr(line: str) -> None:
    print(f"[cluster] {line}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def port_in_use(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return True
    return False


def write_admission_config(directory: Path, pki: Pki) -> Path:
    """An AdmissionConfiguration under which the API server authenticates to every
    admission webhook with the webhook client certificate (kubeConfigFile, user ``*``: any
    webhook host).  Webhooks trusting ``pki.webhook_client_ca`` then know a review comes
    from the API server."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    kubeconfig = directory / "webhook-client.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate": str(pki.webhook_client_cert),
                                        "client-key": str(pki.webhook_client_key)}}]}))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1",
              "kind": "WebhookAdmissionConfiguration", "kubeConfigFile": str(kubeconfig)}
    config = directory / "admission.json"
    config.write_text(json.dumps({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": name, "configuration": plugin} for name in (
            "ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}))
    return config


class LocalCluster:
    """Start with `start()` or `with LocalCluster(bin_dir) as cluster:`; always `stop()`.

    `extra_args` appends flags per component (e.g. {"kube-apiserver": ["--v=4"]}).
    `controllers=False` runs only etcd and kube-apiserver (faster; no namespace deletion).
    `nodes=N` adds N real nodes (needs root, the controllers, containerd built, sim/ built).
    """

    def __init__(
        self,
        bin_dir: Path,
        layout: Layout | None = None,
        *,
        apiserver_port: int | None = None,
        controllers: bool = True,
        nodes: int = 0,
        containerd_bin: Path | None = None,
        extra_args: Mapping[str, list[str]] | None = None,
        report: Reporter = _report_to_stderr,
        gpu_models: Sequence[GPUs] = (),
    ) -> None:
        self.bin_dir = bin_dir
        self.layout = layout or default_layout()
        self.apiserver_port = apiserver_port
        self.controllers = controllers or nodes > 0
        self.node_count = nodes
        self.gpu_models = tuple(gpu_models)  # each node's simulated GPUs (node.GPU_MODELS,
        # node.NodeGPUs for a topology)
        # Binaries come from the build cache even when runs live elsewhere (tests' layouts).
        self.containerd_bin = containerd_bin or containerd_product(default_layout()).bin_dir
        self.network: TestbedNetwork | None = None
        self.nodes: list[Node] = []
        self.host = HOST
        self.extra_args = dict(extra_args or {})
        self.report = report
        self.run: RunDirectory | None = None
        self.components: list[Component] = []
        self.pki: Pki | None = None
        self.server = ""
        self.kubeconfig = Path()
        self.kept_logs: Path | None = None
        self.ready_seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        for name in ("etcd", "kube-apiserver", "kubectl"):
            if not os.access(self.bin_dir / name, os.X_OK):
                raise ControlPlaneError(
                    f"{self.bin_dir / name} is missing: run `make controlplane` first "
                    "(the first build takes ~7-15 min)"
                )
        for swept in sweep_killed_runs(self.layout.runs, self.layout.kept_logs,
                                       before_remove=_sweep_run_network):
            self.report(
                f"swept a killed run {swept.run.name}: killed {len(swept.killed)} leftover "
                f"processes; its logs are in {swept.logs}"
            )
        started = time.monotonic()
        for attempt in range(1, PORT_ATTEMPTS + 1):
            try:
                self._start_once()
                break
            except PortTakenError as error:
                # Free ports are picked before the components bind them; another program can
                # take one in between. Retry with new ports unless the caller chose the port.
                if self.apiserver_port is not None or attempt == PORT_ATTEMPTS:
                    raise
                self.report(f"{error}; retrying with new ports")
        self.ready_seconds = time.monotonic() - started
        return self

    def _start_once(self) -> None:
        self.run = RunDirectory.create(self.layout.runs)
        logs = str(self.run.logs)
        try:
            self._start_components()
        except ControlPlaneError as error:
            # The run directory goes away; point the message at where its logs were kept.
            kept = self.stop(keep_logs=True)
            raise type(error)(str(error).replace(logs, str(kept))) from None
        except BaseException:
            self.stop(keep_logs=True)
            raise

    def stop(self, keep_logs: bool = False) -> Path | None:
        """Stop every component (newest first), delete the run directory; with keep_logs the
        component logs are moved to the cache's logs/ and their path returned."""
        had_nodes = bool(self.nodes)
        for node in reversed(self.nodes):
            left = node.stop()
            if left:
                self.report(f"{node.name}: could not remove {', '.join(left)}")
        self.nodes = []
        for component in reversed(self.components):
            if had_nodes and component.name == "kube-apiserver":
                # A stopped node's last packets (its connections' FINs) can be lost with its
                # network namespace: the API server's graceful shutdown would wait for those
                # half-open connections until SIGKILL. Its state is thrown away anyway.
                component.stop(grace_s=APISERVER_STOP_GRACE_S)
            else:
                component.stop()
        self.components = []
        if self.network is not None:
            self.network.remove()
            self.network = None
        if self.run is None:
            return None
        run, self.run = self.run, None
        self.kept_logs = run.remove(self.layout.kept_logs if keep_logs else None)
        if self.kept_logs is not None:
            self.report(f"component logs kept in {self.kept_logs}")
        return self.kept_logs

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Ctrl-C is how a person stops `make cluster`: a clean stop, not a failure.
        failed = exc_type is not None and not issubclass(exc_type, KeyboardInterrupt)
        self.stop(keep_logs=failed)

    # -- use ---------------------------------------------------------------------------------

    @property
    def kubectl_path(self) -> Path:
        return self.bin_dir / "kubectl"

    def kubectl(
        self, *args: str, input: str | None = None, timeout: float = 60.0
    ) -> subprocess.CompletedProcess[str]:
        """Run the built kubectl against this cluster; never raises on a non-zero exit."""
        if self.run is None:
            raise ControlPlaneError("the cluster is not running")
        return subprocess.run(
            [str(self.kubectl_path), "--kubeconfig", str(self.kubeconfig),
             "--cache-dir", str(self.run.path / "kube-cache"), *args],
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )

    def server_minor(self) -> int:
        """The API server's minor version (``37`` for 1.37.2): what a test expects of the
        release it runs on."""
        return server_minor(self.kubectl)

    def wait_for_service_account(self, namespace: str, timeout_s: float = 30.0) -> None:
        """Pods need the namespace's `default` ServiceAccount, made by the controller manager."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.kubectl("get", "serviceaccount", "default", "-n", namespace).returncode == 0:
                return
            self._check_alive()
            time.sleep(0.2)
        raise ControlPlaneError(
            f"no default ServiceAccount in namespace {namespace} after {timeout_s:.0f}s: "
            f"is kube-controller-manager working? log: {self._log('kube-controller-manager')}"
        )

    # -- internals ---------------------------------------------------------------------------

    def _log(self, name: str) -> Path:
        assert self.run is not None
        return self.run.logs / f"{name}.log"

    def node(self, name: str) -> Node:
        return next(node for node in self.nodes if node.name == name)

    def wait_for_nodes_ready(self, timeout_s: float = NODE_READY_TIMEOUT_S) -> None:
        """Until every node reports Ready (its kubelet registered, CNI configured)."""
        deadline = time.monotonic() + timeout_s
        ready: set[str] = set()
        while time.monotonic() < deadline:
            self._check_alive()
            got = self.kubectl("get", "nodes", "-o", "jsonpath={range .items[*]}{.metadata.name}="
                               '{.status.conditions[?(@.type=="Ready")].status}{"\\n"}{end}')
            ready = {line.split("=")[0] for line in got.stdout.split() if line.endswith("=True")}
            if ready >= {node.name for node in self.nodes}:
                return
            time.sleep(0.5)
        missing = sorted({node.name for node in self.nodes} - ready)
        raise ControlPlaneError(
            f"nodes {', '.join(missing)} not Ready after {timeout_s:.0f}s: see their kubelet "
            f"logs in {self.run.logs if self.run else '?'}"
        )

    def _ports(self) -> tuple[int, int, int]:
        requested = self.apiserver_port
        if requested is not None and port_in_use(requested):
            raise PortTakenError(
                f"port {requested} on {HOST} is already in use (another cluster or program): "
                "stop it, or choose another port"
            )
        return free_port(), free_port(), requested or free_port()

    def _start_components(self) -> None:
        assert self.run is not None
        run = self.run.path
        etcd_port, peer_port, api_port = self._ports()
        if self.node_count:
            self.network = TestbedNetwork.claim()
            (run / "network.json").write_text(json.dumps({"bridge": self.network.plan.bridge}))
            self.host = self.network.plan.host_ip
        self.pki = pki = write_pki(run / "pki", sorted({self.host, HOST, SERVICE_IP}))
        kubelet_client = issue(pki, run / "pki" / "apiserver-kubelet-client",
                               "kube-apiserver-kubelet-client", "system:masters")
        self.server = f"https://{self.host}:{api_port}"
        self.kubeconfig = write_kubeconfig(run / "kubeconfig", self.server, pki)
        etcd_url = f"http://{HOST}:{etcd_port}"
        self._launch("etcd", [
            "--name=tessera-local",
            f"--data-dir={run / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-advertise-peer-urls=http://{HOST}:{peer_port}",
            f"--initial-cluster=tessera-local=http://{HOST}:{peer_port}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ])
        admission = write_admission_config(run / "admission", pki)
        self._launch("kube-apiserver", [
            f"--etcd-servers={etcd_url}",
            f"--bind-address={self.host}",
            f"--advertise-address={self.host}",
            f"--secure-port={api_port}",
            f"--cert-dir={run / 'pki'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer=https://{self.host}:{api_port}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            # Nodes: kubelets may only touch their own Node and its pods.
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            # logs/exec/port-forward: the API server calls kubelets with a client certificate
            # and checks theirs; webhooks and aggregated APIs are reached at their endpoints.
            f"--kubelet-client-certificate={kubelet_client[0]}",
            f"--kubelet-client-key={kubelet_client[1]}",
            f"--kubelet-certificate-authority={pki.ca_cert}",
            "--kubelet-preferred-address-types=InternalIP",
            "--enable-aggregator-routing=true",
            "--allow-privileged=true",
            f"--admission-control-config-file={admission}",
            # Without the controller manager nobody creates `default` ServiceAccounts.
            *([] if self.controllers else ["--disable-admission-plugins=ServiceAccount"]),
            # Without nodes the API server listens on loopback, which 1.37 refuses to publish
            # as the `kubernetes` Service's endpoint ("may not be in the loopback range"); no
            # pod runs there to reach it, so no endpoint is kept.
            *([] if self.network else ["--endpoint-reconciler-type=none"]),
        ])
        self._wait_ready(api_port)
        if self.controllers:
            kubeconfig = f"--kubeconfig={self.kubeconfig}"
            self._launch("kube-controller-manager", [
                kubeconfig,
                f"--service-account-private-key-file={pki.service_account_key}",
                f"--root-ca-file={pki.ca_cert}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--leader-elect=false",
                "--secure-port=0",
                "--controllers=*",
                # each controller acts as its own ServiceAccount, as kubeadm runs it (the
                # garbage collector is system:serviceaccount:kube-system:generic-garbage-
                # collector to the API server and its admission policies, not the admin)
                "--use-service-account-credentials=true",
                f"--node-monitor-period={NODE_MONITOR_PERIOD}",
                f"--node-monitor-grace-period={NODE_MONITOR_GRACE}",
            ])
            self._launch("kube-scheduler", [kubeconfig, "--leader-elect=false", "--secure-port=0"])
        if self.node_count:
            self._start_nodes()

    def _start_nodes(self) -> None:
        assert self.run is not None and self.network is not None and self.pki is not None
        binaries = NodeBinaries(
            kubelet=self.bin_dir / "kubelet",
            kube_proxy=self.bin_dir / "kube-proxy",
            containerd_bin=self.containerd_bin,
            sim_build=SIM_BUILD,
        )
        needed = [(binaries.kubelet, "make controlplane"),
                  (binaries.containerd_bin / "containerd", "make controlplane"),
                  (SIM_BUILD / "lib" / "libcuda.so.1", "make sim")]
        needed += [(Path(tool), "make sysdeps") for tool in NODE_TOOLS]
        for path, hint in needed:
            if not path.exists():
                raise ControlPlaneError(f"{path} is missing: run `{hint}` first")
        if os.geteuid() != 0:
            raise ControlPlaneError("real nodes need root (namespaces, cgroups, interfaces)")
        started = time.monotonic()
        images = ensure_images(self.layout, SIM_BUILD / "lib")
        self.report(f"images built in {time.monotonic() - started:.1f}s")
        started = time.monotonic()
        for index in range(self.node_count):
            node = Node(index, self.run, self.network, binaries, self.pki, self.server, images,
                        self.gpu_models)
            self.nodes.append(node)
            node.start()
        self.network.route({node.index: node.holder_pid for node in self.nodes})
        self.report(f"{self.node_count} nodes started in {time.monotonic() - started:.1f}s")
        self.wait_for_nodes_ready()
        self.report(f"{self.node_count} nodes Ready in {time.monotonic() - started:.1f}s")

    def _launch(self, name: str, args: list[str]) -> None:
        assert self.run is not None
        argv = [str(self.bin_dir / name), *args, *self.extra_args.get(name, [])]
        self.components.append(self.run.start(name, argv))

    def _check_alive(self) -> None:
        for node in self.nodes:
            node.check_alive()
        for component in self.components:
            code = component.exited()
            if code is None:
                continue
            last = component.last_log_line()
            bind_error = next(
                (line for line in component.log_tail() if "address already in use" in line), None
            )
            if bind_error is not None:
                raise PortTakenError(
                    f"{component.name} could not bind its port (address already in use): "
                    f"{bind_error[:300]} -- free the port or retry: {component.log_path}"
                )
            raise ControlPlaneError(
                f"{component.name} exited with code {code}: {last} -- see its log: "
                f"{component.log_path}"
            )

    def _wait_ready(self, api_port: int) -> None:
        """Poll /readyz over TLS (CA-verified, as cluster-admin) until it answers 200."""
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        context.load_cert_chain(str(self.pki.admin_cert), str(self.pki.admin_key))
        deadline = time.monotonic() + READY_TIMEOUT_S
        last_answer = "no answer"
        while time.monotonic() < deadline:
            self._check_alive()
            connection = http.client.HTTPSConnection(self.host, api_port, context=context,
                                                     timeout=2)
            with contextlib.suppress(OSError, http.client.HTTPException):
                connection.request("GET", "/readyz")
                response = connection.getresponse()
                body = response.read().decode(errors="replace")
                if response.status == 200:
                    connection.close()
                    return
                last_answer = f"HTTP {response.status}: {body.strip().splitlines()[-1:]}"
            connection.close()
            time.sleep(0.1)
        raise ControlPlaneError(
            f"kube-apiserver not ready after {READY_TIMEOUT_S:.0f}s ({last_answer}): "
            f"see its log: {self._log('kube-apiserver')}"
        )


def _sweep_run_network(run: Path) -> None:
    """What a killed run's nodes left behind: their processes, cgroups, interfaces."""
    nodes = run / "nodes"
    if nodes.is_dir():
        for node in sorted(nodes.iterdir()):
            sweep_node(node)
    try:
        bridge = json.loads((run / "network.json").read_text())["bridge"]
    except (OSError, ValueError, KeyError):
        return
    delete_link(str(bridge))


def kubectl_json(cluster: LocalCluster, *args: str) -> Any:
    """``kubectl ARGS -o json``'s object (a failure is an assertion with kubectl's message)."""
    out = cluster.kubectl(*args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def server_minor(kubectl: Callable[..., subprocess.CompletedProcess[str]]) -> int:
    """The minor version of the API server ``kubectl`` talks to."""
    out = kubectl("version", "-o", "json")
    if out.returncode != 0:
        raise ControlPlaneError(f"kubectl version: {out.stderr.strip()}")
    minor = str(json.loads(out.stdout)["serverVersion"]["minor"])
    digits = "".join(itertools.takewhile(str.isdigit, minor))
    if not digits:
        raise ControlPlaneError(f"the API server's minor version {minor!r} is not a number")
    return int(digits)
