"""The key the leader seals resize records with (:mod:`tessera.api.resize`), kept in a
Secret of the operator's namespace that only the operator reads.

The first leader makes it (32 random bytes); later leaders read it.  A Secret without a
readable key of at least 32 bytes is an error (nothing is sealed or trusted with it): the
operator never replaces a key someone else wrote, it says so.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from tessera.api.names import SEAL_KEY_FIELD, SEAL_KEY_SECRET
from tessera.kube.client import ApiError, Kube, path

KEY_BYTES = 32


class SealKeyError(RuntimeError):
    pass


async def seal_key(kube: Kube, namespace: str) -> bytes:
    url = path("", "v1", "secrets", namespace, SEAL_KEY_SECRET)
    for _ in range(3):
        try:
            secret = await kube.get(url)
        except ApiError as exc:
            if exc.status != 404:
                raise
        else:
            raw = (secret.get("data") or {}).get(SEAL_KEY_FIELD)
            try:
                key = base64.b64decode(str(raw), validate=True)
            except (binascii.Error, ValueError):
                key = b""
            if len(key) < KEY_BYTES:
                raise SealKeyError(f"Secret {namespace}/{SEAL_KEY_SECRET} has no readable "
                                   f"{SEAL_KEY_FIELD!r} of {KEY_BYTES}+ bytes: delete it and "
                                   f"the operator makes a new one")
            return key
        body = {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": SEAL_KEY_SECRET, "namespace": namespace,
                             "labels": {"app.kubernetes.io/name": "tessera"}},
                "data": {SEAL_KEY_FIELD: base64.b64encode(
                    secrets.token_bytes(KEY_BYTES)).decode()}}
        try:
            await kube.create(path("", "v1", "secrets", namespace), body)
        except ApiError as exc:
            if exc.status != 409:
                raise
    raise SealKeyError(f"Secret {namespace}/{SEAL_KEY_SECRET} could not be read or made")
