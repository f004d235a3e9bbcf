"""The operator process's settings and their defaults: the one place they are defined.

``tessera operator run`` turns each into a flag whose default is the value here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field


@dataclass
class Options:
    kubeconfig: str | None = None
    """kubeconfig file; None: in-cluster service account, then ~/.kube/config."""
    namespace: str = "tessera-system"
    """Namespace of the leader Lease and the webhook certificate Secret."""
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    """Leader-election identity."""
    webhook_host: str = "0.0.0.0"
    webhook_port: int = 9443
    webhook_url: str | None = None
    """URL client config (local clusters): the API server calls this https base URL;
    None: the API server reaches the webhooks through the Service ``service_name``."""
    service_name: str = "tessera-webhook"
    cert_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    secret_name: str = "tessera-webhook-tls"
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    """/healthz and /metrics."""
    lease_name: str = "tessera-operator"
    lease_duration_s: int = 15
    lease_renew_s: float = 5.0
    recount_interval_s: float = 30.0
    drift_grace_s: float = 10.0
    """Seconds a usage difference must persist before the recount heals it."""
    webhook_config_interval_s: float = 60.0
    """How often the leader re-applies the webhook configurations (heals manual edits)."""
    stuck_after_s: float = 60.0
    """A watch that cannot follow its objects this long makes /healthz fail (restart)."""
    advertise_url: str | None = None
    """Where the other replicas reach this one to hand it reservations while it leads."""


DEFAULTS = Options(identity="")
"""The defaults, for help texts and flags (``identity`` is computed per process)."""
