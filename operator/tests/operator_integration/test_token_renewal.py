"""A long-running component's service account token is renewed under it (the kubelet rewrites
the projected token file before it expires, and a token bound to a pod dies with the pod):
the client reads the file again instead of keeping the first token for the process's life.
Against the real API server, with tokens bound to real pods."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tessera.kube.client import ApiError, Credentials, Kube, load_credentials
from tessera_e2e.gpubed.daemons import bound_token, create_node
from tessera_e2e.operator.replicas import OPERATOR_NS

from .conftest import Operators

pytestmark = pytest.mark.integration

REVIEW = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
POD_NAME = "authentication.kubernetes.io/pod-name"


def test_a_token_that_died_is_read_again_from_its_file(cluster: Any, ops: Operators,
                                                      tmp_path: Path) -> None:
    """(``ops``: the namespace, the service accounts and their RBAC as installed.)"""
    create_node(cluster.kubectl, "token-node")
    token = tmp_path / "token"
    first = bound_token(cluster.kubectl, "token-node", pod="token-a")
    token.write_text(first)
    admin = load_credentials(str(cluster.kubeconfig))
    creds = Credentials(admin.server, ssl.create_default_context(cafile=admin.ca_path), {},
                        admin.ca_path, token_file=str(token))

    async def whose(kube: Kube) -> str:
        review = await kube.create("/apis/authentication.k8s.io/v1/selfsubjectreviews", REVIEW)
        return str(review["status"]["userInfo"]["extra"][POD_NAME][0])

    async def refused(old: str) -> None:
        """Until the API server refuses the old token (it caches a token's authentication for
        up to 10 s)."""
        kube = Kube(replace(creds, token=old, token_file=None))
        try:
            for _ in range(300):
                try:
                    await whose(kube)
                except ApiError as exc:
                    assert exc.status == 401, exc
                    return
                await asyncio.sleep(0.1)
            raise AssertionError("the deleted pod's token is still accepted after 30 s")
        finally:
            await kube.close()

    async def scenario() -> list[str]:
        kube = Kube(creds)
        try:
            seen = [await whose(kube)]
            # the pod is replaced: its token dies, the file holds the new pod's token
            token.write_text(bound_token(cluster.kubectl, "token-node", pod="token-b"))
            out = cluster.kubectl("delete", "pod", "token-a", "-n", OPERATOR_NS,
                                  "--grace-period=0", "--force")
            assert out.returncode == 0, out.stderr
            await refused(first)
            seen.append(await whose(kube))  # a 401 with the old token, then the new one
            return seen
        finally:
            await kube.close()

    try:
        assert asyncio.run(scenario()) == ["token-a", "token-b"]
    finally:
        cluster.kubectl("delete", "pod", "token-b", "-n", OPERATOR_NS, "--grace-period=0",
                        "--force")
        cluster.kubectl("delete", "node", "token-node", "--wait=false")
