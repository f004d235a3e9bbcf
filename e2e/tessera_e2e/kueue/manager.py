"""Kueue's controller-manager on the test bed, as a local process against its API server.

``LocalKueue(cluster, binary).install().start()``: the CRDs, RBAC and webhook configurations
rendered from the pinned module (:mod:`.manifests`), then the manager with the configuration
of tessera's recipe (``examples/kueue/manager/kueue-config.yaml``: the ``batch/job`` and ``pod``
integrations, plain Pods managed only in namespaces labelled ``kueue-managed=true``,
``tessera.dev/pod`` excluded from quota, admission fair sharing with a usage half-life)
plus what running on loopback needs:

- the webhooks are served on a free loopback port with a certificate the cluster's CA signed
  for 127.0.0.1, and every webhook configuration and CRD conversion calls that URL with that
  CA (Kueue's own certificate management is off: the certificate it makes names only the
  in-cluster Service, ``kueue-webhook-service.kueue-system.svc``, which the API server does
  not dial here);
- with its certificate management off Kueue reads the metrics server's certificate from the
  fixed path ``/etc/kueue/metrics/certs``: the manager runs in a mount namespace of its own
  whose ``/etc`` is an overlay that adds that directory, so the host's ``/etc`` is untouched;
- health, metrics and webhook ports are free loopback ports; leader election is off (one
  manager); the visibility API server (``VisibilityOnDemand``, an aggregated API) is off;
- it runs as its ServiceAccount ``kueue-controller-manager`` with the module's RBAC (a token
  kubeconfig, as the operator's replicas run), never as cluster-admin.

The manager is one of the cluster's components: its pid file and log live in the run
directory (``logs/kueue.log``), so a killed test run's sweep ends it and a failed one keeps
its log.
"""

from __future__ import annotations

import json
import shutil
import ssl
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.cluster import LocalCluster
from tessera_e2e.controlplane.errors import ControlPlaneError
from tessera_e2e.controlplane.pki import issue
from tessera_e2e.kueue.manifests import Rendered, module_source, render, serve_at
from tessera_e2e.operator.replicas import free_port, token_kubeconfig, wait_until
from tessera_e2e.paths import REPO

RECIPE_CONFIG = REPO / "examples" / "kueue" / "manager" / "kueue-config.yaml"
METRICS_CERT_DIR = "kueue/metrics/certs"
"""Under /etc: where Kueue reads its metrics certificate when it manages none itself."""
START_TIMEOUT_S = 90.0

_LAUNCH = """set -e
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1,workdir=$2" /etc
shift 2
exec "$@"
"""
"""Runs inside ``unshare --mount``: /etc gains the metrics certificate, then the manager."""


def recipe_configuration(path: Path = RECIPE_CONFIG) -> dict[str, Any]:
    """The Kueue Configuration tessera's recipe ships."""
    doc = yaml.safe_load(path.read_text())
    if not isinstance(doc, dict) or doc.get("kind") != "Configuration":
        raise ControlPlaneError(f"{path} is not a Kueue Configuration")
    return doc


class LocalKueue:
    def __init__(self, cluster: LocalCluster, binary: Path,
                 config: dict[str, Any] | None = None) -> None:
        if cluster.run is None or cluster.pki is None:
            raise ControlPlaneError("the cluster is not running")
        self.cluster = cluster
        self.binary = Path(binary)
        self.dir = cluster.run.path / "kueue"
        self.rendered: Rendered = render(module_source())
        self.webhook_port = free_port()
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.base = config if config is not None else recipe_configuration()
        self.component: Any = None
        self.ready_seconds = 0.0
        """From the manager's launch to its /readyz answering 200."""

    @property
    def namespace(self) -> str:
        return self.rendered.namespace

    @property
    def log(self) -> Path:
        assert self.cluster.run is not None
        return self.cluster.run.logs / "kueue.log"

    def _apply(self, docs: list[dict[str, Any]], what: str) -> None:
        text = "\n---\n".join(json.dumps(d) for d in docs)
        out = self.cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-",
                                   input=text, timeout=120)
        if out.returncode != 0:
            raise ControlPlaneError(f"applying Kueue's {what}: {out.stderr.strip()[-2000:]}")

    def install(self) -> LocalKueue:
        """Certificates, the namespace, CRDs (established), RBAC, webhook configurations."""
        assert self.cluster.pki is not None
        pki = self.cluster.pki
        certs = self.dir / "serving-certs"
        certs.mkdir(parents=True, exist_ok=True)
        crt, key = issue(pki, certs / "webhook", "kueue-webhook", server_ips=["127.0.0.1"])
        crt.rename(certs / "tls.crt")
        key.rename(certs / "tls.key")
        # the overlay's upper layer: /etc/kueue/metrics/certs/tls.{crt,key}
        metrics = self.dir / "etc-upper" / METRICS_CERT_DIR
        metrics.mkdir(parents=True, exist_ok=True)
        for name in ("tls.crt", "tls.key"):
            shutil.copyfile(certs / name, metrics / name)
        (self.dir / "etc-work").mkdir(exist_ok=True)
        ca = pki.ca_cert.read_bytes()
        base_url = f"https://127.0.0.1:{self.webhook_port}"
        self.cluster.kubectl("create", "namespace", self.namespace)
        self._apply(serve_at(self.rendered.crds, base_url, ca), "CRDs")
        out = self.cluster.kubectl(
            "wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{name}" for name in self.rendered.crd_names()), timeout=90)
        if out.returncode != 0:
            raise ControlPlaneError(f"Kueue's CRDs not established: {out.stderr.strip()}")
        self._apply(self.rendered.rbac, "RBAC")
        self._apply(serve_at(self.rendered.webhooks, base_url, ca), "webhook configurations")
        return self

    def configuration(self) -> dict[str, Any]:
        """The recipe's configuration with the test bed's settings over it."""
        conf: dict[str, Any] = json.loads(json.dumps(self.base))
        conf.update({
            "namespace": self.namespace,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {"host": "127.0.0.1", "port": self.webhook_port,
                        "certDir": str(self.dir / "serving-certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        })
        gates = dict(conf.get("featureGates") or {})
        gates["VisibilityOnDemand"] = False
        conf["featureGates"] = gates
        return conf

    def start(self) -> LocalKueue:
        cluster = self.cluster
        assert cluster.run is not None
        sa = self.rendered.service_account
        token = cluster.kubectl("create", "token", sa, "-n", self.namespace,
                                "--duration", "12h")
        if token.returncode != 0:
            raise ControlPlaneError(f"token for {sa}: {token.stderr.strip()}")
        kubeconfig = token_kubeconfig(cluster.kubeconfig, self.dir, token.stdout.strip(), sa)
        config = self.dir / "controller_manager_config.yaml"
        config.write_text(yaml.safe_dump(self.configuration(), sort_keys=False))
        argv = ["unshare", "--mount", "--propagation", "private", "sh", "-c", _LAUNCH,
                "kueue-launch", str(self.dir / "etc-upper"), str(self.dir / "etc-work"),
                str(self.binary), f"--config={config}", f"--kubeconfig={kubeconfig}",
                "--zap-log-level=2"]
        started = time.monotonic()
        self.component = cluster.run.start("kueue", argv)
        cluster.components.append(self.component)
        wait_until("Kueue's manager ready (/readyz)", self._ready, START_TIMEOUT_S, 0.2)
        self.ready_seconds = time.monotonic() - started
        return self

    def _ready(self) -> bool:
        if self.component is None or self.component.exited() is not None:
            tail = "\n".join(self.component.log_tail(30)) if self.component else ""
            raise ControlPlaneError(f"Kueue's manager exited:\n{tail}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz",
                                        timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def webhook_answers(self) -> bool:
        """Its webhook port takes TLS with the certificate the API server trusts."""
        assert self.cluster.pki is not None
        context = ssl.create_default_context(cafile=str(self.cluster.pki.ca_cert))
        try:
            with urllib.request.urlopen(f"https://127.0.0.1:{self.webhook_port}/healthz",
                                        context=context, timeout=2):
                return True
        except urllib.error.HTTPError:
            return True  # TLS held; the path itself need not exist
        except OSError:
            return False

    def stop(self) -> None:
        if self.component is None:
            return
        self.component.stop()
        if self.component in self.cluster.components:
            self.cluster.components.remove(self.component)
        self.component = None
