"""Running real operator processes against the local control plane, as the chart's RBAC.

The operator gets a kubeconfig holding a ServiceAccount token bound to exactly the
ClusterRole/Role of ``charts/tessera/templates/rbac.yaml`` (never the admin certificate), a
loopback round-robin TLS proxy stands in front of the replicas' webhook ports, and the
webhook configurations point at the proxy (URL client config).
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
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
OPERATOR_NS = "tessera-system"


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
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what} (last: {last!r})")


def render_rbac(namespace: str = OPERATOR_NS) -> str:
    text = (REPO / "charts/tessera/templates/rbac.yaml").read_text()
    values = yaml.safe_load((REPO / "charts/tessera/values.yaml").read_text())
    return (text.replace("{{ .Release.Namespace }}", namespace)
            .replace("{{ .Values.serviceAccount.name }}", values["serviceAccount"]["name"]))


def operator_kubeconfig(cluster: Any, directory: Path) -> Path:
    """A kubeconfig with the operator ServiceAccount's token and the cluster's CA."""
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    c = admin["clusters"][0]["cluster"]
    token = cluster.kubectl("create", "token", "tessera-operator", "-n", OPERATOR_NS,
                            "--duration", "6h")
    assert token.returncode == 0, token.stderr
    ca = c.get("certificate-authority")
    if ca is not None and not os.path.isabs(ca):
        ca = str(Path(cluster.kubeconfig).parent / ca)
    cl: dict[str, Any] = {"server": c["server"]}
    if ca:
        cl["certificate-authority"] = ca
    else:
        cl["certificate-authority-data"] = c["certificate-authority-data"]
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "op",
           "clusters": [{"name": "local", "cluster": cl}],
           "users": [{"name": "op", "user": {"token": token.stdout.strip()}}],
           "contexts": [{"name": "op", "context": {"cluster": "local", "user": "op"}}]}
    path = directory / "operator.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return path


class RoundRobinProxy:
    """TLS passthrough on loopback: each new connection goes to the next live backend."""

    def __init__(self) -> None:
        self.port = free_port()
        self.backends: list[int] = []
        self.connections: dict[int, int] = {}
        self._i = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._ready = threading.Event()

    def start(self) -> RoundRobinProxy:
        self._thread.start()
        self._ready.wait(5)
        return self

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_until_complete(server.serve_forever())

    async def _handle(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        for _ in range(max(1, len(self.backends))):
            if not self.backends:
                break
            port = self.backends[self._i % len(self.backends)]
            self._i += 1
            try:
                br, bw = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                continue
            self.connections[port] = self.connections.get(port, 0) + 1

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                try:
                    while data := await src.read(65536):
                        dst.write(data)
                        await dst.drain()
                except (ConnectionError, OSError):
                    pass
                finally:
                    dst.close()
            await asyncio.gather(pipe(r, bw), pipe(br, w))
            return
        w.close()


class OperatorProcess:
    """One replica: ``python -m tessera.cli.operator run`` as the ServiceAccount."""

    def __init__(self, kubeconfig: Path, proxy: RoundRobinProxy, logdir: Path, name: str,
                 extra: list[str] | None = None) -> None:
        self.name = name
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.log = logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.args = [sys.executable, "-m", "tessera.cli.operator", "run",
                     "--kubeconfig", str(kubeconfig), "--namespace", OPERATOR_NS,
                     "--identity", name, "--webhook-host", "127.0.0.1",
                     "--webhook-port", str(self.webhook_port),
                     "--webhook-url", f"https://127.0.0.1:{proxy.port}",
                     "--health-host", "127.0.0.1", "--health-port", str(self.health_port),
                     "--lease-duration", "6", "--lease-renew", "2",
                     "--recount-interval", "1", "--drift-grace", "2", *(extra or [])]
        self.proxy = proxy

    def start(self) -> OperatorProcess:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(REPO / "operator"), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=self.log.open("ab"), env=env)
        wait_until(f"{self.name} /healthz", self.healthy, 30)
        if self.webhook_port not in self.proxy.backends:
            self.proxy.backends.append(self.webhook_port)
        return self

    def healthy(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise AssertionError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        try:
            with socket.create_connection(("127.0.0.1", self.health_port), timeout=1) as s:
                s.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
                return b" 200 " in s.recv(100)
        except OSError:
            return False

    def metrics(self) -> str:
        with socket.create_connection(("127.0.0.1", self.health_port), timeout=2) as s:
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            chunks = []
            while data := s.recv(65536):
                chunks.append(data)
        return b"".join(chunks).decode()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


def kubectl_json(cluster: Any, *args: str) -> Any:
    out = cluster.kubectl(*args, "-o", "json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def lease_holder(cluster: Any) -> str:
    out = cluster.kubectl("get", "lease", "tessera-operator", "-n", OPERATOR_NS, "-o",
                          "jsonpath={.spec.holderIdentity}")
    return out.stdout.strip() if out.returncode == 0 else ""
