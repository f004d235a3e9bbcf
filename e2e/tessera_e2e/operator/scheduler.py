"""``tessera-scheduler`` on the test bed: a second kube-scheduler (the release's own binary)
with one profile, ``tessera-scheduler``, whose extender is tessera's placement service
behind the operator replicas' loopback Service, as the chart deploys it in a cluster: with
the configuration the chart carries (:mod:`tessera_operator.placement.config`), leader-elected
on its Lease in tessera's namespace, as the chart's ServiceAccount ``tessera-scheduler``
(its RBAC is installed with the operator's).

``TesseraScheduler(cluster, operators, logdir).start()``; the CA it trusts is the webhook
serving certificate's (Secret ``tessera-webhook-tls``), which the extender shares.
"""

from __future__ import annotations

import base64
import json
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tessera.api.names import SCHEDULER_NAME
from tessera_e2e.controlplane.processes import die_with_parent
from tessera_e2e.operator.replicas import (
    OPERATOR_NS,
    LocalOperators,
    token_kubeconfig,
    wait_until,
)
from tessera_operator.placement.config import scheduler_configuration


class TesseraScheduler:
    def __init__(self, bin_dir: Path, admin_kubeconfig: Path, operators: LocalOperators,
                 logdir: Path, name: str = SCHEDULER_NAME, url: str | None = None) -> None:
        self.bin = Path(bin_dir) / "kube-scheduler"
        self.kubeconfig = Path(admin_kubeconfig)
        self.operators = operators
        self.url = url
        """The extender's URL; by default the replicas' Service (the round-robin proxy). A
        test that must reach one replica names its webhook port."""
        self.logdir = Path(logdir)
        self.name = name
        self.log = self.logdir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self._log_from = 0

    def ca_pem(self) -> bytes:
        out = self.operators.kubectl("get", "secret", "tessera-webhook-tls", "-n", OPERATOR_NS,
                                     "-o", "json")
        if out.returncode != 0:
            raise RuntimeError(f"webhook Secret: {out.stderr.strip()}")
        data: dict[str, Any] = json.loads(out.stdout).get("data") or {}
        return base64.b64decode(data["ca.crt"])

    def start(self) -> TesseraScheduler:
        if self.proc is not None and self.proc.poll() is None:
            return self
        token = self.operators.kubectl("create", "token", SCHEDULER_NAME, "-n", OPERATOR_NS,
                                       "--duration", "12h")
        if token.returncode != 0:
            raise RuntimeError(f"token for {SCHEDULER_NAME}: {token.stderr.strip()}")
        kubeconfig = token_kubeconfig(self.kubeconfig, self.logdir, token.stdout.strip(),
                                      SCHEDULER_NAME)
        url = self.url or f"https://127.0.0.1:{self.operators.proxy.port}"
        conf = scheduler_configuration(url, OPERATOR_NS, kubeconfig=str(kubeconfig),
                                       ca_pem=self.ca_pem())
        path = self.logdir / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(conf, sort_keys=False))
        self._log_from = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(self.bin), f"--config={path}", "--secure-port=0", "-v=2"],
                stdout=subprocess.DEVNULL, stderr=log, preexec_fn=die_with_parent())
        wait_until("tessera-scheduler holding its Lease", self._started, 60)
        return self

    def _started(self) -> bool:
        """It holds its Lease (so it schedules), by this run's log."""
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"{self.name} exited: {self.log.read_text()[-3000:]}")
        with self.log.open("rb") as f:
            f.seek(self._log_from)
            return b"successfully acquired lease" in f.read().lower()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc = None
