"""A small asyncio Kubernetes client on aiohttp: raw JSON, no model classes.

The admission path has a p99 budget of milliseconds, so requests go straight to the API
server over one keep-alive session without the generated client's (de)serialisation.
Credentials come from a kubeconfig (or the in-cluster service account) via the official
``kubernetes`` package, so every auth method it supports works here too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import aiohttp.http_exceptions

from tessera.kube.health import WATCH_ERRORS, Health

log = logging.getLogger("tessera.kube")

Obj = dict[str, Any]
Handler = Callable[[str, Obj], Awaitable[None] | None]


class ApiError(Exception):
    """A non-2xx answer; ``status`` 404/409/422 are the ones callers branch on."""

    def __init__(self, status: int, body: str, what: str) -> None:
        self.status = status
        self.body = body
        try:
            self.message = str(json.loads(body).get("message", body))
        except (ValueError, AttributeError):
            self.message = body
        super().__init__(f"{what}: HTTP {status}: {self.message}")


TOKEN_REREAD_S = 60.0
"""How old a token read from a file may get before it is read again (client-go: a minute)."""


@dataclass(frozen=True)
class Credentials:
    server: str
    ssl_context: ssl.SSLContext
    headers: Mapping[str, str]
    ca_path: str | None = None
    cert_path: str | None = None
    key_path: str | None = None
    token: str | None = None
    token_file: str | None = None
    """In a pod: the projected service account token, which the kubelet renews before it
    expires (and which dies with the pod): read again every ``TOKEN_REREAD_S`` and after a
    401, never kept for the process's life."""

    def current_token(self, max_age_s: float = TOKEN_REREAD_S) -> str | None:
        """The bearer token now: the file's content when there is one (read again once
        ``max_age_s`` old; 0 forces it), else the token loaded at start."""
        if self.token_file is None:
            return self.token
        read_at, token = _TOKENS.get(self.token_file, (float("-inf"), self.token))
        now = time.monotonic()
        if now - read_at >= max_age_s:
            try:
                with open(self.token_file, encoding="utf-8") as f:
                    token = f.read().strip() or token
            except OSError as exc:  # keep the last one: the API server says if it is dead
                log.warning("service account token %s unreadable: %s", self.token_file, exc)
            _TOKENS[self.token_file] = (now, token)
        return token


_TOKENS: dict[str, tuple[float, str | None]] = {}


def load_credentials(kubeconfig: str | None = None) -> Credentials:
    """From a kubeconfig file, else the in-cluster service account."""
    from kubernetes import client, config  # imported lazily: slow, and only needed here

    cfg = client.Configuration()
    token_file = None
    if kubeconfig is None:
        try:
            config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            from kubernetes.config.incluster_config import SERVICE_TOKEN_FILENAME

            token_file = SERVICE_TOKEN_FILENAME
        except config.ConfigException:
            config.load_kube_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
    else:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, client_configuration=cfg)
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else (
        ssl.create_default_context())
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    headers: dict[str, str] = {}
    token = cfg.api_key.get("authorization") or cfg.api_key.get("BearerToken")
    bare = None
    if token:
        # the in-cluster loader writes "bearer <token>" (lower case), kubeconfigs "Bearer ..."
        scheme, _, rest = token.partition(" ")
        bare = rest.strip() if scheme.lower() == "bearer" and rest.strip() else token
        headers["Authorization"] = f"Bearer {bare}"
    return Credentials(str(cfg.host).rstrip("/"), ctx, headers, cfg.ssl_ca_cert or None,
                       cfg.cert_file or None, cfg.key_file or None, bare, token_file)


def path(group: str, version: str, plural: str, namespace: str | None = None,
         name: str | None = None, sub: str | None = None) -> str:
    base = f"/api/{version}" if group == "" else f"/apis/{group}/{version}"
    if namespace is not None:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name is not None:
        base += f"/{name}"
    if sub is not None:
        base += f"/{sub}"
    return base


class Kube:
    """One aiohttp session to the API server."""

    def __init__(self, creds: Credentials, user_agent: str = "tessera-operator") -> None:
        self.creds = creds
        self._session: aiohttp.ClientSession | None = None
        self._ua = user_agent

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            fixed = {k: v for k, v in self.creds.headers.items() if k != "Authorization"}
            self._session = aiohttp.ClientSession(
                base_url=self.creds.server,
                headers={**fixed, "User-Agent": self._ua},
                connector=aiohttp.TCPConnector(ssl=self.creds.ssl_context, limit=64),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, url: str, body: Any = None,
                      content_type: str = "application/json",
                      params: Mapping[str, str] | None = None,
                      timeout: float = 10.0) -> Obj:
        data = None if body is None else json.dumps(body)
        if params:
            url = f"{url}?{urlencode(params)}"
        for fresh in (False, True):
            headers = self._auth(fresh)
            if body is not None:
                headers["Content-Type"] = content_type
            async with self.session.request(method, url, data=data, headers=headers,
                                            timeout=aiohttp.ClientTimeout(total=timeout)) as r:
                text = await r.text()
                if r.status == 401 and not fresh and self.creds.token_file is not None:
                    continue  # the token in hand died (renewed, or its pod replaced): read again
                if r.status >= 300:
                    raise ApiError(r.status, text, f"{method} {url}")
                out: Obj = json.loads(text) if text else {}
                return out
        raise AssertionError("unreachable")

    def _auth(self, fresh: bool = False) -> dict[str, str]:
        token = self.creds.current_token(0 if fresh else TOKEN_REREAD_S)
        return {"Authorization": f"Bearer {token}"} if token else {}

    async def get(self, url: str) -> Obj:
        return await self.request("GET", url)

    async def list(self, url: str, label_selector: str | None = None,
                   cached: bool = False) -> Obj:
        """LIST; ``cached`` reads the API server's watch cache (``resourceVersion=0``): no
        wait for the cache to prove it is current (up to ~100 ms), possibly a little stale."""
        params = {"labelSelector": label_selector} if label_selector else {}
        if cached:
            params["resourceVersion"] = "0"
        return await self.request("GET", url, params=params or None)

    async def create(self, url: str, body: Obj) -> Obj:
        return await self.request("POST", url, body)

    async def replace(self, url: str, body: Obj) -> Obj:
        return await self.request("PUT", url, body)

    async def merge_patch(self, url: str, body: Obj) -> Obj:
        """JSON merge patch; a ``metadata.resourceVersion`` in ``body`` is a precondition."""
        return await self.request("PATCH", url, body, "application/merge-patch+json")

    async def apply(self, url: str, body: Obj, manager: str = "tessera-operator") -> Obj:
        """Server-side apply: a no-op (no new resourceVersion) when nothing changed."""
        return await self.request("PATCH", url, body, "application/apply-patch+yaml",
                                  params={"fieldManager": manager, "force": "true"})

    async def delete(self, url: str) -> Obj:
        return await self.request("DELETE", url)

    async def watch(self, url: str, label_selector: str | None = None,
                    field_selector: str | None = None, name: str | None = None,
                    health: Health | None = None) -> AsyncIterator[tuple[str, Obj]]:
        """List then watch forever: yields ('SYNC', list-body) first, then watch events.

        Reconnects from the last resourceVersion; on 410 Gone it relists (yielding a new
        SYNC so the caller can drop objects that vanished meanwhile).  Reads event lines of
        any size an object can have (aiohttp's line reader stops at 512 KiB, and one
        user's large pod or quota would end the watch).  An event that cannot be read is
        logged and counted (``tessera_watch_errors_total``), and the watch relists, so it
        never ends; ``health`` hears whether it is following its objects.
        """
        label = name or url
        params: dict[str, str] = {}
        if label_selector:
            params["labelSelector"] = label_selector
        if field_selector:
            params["fieldSelector"] = field_selector
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    listed = await self.request("GET", url, params=params, timeout=60)
                    rv = str(listed["metadata"]["resourceVersion"])
                    if health is not None:
                        health.ok(label)
                    yield "SYNC", listed
                q = {**params, "watch": "1", "resourceVersion": rv,
                     "allowWatchBookmarks": "true", "timeoutSeconds": "300"}
                async with self.session.get(
                        f"{url}?{urlencode(q)}", headers=self._auth(),
                        timeout=aiohttp.ClientTimeout(total=None, sock_read=330)) as r:
                    if r.status == 410:
                        rv = None
                        continue
                    if r.status >= 300:
                        raise ApiError(r.status, await r.text(), f"WATCH {url}")
                    if health is not None:
                        health.ok(label)  # following again, even if nothing changes
                    async for line in _lines(r.content):
                        try:
                            ev = json.loads(line)
                            typ, obj = str(ev["type"]), ev["object"]
                            if typ == "ERROR":
                                if obj.get("code") == 410:
                                    rv = None
                                break
                            next_rv = str(obj["metadata"]["resourceVersion"])
                        except (ValueError, KeyError, TypeError, AttributeError) as exc:
                            WATCH_ERRORS.labels(label, "decode").inc()
                            log.error("unreadable watch event; relisting", extra={
                                "watch": label, "error": str(exc)[:300],
                                "bytes": len(line)})
                            rv = None  # what it said is lost: a fresh list is the truth
                            break
                        rv = next_rv
                        if health is not None:
                            health.ok(label)
                        if typ != "BOOKMARK":
                            yield typ, obj
            except asyncio.CancelledError:
                raise
            except (aiohttp.ClientError, aiohttp.http_exceptions.HttpProcessingError, ApiError,
                    TimeoutError, OSError, ValueError, KeyError, TypeError,
                    WatchLineTooLong) as exc:
                WATCH_ERRORS.labels(label, "stream").inc()
                if health is not None:
                    health.failing(label, f"{type(exc).__name__}: {exc}")
                log.warning("watch interrupted", extra={"watch": label, "error": str(exc)[:300]})
                if isinstance(exc, WatchLineTooLong):
                    rv = None
                await asyncio.sleep(1.0)


MAX_EVENT_BYTES = 64 << 20
"""Far above any object etcd stores (1.5 MiB by default); only a broken stream gets here."""


class WatchLineTooLong(Exception):
    """A watch event line above :data:`MAX_EVENT_BYTES`."""


async def _lines(stream: aiohttp.StreamReader) -> AsyncIterator[bytes]:
    """Newline-separated lines of a watch stream, of any length up to MAX_EVENT_BYTES."""
    buf = bytearray()
    searched = 0
    async for chunk in stream.iter_any():
        buf += chunk
        while (end := buf.find(b"\n", searched)) >= 0:
            line = bytes(buf[:end])
            del buf[:end + 1]
            searched = 0
            if line.strip():
                yield line
        searched = len(buf)
        if searched > MAX_EVENT_BYTES:
            raise WatchLineTooLong(f"watch event over {MAX_EVENT_BYTES} bytes")
    if buf.strip():
        yield bytes(buf)


async def follow(events: AsyncIterator[tuple[str, Obj]], handle: Handler, name: str) -> None:
    """Hand each event of a watch to ``handle`` (see :func:`handle_one`)."""
    async for typ, obj in events:
        await handle_one(handle, typ, obj, name)


async def handle_one(handle: Handler, typ: str, obj: Obj, name: str) -> None:
    """An error in one event is logged and counted, never raised: the next event is handled
    (state is level-triggered: a periodic pass or the object's next event gets another
    chance)."""
    try:
        result = handle(typ, obj)
        if result is not None:
            await result
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # one object must not stop the watch
        WATCH_ERRORS.labels(name, "handle").inc()
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        log.exception("watch event not handled", extra={
            "watch": name, "event": typ, "error": str(exc)[:300],
            "object": f"{(meta or {}).get('namespace', '')}/{(meta or {}).get('name', '')}"})
