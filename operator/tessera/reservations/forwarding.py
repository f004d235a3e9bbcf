"""Reservations go to the leader, so replicas do not race each other on one GPUQuota.

Every replica can reserve correctly on its own (each write carries the resourceVersion it was
computed from), but two replicas writing the same quota keep losing each other's races: each
lost race costs a re-read and a second write, and those land in the p99 of admission.  So a
replica that is not the leader hands its reservation to the leader, whose one writer per quota
group-commits what both replicas admit.  This is only an optimisation: when the leader cannot
be reached the replica reserves itself, with the same conditional write.

The leader advertises where it listens in its Lease (annotation
``tessera.api.names.ANNOTATION_LEADER_ENDPOINT``).
Callers prove they are a replica with a token derived from the webhook serving key, which
only holders of the ``tessera-webhook-tls`` Secret have (a renewed key changes it: see
:meth:`Forwarder.rekey`).  The TLS chain is checked against the Secret's CA bundle; the host
name is not (the leader is reached by pod IP, which the serving
certificate cannot list in advance).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from tessera import metrics
from tessera.quota.arith import Usage, Violation
from tessera.quota.batch import Reserve

log = logging.getLogger("tessera.forwarding")

RESERVE_PATH = "/internal/reservations"
CONNECT_TIMEOUT_S = 2.0
"""A leader that cannot be reached this fast is treated as gone: reserve here instead."""
CONNECTIONS = 8
"""Kept-alive connections to the leader: a burst of admissions queues for these instead of
opening one TLS connection each (50 handshakes at once stalled a loaded leader)."""
ANSWER_TIMEOUT_S = 5.0
"""Half the pod webhook's 10 s timeout: after a hung leader there is time to reserve here."""


def token_from_key(key_pem: bytes) -> str:
    """The shared secret of the replicas: a hash of the webhook serving key they all hold."""
    return hashlib.sha256(b"tessera-reservations\0" + key_pem).hexdigest()


def authorized(header: str | None, token: str) -> bool:
    return header is not None and hmac.compare_digest(header, f"Bearer {token}")


def usage_to_wire(u: Usage) -> dict[str, Any]:
    return {"memoryMiB": u.memory_mib, "cores": u.cores, "pods": u.pods, "mig": dict(u.mig)}


def usage_from_wire(raw: Mapping[str, Any]) -> Usage:
    """Strict: a replica sends exactly what usage_to_wire wrote; anything else is refused."""
    mig = raw.get("mig", {})
    if not isinstance(mig, Mapping):
        raise ValueError("mig must be an object of profile counts")
    values = [raw.get("memoryMiB"), raw.get("cores"), raw.get("pods"), *mig.values()]
    if not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise ValueError("usage must be non-negative integers")
    return Usage(int(raw["memoryMiB"]), int(raw["cores"]), int(raw["pods"]),
                 {str(k): int(v) for k, v in mig.items()})


def reservation_to_wire(ns: str, r: Reserve) -> dict[str, Any]:
    return {"namespace": ns, "uid": r.uid, "pod": r.pod, "expires": r.expires,
            "usage": usage_to_wire(r.usage)}


def reservation_from_wire(raw: Mapping[str, Any]) -> tuple[str, Reserve]:
    """Strict, as :func:`usage_from_wire`: (namespace, reservation) or ValueError."""
    ns, uid, pod, expires = (raw.get(k) for k in ("namespace", "uid", "pod", "expires"))
    if not all(isinstance(v, str) and v for v in (ns, uid, pod)):
        raise ValueError("namespace, uid and pod must be names")
    if not isinstance(expires, int | float) or isinstance(expires, bool):
        raise ValueError("expires must be seconds since the epoch")
    usage = raw.get("usage")
    if not isinstance(usage, Mapping):
        raise ValueError("usage must be an object")
    return str(ns), Reserve(str(uid), str(pod), usage_from_wire(usage), float(expires))


def violation_to_wire(v: Violation) -> dict[str, str]:
    return {"quota": v.quota, "resource": v.resource, "requested": v.requested,
            "used": v.used, "hard": v.hard, "reason": v.reason}


def violation_from_wire(raw: Mapping[str, Any]) -> Violation:
    return Violation(str(raw["quota"]), str(raw["resource"]), str(raw["requested"]),
                     str(raw["used"]), str(raw["hard"]), str(raw.get("reason", "exceeded")))


@dataclass
class Forwarder:
    """The client side: hands one pod's reservation to the leader."""

    token: str
    ca_pem: bytes
    leader_endpoint: Callable[[], str | None]
    """The leader's base URL, or None while this replica leads or no leader is known."""
    _session: aiohttp.ClientSession | None = field(default=None, repr=False)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            ctx = ssl.create_default_context(cadata=self.ca_pem.decode())
            ctx.check_hostname = False
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=ctx, limit=CONNECTIONS))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def rekey(self, token: str, ca_pem: bytes) -> None:
        """A renewed serving certificate: send ``token``, trust ``ca_pem``, on new
        connections (the old ones finish their requests and are closed after them)."""
        if (token, ca_pem) == (self.token, self.ca_pem):
            return
        self.token, self.ca_pem = token, ca_pem
        old, self._session = self._session, None
        if old is not None and not old.closed:
            asyncio.get_running_loop().call_later(
                ANSWER_TIMEOUT_S + 1, lambda: asyncio.ensure_future(old.close()))

    async def reserve(self, ns: str, reservation: Reserve) -> list[Violation] | None:
        """The leader's answer ([] = reserved), or None: reserve here instead.

        None also after a failure once the request was sent (the leader died mid-call): the
        leader may have written the reservation; reserving again here changes nothing then,
        because a reservation is recorded under the pod's UID and is never added twice.
        """
        base = self.leader_endpoint()
        if base is None:
            return None
        try:
            async with self._client().post(
                    base.rstrip("/") + RESERVE_PATH,
                    json=reservation_to_wire(ns, reservation),
                    headers={"Authorization": f"Bearer {self.token}"},
                    timeout=aiohttp.ClientTimeout(total=ANSWER_TIMEOUT_S,
                                                  sock_connect=CONNECT_TIMEOUT_S)) as r:
                if r.status != 200:
                    raise aiohttp.ClientResponseError(r.request_info, r.history,
                                                      status=r.status, message=await r.text())
                body = await r.json()
            refused = [violation_from_wire(v) for v in body["refused"]]
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError, KeyError,
                TypeError) as exc:
            metrics.FORWARDED.labels("fallback").inc()
            log.warning("leader did not take the reservation; reserving here",
                        extra={"leader": base, "error": str(exc)[:200]})
            return None
        metrics.FORWARDED.labels("forwarded").inc()
        return refused
