"""The operator process's settings and their defaults: the one place they are defined.

``tessera operator run`` turns each into a flag whose default is the value here.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from tessera_operator.webhooks.certs import DEFAULT_LIFETIME_S
from tessera_operator.webhooks.serving import GENERATE


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
    webhook_certificate: str = GENERATE
    """Who makes the serving certificate in Secret ``secret_name``: ``generate``, the
    operator (it creates the Secret, renews the certificate before it expires and keeps the
    configurations' caBundle current); ``external``, someone else (cert-manager, whose CA
    injector sets the caBundle): the operator only reads the Secret and follows its changes."""
    cert_lifetime_s: float = DEFAULT_LIFETIME_S
    """Lifetime of each serving certificate the operator makes (``generate``)."""
    cert_renew_fraction: float = 2 / 3
    """A renewal starts when this fraction of the served certificate's lifetime has passed."""
    cert_step_s: float = 180.0
    """Least seconds between the steps of a renewal (new CA published, new certificate
    served, old CA dropped): the API server and every replica catch up in between."""
    cert_check_interval_s: float = 60.0
    """How often every replica re-reads the serving Secret (and loads a changed
    certificate), and the leader takes the renewal step due."""
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    """/healthz and /metrics."""
    lease_name: str = "tessera-operator"
    lease_duration_s: int = 15
    lease_renew_s: float = 5.0
    recount_interval_s: float = 5.0
    """Seconds between full reconciles of every GPUQuota (its status.used from the pods,
    its managed ResourceQuota); each is also reconciled soon after it or its namespace's
    GPU pods change."""
    webhook_client_ca: str | None = None
    """CA file that signed the API server's webhook client certificate; when given, the
    webhooks take admission reviews only from certificates it signed."""
    webhook_client_names: tuple[str, ...] = ()
    """Common names accepted among those certificates (empty: any)."""
    webhook_configurations: str = "apply"
    """Who owns the webhook configurations: ``apply``, the leader applies them whole (local
    clusters, the test bed); ``ca-bundle``, an installer does (the Helm chart) and the
    leader only keeps their ``caBundle`` equal to the serving certificate's CA."""
    webhook_config_interval_s: float = 60.0
    """How often the leader re-applies the webhook configurations (heals manual edits)."""
    stuck_after_s: float = 60.0
    """A watch that cannot follow its objects this long makes /healthz fail (restart)."""
    growth_holder_image: str = "registry.k8s.io/pause:3.10"
    """The image a growth holder names (never pulled: a holder is never scheduled; a policy
    that admits only some registries must admit it)."""
    shutdown_drain_s: float = 5.0
    """After SIGTERM, how long the replica goes on serving, not ready, every webhook answer
    closing its connection, before it stops: the API server's kept-alive connections to it
    are closed after an answer, never under a request (a create would fail with EOF). Longer
    than the Service's endpoints take to drop a terminating pod."""
    placement_url: str | None = None
    """Where this replica answers the scheduler extender when it holds the Lease (published
    on the Lease; the other replicas forward there). None: ``https://$POD_IP:<webhook
    port>`` in a pod, ``https://127.0.0.1:<webhook port>`` elsewhere."""
    placement_server_name: str | None = None
    """The name to check the leader's certificate for when forwarding (None: the Service's
    DNS name when ``placement_url`` is a pod IP, else the URL's host)."""
    placement_node_policy: str = "binpack"
    """Cluster default over nodes: ``binpack`` or ``spread`` (a pod's
    ``tessera.dev/node-policy`` overrides it)."""
    placement_gpu_policy: str = "binpack"
    """Cluster default over GPUs and MIG instances (``tessera.dev/gpu-policy`` overrides it)."""
    scheduler_name: str = ""
    """When set, the pod webhook gives every GPU pod that names no other scheduler this
    ``spec.schedulerName`` (the chart's second kube-scheduler, which calls the extender)."""


DEFAULTS = Options(identity="")
"""The defaults, for help texts and flags (``identity`` is computed per process)."""
