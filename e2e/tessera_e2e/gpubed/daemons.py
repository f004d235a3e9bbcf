"""Run node daemons on simulated GPU nodes against a local control plane (tests, bench).

Each daemon gets a Node object (no kubelet: the Node is created directly), a pod bound to
that Node and a token bound to that pod (so the token carries the node name, as a
DaemonSet pod's does), one simulated GPU node of its own (``tessera_sim``), and runs
``tessera-node run`` with the simulator's driver root.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.processes import die_with_parent, terminate
from tessera_e2e.nodes.node import GPU_DIR, Node
from tessera_e2e.operator.replicas import (
    OPERATOR_NS,
    Kubectl,
    free_port,
    token_kubeconfig,
    wait_until,
)
from tessera_e2e.paths import REPO
from tessera_sim import BIN_DIR, BUILD_DIR, LIB_DIR
from tessera_sim.node import GPUSpec, Topology, write_node

DAEMON_SA = yaml.safe_load((REPO / "charts/tessera/values.yaml").read_text())[
    "nodeDaemon"]["serviceAccount"]["name"]


def create_node(kubectl: Kubectl, name: str, labels: dict[str, str] | None = None) -> None:
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels or {}}}
    out = kubectl("create", "-f", "-", input=json.dumps(body))
    if out.returncode != 0 and "AlreadyExists" not in out.stderr:
        raise RuntimeError(f"creating node {name}: {out.stderr.strip()}")


def bound_token(kubectl: Kubectl, node: str, pod: str | None = None,
                container: dict[str, Any] | None = None) -> str:
    """A token of the daemon's ServiceAccount bound to a pod on ``node`` (the pod is created
    with ``spec.nodeName``, tolerating every taint so that no eviction ends the binding).
    ``container``: the pod's container (on a node with a kubelet it really runs)."""
    pod = pod or f"{DAEMON_SA}-{node}"
    body = {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": OPERATOR_NS},
            "spec": {"nodeName": node, "serviceAccountName": DAEMON_SA,
                     "tolerations": [{"operator": "Exists"}],
                     "terminationGracePeriodSeconds": 1,
                     "containers": [container or {"name": "daemon",
                                                  "image": "tessera-node:dev"}]}}
    out = kubectl("create", "-f", "-", input=json.dumps(body))
    if out.returncode != 0 and "AlreadyExists" not in out.stderr:
        raise RuntimeError(f"creating pod {pod}: {out.stderr.strip()}")
    uid = kubectl("get", "pod", pod, "-n", OPERATOR_NS, "-o", "jsonpath={.metadata.uid}")
    token = kubectl("create", "token", DAEMON_SA, "-n", OPERATOR_NS, "--duration", "2h",
                    "--bound-object-kind", "Pod", "--bound-object-name", pod,
                    "--bound-object-uid", uid.stdout.strip())
    if token.returncode != 0:
        raise RuntimeError(f"token for {DAEMON_SA} bound to {pod}: {token.stderr.strip()}")
    return token.stdout.strip()


def daemon_kubeconfig(kubectl: Kubectl, admin_kubeconfig: Path, directory: Path,
                      node: str, container: dict[str, Any] | None = None) -> Path:
    return token_kubeconfig(admin_kubeconfig, directory,
                            bound_token(kubectl, node, container=container), f"daemon-{node}")


class SimNode:
    """One simulated GPU node (its own state file): ``SimNode(dir, "n1", ["H100-80GB"] * 8)``."""

    def __init__(self, directory: Path, name: str, gpus: list[str],
                 topology: Topology | None = None) -> None:
        """``topology``: NUMA nodes and NVLinks (none: all on NUMA node 0, no NVLink)."""
        directory.mkdir(parents=True, exist_ok=True)
        self.path = write_node(directory / f"{name}.conf", [GPUSpec.parse(g) for g in gpus],
                               topology, seed=name)
        self.env = {**os.environ, "TESSERA_SIM_NODE": str(self.path),
                    "LD_LIBRARY_PATH": f"{LIB_DIR}:{os.environ.get('LD_LIBRARY_PATH', '')}"}

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(BIN_DIR / "nvidia-smi"), *args], env=self.env,
                              capture_output=True, text=True, timeout=60)

    def fault(self, fn: str, count: int, code: int, delay_us: int = 0) -> None:
        """Make the node's next ``count`` calls of ``fn`` fail with ``code`` (count -1: all,
        0: clear; code 0 with a delay: only slow)."""
        subprocess.run([sys.executable, "-m", "tessera_sim", "fault", "--fn", fn, "--count",
                        str(count), "--code", str(code), "--delay-us", str(delay_us)],
                       env=self.env, check=True)


class NodeDaemonProcess:
    """``tessera-node run`` for one simulated node."""

    def __init__(self, node: str, sim: SimNode, kubeconfig: Path, logdir: Path,
                 extra: list[str] | None = None) -> None:
        self.node = node
        self.sim = sim
        self.kubeconfig = kubeconfig
        self.extra = extra
        self.port = free_port()
        self.log = logdir / f"daemon-{node}.log"
        self.plugin_dir = logdir / f"device-plugins-{node}"
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen[bytes] | None = None
        self.host = "127.0.0.1"
        self.args = [sys.executable, "-m", "tessera_node.cli", "run", "--node-name", node,
                     "--kubeconfig", str(kubeconfig), "--driver-root", str(BUILD_DIR),
                     "--state-dir", str(logdir / f"state-{node}"),
                     "--device-plugin-dir", str(self.plugin_dir),
                     "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
                     "--poll-interval", "0.5", "--stuck-after", "3",
                     # no kubelet on these nodes: nothing to register with
                     "--device-plugin", "false", *(extra or [])]

    def start(self) -> NodeDaemonProcess:
        self.start_async()
        wait_until(f"{self.node} daemon serving", lambda: self.get("/healthz")[0] > 0, 30)
        return self

    def start_async(self) -> None:
        """Start the process without waiting for it to serve."""
        env = {**self.sim.env, "PYTHONPATH": daemon_pythonpath()}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log,
                                         env=env, preexec_fn=die_with_parent())

    def get(self, url: str) -> tuple[int, str]:
        """(HTTP status, body) of a GET on the daemon's port; (0, why) when it is not up."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.node} daemon exited: {self.log.read_text()[-3000:]}")
        return http_get(self.host, self.port, url)

    def metric(self, name: str, **labels: str) -> float | None:
        """The value of one sample of /metrics (None when absent)."""
        from prometheus_client.parser import text_string_to_metric_families

        for family in text_string_to_metric_families(self.get("/metrics")[1]):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v
                                               for k, v in labels.items()):
                    return float(sample.value)
        return None

    def log_records(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The daemon's JSON log lines (all its runs) logged at or after ``since``."""
        return json_records(self.log.read_text(), since)

    def stop(self) -> None:
        terminate(self.proc)


def http_get(host: str, port: int, url: str) -> tuple[int, str]:
    """(HTTP status, body) of a GET on a daemon's metrics port; (0, why) when it does not
    answer."""
    try:
        with socket.create_connection((host, port), timeout=5) as s:
            s.sendall(f"GET {url} HTTP/1.0\r\n\r\n".encode())
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
    except OSError as exc:
        return 0, str(exc)
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


def json_records(log: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The JSON lines of a daemon's log (other lines skipped) logged at or after ``since``
    (their ``ts``)."""
    out = []
    for line in log.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and rec.get("ts", 0) >= since:
            out.append(rec)
    return out


def daemon_pythonpath() -> str:
    return os.pathsep.join([str(REPO / "core"), str(REPO / "operator"),
                            str(REPO / "node-daemon"), os.environ.get("PYTHONPATH", "")])


LIBTESSERA = REPO / "hook" / "build" / "libtessera.so"


class KubeletNodeDaemon(NodeDaemonProcess):
    """``tessera-node run`` on a real node of the test bed (its kubelet, its containerd),
    in the node's namespaces as a DaemonSet pod with host paths would be: the kubelet's
    device-plugin and PodResources sockets and ``/var/lib/tessera`` at their standard
    places, the node's simulated GPUs (``GPU_DIR``) as its driver, the ``sim`` visibility
    (containerd here has no CDI), metrics on the node's own address. The kubelet's
    PodResources API is reached through a proxy the tests can hold (``podres``): a daemon
    that cannot confirm which pod an allocation is for, as if it were slow."""

    PODRES_PROXY = "/run/tessera-podres.sock"

    def __init__(self, node: Node, kubeconfig: Path, logdir: Path,
                 extra: list[str] | None = None) -> None:
        ns_root = f"/proc/{node.holder_pid}/root"
        self.podres = HoldableUnixProxy(
            ns_root + self.PODRES_PROXY,
            ns_root + "/var/lib/kubelet/pod-resources/kubelet.sock").start()
        self.node = node.name
        self.real = node
        self.kubeconfig = kubeconfig
        self.extra = extra
        self.port = free_port()
        self.host = node.ip
        self.log = logdir / f"daemon-{node.name}.log"
        self.plugin_dir = node.host_path("/var/lib/kubelet/device-plugins")
        self.state_dir = node.host_path("/var/lib/tessera")
        self.proc = None
        self.args = [*node.nsenter("-m", "-n", "-u"), sys.executable, "-m",
                     "tessera_node.cli", "run", "--node-name", node.name,
                     "--kubeconfig", str(kubeconfig), "--driver-root", GPU_DIR,
                     "--device-visibility", "sim", "--libtessera", str(LIBTESSERA),
                     "--pod-resources-socket", self.PODRES_PROXY,
                     "--metrics-host", node.ip, "--metrics-port", str(self.port),
                     "--poll-interval", "0.5", "--stuck-after", "10", *(extra or [])]
        self.env = {**os.environ, "TESSERA_SIM_NODE": f"{GPU_DIR}/node.conf",
                    "PYTHONPATH": daemon_pythonpath()}

    def start_async(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log,
                                         env=self.env, preexec_fn=die_with_parent())

    def stop(self) -> None:
        super().stop()
        self.podres.stop()

    def smi(self, *args: str) -> subprocess.CompletedProcess[str]:
        return node_smi(self.real, *args)

    def restart(self) -> None:
        """Stop ``tessera-node`` (its PodResources proxy stays) and start it again; returns
        once it is ready."""
        super().stop()
        self.start()
        self.wait_ready()

    def wait_ready(self) -> None:
        wait_until(f"{self.node} daemon ready", lambda: self.get("/readyz")[0] == 200, 60)


def node_smi(node: Node, *args: str) -> subprocess.CompletedProcess[str]:
    """nvidia-smi on a real node of the test bed (the simulator's, in its driver root), as an
    administrator would run it: its output is NVML's view."""
    return subprocess.run([*node.nsenter("-m"), "env", f"TESSERA_SIM_NODE={GPU_DIR}/node.conf",
                           f"{GPU_DIR}/bin/nvidia-smi", *args],
                          capture_output=True, text=True, timeout=60)


class HoldableUnixProxy:
    """A unix-socket forwarder a test can hold: while held, each new connection is closed at
    once (the client sees the server unavailable). Paths may be ``/proc/<pid>/root/...`` to
    reach into a node's mount namespace (short enough for a socket address)."""

    def __init__(self, listen: str, target: str) -> None:
        self.listen = listen
        self.target = target
        self.held = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="unix-proxy")
        self._ready = threading.Event()

    def start(self) -> HoldableUnixProxy:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.listen)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError(f"proxy at {self.listen} did not start")
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(asyncio.start_unix_server(self._handle, self.listen))
        self._ready.set()
        self._loop.run_forever()

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        if self.held.is_set():
            w.close()
            return
        try:
            tr, tw = await asyncio.open_unix_connection(self.target)
        except OSError:
            w.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except OSError:
                pass
            finally:
                dst.close()

        await asyncio.gather(pipe(r, tw), pipe(tr, w))

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)


def node_json(kubectl: Kubectl, node: str) -> Any:
    out = kubectl("get", "node", node, "-o", "json")
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip())
    return json.loads(out.stdout)


def start_sim_daemon(kubectl: Kubectl, admin_kubeconfig: Path, directory: Path,
                     gpus: list[str], labels: dict[str, str] | None = None,
                     extra: list[str] | None = None, name: str | None = None,
                     topology: Topology | None = None) -> NodeDaemonProcess:
    """A running daemon on a fresh Node (``nd-<random>`` unless named) with its own
    simulated GPUs (and their ``topology``), its pod-bound token and its logs in
    ``directory``."""
    node = name or f"nd-{uuid.uuid4().hex[:8]}"
    create_node(kubectl, node, labels)
    kubeconfig = daemon_kubeconfig(kubectl, admin_kubeconfig, directory, node)
    d = NodeDaemonProcess(node, SimNode(directory / "sim", node, gpus, topology), kubeconfig,
                          directory, extra)
    try:
        return d.start()
    except BaseException:
        remove_sim_daemon(kubectl, d)
        raise


def remove_sim_daemon(kubectl: Kubectl, d: NodeDaemonProcess) -> None:
    """Stop the daemon and delete its pod and Node."""
    d.stop()
    kubectl("delete", "pod", f"{DAEMON_SA}-{d.node}", "-n", OPERATOR_NS, "--wait=false")
    kubectl("delete", "node", d.node, "--wait=false")
