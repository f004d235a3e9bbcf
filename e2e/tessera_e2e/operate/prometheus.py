"""A real Prometheus (Debian's ``prometheus`` package) on loopback, for tests and the demo.

``LocalPrometheus(directory, rule_files).start()`` runs ``prometheus`` with its data in
``directory``; targets are given per job with :meth:`set_targets` (file-based discovery, so
they can change while it runs) and the HTTP API answers :meth:`query`, :meth:`query_range`,
:meth:`label_values` and :meth:`alerts`.  Missing binaries fail with the command that
installs them (``make sysdeps``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from tessera_e2e.controlplane.processes import die_with_parent, terminate
from tessera_e2e.operator.replicas import free_port, wait_until

Series = list[dict[str, Any]]


def find_tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"{name} is not installed: run `make sysdeps` (Debian's prometheus "
                           "package: prometheus and promtool)")
    return path


def _duration(seconds: float) -> str:
    return f"{round(seconds * 1000)}ms"


def scaled_rules(source: Path, target: Path, hold: str) -> Path:
    """``source`` with every rule's ``for`` set to ``hold`` (a live test cannot wait the
    minutes real alerts hold for; the durations themselves are promtool-tested)."""
    doc = yaml.safe_load(source.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = hold
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


class LocalPrometheus:
    def __init__(self, directory: Path, rule_files: Sequence[Path] = (),
                 scrape_interval_s: float = 1.0, evaluation_interval_s: float = 1.0) -> None:
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scrape_interval_s = scrape_interval_s
        self.log = directory / "prometheus.log"
        self.jobs: set[str] = set()
        self.proc: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.scrape_configs: list[dict[str, Any]] = []
        self.config: dict[str, Any] = {
            "global": {"scrape_interval": _duration(scrape_interval_s),
                       "scrape_timeout": _duration(scrape_interval_s),
                       "evaluation_interval": _duration(evaluation_interval_s)},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": self.scrape_configs,
        }

    def set_targets(self, job: str, targets: Mapping[str, Mapping[str, str]]) -> None:
        """Scrape ``host:port -> extra labels`` as ``job`` (``/metrics``, plain HTTP)."""
        sd = self.directory / f"targets-{job}.json"
        tmp = sd.with_suffix(".tmp")
        tmp.write_text(json.dumps([{"targets": [t], "labels": dict(labels)}
                                   for t, labels in targets.items()]))
        tmp.rename(sd)
        if job not in self.jobs:
            self.jobs.add(job)
            self.scrape_configs.append({
                "job_name": job, "file_sd_configs": [{"files": [str(sd)],
                                                      "refresh_interval": "1s"}]})
            if self.proc is not None:
                self._write_config()
                self._post("/-/reload")

    def _write_config(self) -> Path:
        path = self.directory / "prometheus.yml"
        path.write_text(yaml.safe_dump(self.config, sort_keys=False))
        return path

    def start(self) -> LocalPrometheus:
        config = self._write_config()
        check = subprocess.run([find_tool("promtool"), "check", "config", str(config)],
                               capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"promtool check config: {check.stdout}{check.stderr}")
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [find_tool("prometheus"), f"--config.file={config}",
                 f"--storage.tsdb.path={self.directory / 'data'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                 "--storage.tsdb.retention.time=1d", "--log.level=warn"],
                stdout=log, stderr=log, preexec_fn=die_with_parent())
        wait_until("prometheus ready", self.ready, 60)
        return self

    def ready(self) -> bool:
        if self.proc is None or self.proc.poll() is not None:
            raise RuntimeError(f"prometheus exited: {self.log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def _post(self, path: str) -> None:
        req = urllib.request.Request(f"{self.url}{path}", method="POST")
        with urllib.request.urlopen(req, timeout=10):
            pass

    def api(self, path: str, **params: str | Sequence[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise RuntimeError(f"prometheus {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> Series:
        """The instant vector ``expr`` evaluates to now (a PromQL error raises)."""
        data = self.api("query", query=expr)
        result: Series = data["result"] if data["resultType"] == "vector" else [data]
        return result

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> Series:
        result: Series = self.api("query_range", query=expr, start=str(start), end=str(end),
                                  step=str(step_s))["result"]
        return result

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params: dict[str, str | Sequence[str]] = {"match[]": [match]} if match else {}
        values: list[str] = self.api(f"label/{label}/values", **params)
        return values

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = self.api("alerts")["alerts"]
        return alerts

    def targets_up(self, job: str) -> dict[str, float]:
        """instance -> up for ``job`` (what the last scrapes found)."""
        return {s["metric"]["instance"]: float(s["value"][1])
                for s in self.query(f'up{{job="{job}"}}')}

    def stop(self) -> None:
        terminate(self.proc)

    def __enter__(self) -> LocalPrometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

