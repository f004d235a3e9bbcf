"""A local control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

Everything listens on 127.0.0.1 on free ports, uses certificates made for this run, and lives in
one run directory under the cache (see processes.py for why stopping is reliable).  The API
server shows admission webhooks a client certificate (`write_admission_config`), so webhooks
can refuse reviews that do not come from it. There is no
kubelet, so pods are scheduled but never run; the controller manager gives namespace deletion,
garbage collection and the `default` ServiceAccount.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import TracebackType

from tessera_e2e.cache import Layout, default_layout
from tessera_e2e.errors import ControlPlaneError
from tessera_e2e.kubeconfig import write_kubeconfig
from tessera_e2e.pki import Pki, write_pki
from tessera_e2e.processes import Component, RunDirectory, sweep_killed_runs

HOST = "127.0.0.1"
READY_TIMEOUT_S = 60.0
SERVICE_CIDR = "10.0.0.0/24"
PORT_ATTEMPTS = 3

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
    """

    def __init__(
        self,
        bin_dir: Path,
        layout: Layout | None = None,
        *,
        apiserver_port: int | None = None,
        controllers: bool = True,
        extra_args: Mapping[str, list[str]] | None = None,
        report: Reporter = _report_to_stderr,
    ) -> None:
        self.bin_dir = bin_dir
        self.layout = layout or default_layout()
        self.apiserver_port = apiserver_port
        self.controllers = controllers
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
        for swept in sweep_killed_runs(self.layout.runs, self.layout.kept_logs):
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
        for component in reversed(self.components):
            component.stop()
        self.components = []
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
        self.pki = pki = write_pki(run / "pki")
        self.server = f"https://{HOST}:{api_port}"
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
            f"--bind-address={HOST}",
            f"--advertise-address={HOST}",
            f"--secure-port={api_port}",
            f"--cert-dir={run / 'pki'}",
            f"--tls-cert-file={pki.serving_cert}",
            f"--tls-private-key-file={pki.serving_key}",
            f"--client-ca-file={pki.ca_cert}",
            f"--service-account-issuer=https://{HOST}:{api_port}",
            f"--service-account-key-file={pki.service_account_pub}",
            f"--service-account-signing-key-file={pki.service_account_key}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=RBAC",
            "--allow-privileged=true",
            f"--admission-control-config-file={admission}",
            # Without the controller manager nobody creates `default` ServiceAccounts.
            *([] if self.controllers else ["--disable-admission-plugins=ServiceAccount"]),
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
            ])
            self._launch("kube-scheduler", [kubeconfig, "--leader-elect=false", "--secure-port=0"])

    def _launch(self, name: str, args: list[str]) -> None:
        assert self.run is not None
        argv = [str(self.bin_dir / name), *args, *self.extra_args.get(name, [])]
        self.components.append(self.run.start(name, argv))

    def _check_alive(self) -> None:
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
            connection = http.client.HTTPSConnection(HOST, api_port, context=context, timeout=2)
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
