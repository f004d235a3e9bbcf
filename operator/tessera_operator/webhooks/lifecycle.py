"""The webhooks' serving certificate and configurations over the operator's life: made or
awaited at start, followed by every replica, renewed before it expires and published into
the webhook configurations by the leader (the rules: :mod:`tessera_operator.webhooks.rotation`;
the Secret: :mod:`tessera_operator.webhooks.serving`; the configurations:
:mod:`tessera_operator.webhooks.config`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

from tessera.kube.client import Kube
from tessera_operator.webhooks.config import ClientConfig, apply_configurations, patch_ca_bundles
from tessera_operator.webhooks.rotation import Policy, Step
from tessera_operator.webhooks.serving import (
    SecretCerts,
    Serving,
    ensure_secret,
    read_secret,
)
from tessera_operator.webhooks.serving import step as serving_step

log = logging.getLogger("tessera.certs")

Task = Callable[[], Awaitable[None]]


@dataclass
class WebhookCertificates:
    kube: Kube
    namespace: str
    secret_name: str
    hosts: list[str]
    """The serving certificate's names (SANs)."""
    policy: Policy
    """Lifetime, renewal point and step timing of the certificates the operator makes."""
    external: bool
    """cert-manager (or someone else) writes the Secret and the caBundles: only read it."""
    applies_configurations: bool
    """The leader applies the configurations whole (``apply``); else an installer owns them
    and the leader sets only their caBundle (``ca-bundle``)."""
    webhook_url: str | None
    """URL client config (local clusters); None: the Service ``service_name``."""
    service_name: str
    config_interval_s: float
    """How often the leader applies the configurations again (heals manual edits)."""
    serving: Serving | None = field(default=None, init=False)

    async def start(self, directory: Path, client_ca: str | None) -> Serving:
        """The certificate to serve from now on: made (or read, when another replica made
        it), or, external, awaited until it is issued (not serving meanwhile)."""
        if not self.external:
            sc = await ensure_secret(self.kube, self.namespace, self.secret_name, self.hosts,
                                     self.policy.lifetime_s)
        else:
            while (found := await read_secret(self.kube, self.namespace,
                                              self.secret_name)) is None:
                log.warning("waiting for the webhook certificate Secret (external "
                            "certificate)", extra={"secret": self.secret_name})
                await asyncio.sleep(2)
            sc = found
        self.serving = Serving(sc, directory, client_ca)
        return self.serving

    def client_config(self) -> ClientConfig:
        assert self.serving is not None
        ca = self.serving.current.ca_pem
        return (ClientConfig(ca, url=self.webhook_url) if self.webhook_url else
                ClientConfig(ca, service_name=self.service_name,
                             service_namespace=self.namespace))

    def follow(self, sc: SecretCerts | None) -> None:
        """Serve what the Secret holds now (a Secret gone: the last one read)."""
        assert self.serving is not None
        if sc is None:
            log.warning("webhook certificate Secret is gone; serving the last one read",
                        extra={"secret": self.secret_name})
        else:
            self.serving.update(sc)

    async def follow_loop(self) -> None:
        """Every replica: re-read the Secret every check interval."""
        while True:
            await asyncio.sleep(self.policy.check_s)
            self.follow(await read_secret(self.kube, self.namespace, self.secret_name))

    async def publish_configurations(self) -> None:
        if self.applies_configurations:
            await apply_configurations(self.kube, self.client_config())
            return
        if self.external:
            return  # cert-manager's CA injector owns the caBundle
        for url in await patch_ca_bundles(self.kube, self.client_config()):
            log.error("webhook configuration missing: install it with the chart",
                      extra={"configuration": url})

    async def keep_configurations(self) -> None:
        """The leader: the configurations as they must be, again and again."""
        while True:
            await self.publish_configurations()
            await asyncio.sleep(self.config_interval_s)

    async def renew_loop(self) -> None:
        """The leader: the renewal step due now; a new CA bundle is published at once."""
        while True:
            if await serving_step(self.kube, self.namespace, self.secret_name, self.hosts,
                                  self.policy) is not Step.KEEP:
                self.follow(await read_secret(self.kube, self.namespace, self.secret_name))
                await self.publish_configurations()
            await asyncio.sleep(self.policy.check_s)

    def leader_tasks(self) -> dict[str, Task]:
        tasks: dict[str, Task] = {"webhook-config": self.keep_configurations}
        if not self.external:
            tasks["certificate"] = self.renew_loop
        return tasks
