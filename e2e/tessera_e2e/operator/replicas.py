"""Run the operator on a local control plane (tests, demo, benchmarks).

Installs the CRDs and the chart's RBAC, gives the operator a kubeconfig with a token of its
ServiceAccount (so it runs with exactly the chart's permissions, never as cluster-admin),
and starts replicas behind a loopback round-robin TLS proxy that the webhook configurations
point at (URL client config).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import yaml

from tessera_e2e.chart import render as chart
from tessera_e2e.controlplane.processes import die_with_parent
from tessera_e2e.paths import REPO

OPERATOR_NS = "tessera-system"
Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(what: str, check: Callable[[], Any], timeout: float = 30.0,
               interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def json_stream(text: str) -> list[Any]:
    """The objects of concatenated JSON documents (what ``kubectl get -w -o json`` prints)."""
    decoder, pos, out = json.JSONDecoder(), 0, []
    text = text.strip()
    while pos < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        out.append(obj)
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return out


def render_chart(namespace: str = OPERATOR_NS, values: dict[str, Any] | None = None) -> str:
    """The chart's RBAC, admission policies and network policy with the chart's values
    (``values`` merged over them), as one multi-document YAML. The operator run here applies
    its webhook configurations itself (URL client config), so it gets `create` on them."""
    return chart.render(namespace, chart.merge({"webhook": {"operatorAppliesConfigurations":
                                                            True}}, values or {}))


def install(kubectl: Kubectl) -> None:
    """CRDs (server-side apply), the operator namespace and the chart (RBAC, policies)."""
    for crd in sorted((REPO / "crds").glob("*.yaml")):
        out = kubectl("apply", "--server-side", "-f", str(crd))
        if out.returncode != 0:
            raise RuntimeError(f"applying {crd.name}: {out.stderr.strip()}")
    for name in ("gpupartitions.tessera.dev", "gpuquotas.tessera.dev"):
        kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=30s")
    kubectl("create", "namespace", OPERATOR_NS)
    out = kubectl("apply", "-f", "-", input=render_chart())
    if out.returncode != 0:
        raise RuntimeError(f"applying the chart: {out.stderr.strip()}")


def operator_kubeconfig(kubectl: Kubectl, admin_kubeconfig: Path, directory: Path,
                        server: str | None = None, name: str = "operator") -> Path:
    """A kubeconfig holding a token of the operator ServiceAccount and the cluster's CA
    (``server`` instead of the cluster's own address: e.g. a proxy a test can cut)."""
    token = kubectl("create", "token", "tessera-operator", "-n", OPERATOR_NS,
                    "--duration", "12h")
    if token.returncode != 0:
        raise RuntimeError(f"token for tessera-operator: {token.stderr.strip()}")
    return token_kubeconfig(admin_kubeconfig, directory, token.stdout.strip(), name, server)


def token_kubeconfig(admin_kubeconfig: Path, directory: Path, token: str, name: str,
                     server: str | None = None) -> Path:
    """A kubeconfig for ``token`` on the cluster of ``admin_kubeconfig``."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    c = admin["clusters"][0]["cluster"]
    cl: dict[str, Any] = {"server": server or c["server"]}
    ca = c.get("certificate-authority")
    if ca:
        cl["certificate-authority"] = str(Path(admin_kubeconfig).parent / ca)
    else:
        cl["certificate-authority-data"] = c["certificate-authority-data"]
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "op",
           "clusters": [{"name": "local", "cluster": cl}],
           "users": [{"name": "op", "user": {"token": token}}],
           "contexts": [{"name": "op", "context": {"cluster": "local", "user": "op"}}]}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


class Endpoints(Protocol):
    """Where the API server reaches the webhook replicas: ``port`` on loopback, routed to
    the replicas that run now (a Service's endpoints)."""

    port: int

    def route(self, name: str, port: int) -> None: ...

    def drop(self, name: str, port: int) -> None: ...


class RoundRobinProxy:
    """TLS passthrough on loopback: each new connection goes to the next live backend.

    Like a Service's endpoints, a replica is routed to while it runs: ``route`` when it is
    up, ``drop`` when it stops or is killed.  (A dropped replica's port is free again, and
    the next process to bind it may be anything; a proxy that kept it handed the API
    server's requests to that process, which answered with EOF.)
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.backends: dict[str, int] = {}
        """Replica name -> its webhook port, for the replicas running now."""
        self.connections: dict[int, int] = {}
        self._open: set[asyncio.StreamWriter] = set()
        self._i = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rr-proxy")
        self._ready = threading.Event()

    def start(self) -> RoundRobinProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    def route(self, name: str, port: int) -> None:
        self.backends = {**self.backends, name: port}

    def drop(self, name: str, port: int) -> None:
        """Stop routing to replica ``name`` if ``port`` is still where it is routed."""
        if self.backends.get(name) == port:
            self.backends = {k: v for k, v in self.backends.items() if k != name}

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_until_complete(server.serve_forever())

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ports = list(self.backends.values())  # one snapshot: the dict is replaced, not edited
        for _ in range(len(ports)):
            port = ports[self._i % len(ports)]
            self._i += 1
            try:
                br, bw = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.connections[port] = self.connections.get(port, 0) + 1
            self._open.update((w, bw))
            try:
                await asyncio.gather(_pipe(r, bw), _pipe(br, w))
            finally:
                self._open.difference_update((w, bw))
            return
        w.close()

    def cut(self) -> None:
        """A network partition: no backend, and every open connection closed."""
        self.backends = {}

        def close_all() -> None:
            for writer in list(self._open):
                writer.close()
        self._loop.call_soon_threadsafe(close_all)


async def _pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(65536):
            dst.write(data)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        dst.close()


class OperatorProcess:
    """One replica: ``python -m tessera_operator.cli.operator run`` as the ServiceAccount."""

    def __init__(self, kubeconfig: Path, proxy: Endpoints, logdir: Path, name: str,
                 extra: list[str] | None = None) -> None:
        self.name = name
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.log = logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.proxy = proxy
        self.args = [sys.executable, "-m", "tessera_operator.cli.operator", "run",
                     "--kubeconfig", str(kubeconfig), "--namespace", OPERATOR_NS,
                     "--identity", name, "--webhook-host", "127.0.0.1",
                     "--webhook-port", str(self.webhook_port),
                     "--webhook-url", f"https://127.0.0.1:{proxy.port}",
                     "--placement-url", f"https://127.0.0.1:{self.webhook_port}",
                     "--health-host", "127.0.0.1", "--health-port", str(self.health_port),
                     "--lease-duration", "6", "--lease-renew", "2",
                     "--webhook-config-interval", "2", "--stuck-after", "10",
                     # the proxy stops routing to a replica before it stops, so a short
                     # drain: only for the leader's work in flight (a pod event it has read,
                     # its debounced count write) to land, as it does in a cluster
                     "--shutdown-drain", "0.5", *(extra or [])]

    def start(self) -> OperatorProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO / "core"), str(REPO / "operator"), os.environ.get("PYTHONPATH", "")])}
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL, stderr=log,
                                         env=env, preexec_fn=die_with_parent())
        wait_until(f"{self.name} /healthz", self.healthy, 30)
        self.proxy.route(self.name, self.webhook_port)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        try:
            return b" 200 " in self._get("/healthz")[:100]
        except OSError:
            return False

    def _get(self, url: str) -> bytes:
        with socket.create_connection(("127.0.0.1", self.health_port), timeout=2) as s:
            s.sendall(f"GET {url} HTTP/1.0\r\n\r\n".encode())
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
        return b"".join(chunks)

    def metrics(self) -> str:
        return self._get("/metrics").decode()

    def kill(self) -> None:
        self.proxy.drop(self.name, self.webhook_port)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        self.proxy.drop(self.name, self.webhook_port)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def lease_holder(kubectl: Kubectl) -> str:
    out = kubectl("get", "lease", "tessera-operator", "-n", OPERATOR_NS, "-o",
                  "jsonpath={.spec.holderIdentity}")
    return out.stdout.strip() if out.returncode == 0 else ""


class LocalOperators:
    """Replicas of the operator and the proxy in front of them (demo, tests, bench).

    ``LocalOperators(cluster.kubectl, cluster.kubeconfig, logdir).setup().ensure_running()``
    """

    def __init__(self, kubectl: Kubectl, admin_kubeconfig: Path, logdir: Path,
                 names: tuple[str, ...] = ("op-a", "op-b"),
                 webhook_client_ca: Path | None = None) -> None:
        self.kubectl = kubectl
        self.admin_kubeconfig = Path(admin_kubeconfig)
        self.logdir = logdir
        self.names = names
        self.extra = ([] if webhook_client_ca is None else
                      ["--webhook-client-ca", str(webhook_client_ca)])
        """Flags every replica gets: with the cluster's webhook client CA, the webhooks
        take reviews only from the API server (LocalCluster's AdmissionConfiguration)."""
        self.proxy = RoundRobinProxy().start()
        self.replicas: dict[str, OperatorProcess] = {}
        self.kubeconfig = logdir / "operator.kubeconfig"

    def setup(self) -> LocalOperators:
        install(self.kubectl)
        self.kubeconfig = operator_kubeconfig(self.kubectl, self.admin_kubeconfig, self.logdir)
        return self

    def start(self, name: str, kubeconfig: Path | None = None,
              extra: list[str] | None = None) -> OperatorProcess:
        """(Re)start replica ``name``; ``kubeconfig`` e.g. reaches the API server through a
        proxy the test can cut (see :meth:`kubeconfig_via`); ``extra``: more flags."""
        old = self.replicas.get(name)
        if old is not None:
            old.stop()
        rep = OperatorProcess(kubeconfig or self.kubeconfig, self.proxy, self.logdir, name,
                              [*self.extra, *(extra or [])]).start()
        self.replicas[name] = rep
        return rep

    def kubeconfig_via(self, proxy: RoundRobinProxy) -> Path:
        """The operator's kubeconfig, reaching the API server through ``proxy``."""
        return operator_kubeconfig(self.kubectl, self.admin_kubeconfig, self.logdir,
                                   server=f"https://127.0.0.1:{proxy.port}",
                                   name=f"operator-via-{proxy.port}")

    def leader(self) -> OperatorProcess:
        name = wait_until("a leader", lambda: lease_holder(self.kubectl) in self.replicas
                          and lease_holder(self.kubectl), 30)
        return self.replicas[str(name)]

    def ensure_running(self) -> LocalOperators:
        for name in self.names:
            rep = self.replicas.get(name)
            if rep is None or rep.proc is None or rep.proc.poll() is not None:
                self.start(name)
        self.leader()
        wait_until("webhook configuration", lambda: self.kubectl(
            "get", "mutatingwebhookconfiguration", "tessera-pods").returncode == 0, 30)
        return self

    def stop_all(self) -> None:
        for rep in self.replicas.values():
            rep.stop()

    def uninstall_webhooks(self) -> None:
        self.kubectl("delete", "mutatingwebhookconfiguration", "tessera-pods",
                     "--ignore-not-found")
        self.kubectl("delete", "validatingwebhookconfiguration", "tessera-resources",
                     "--ignore-not-found")
