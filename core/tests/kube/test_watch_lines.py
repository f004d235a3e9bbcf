"""Watch streams are split into events of any size (aiohttp's own reader stops at 512 KiB)."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from tessera.kube.client import _lines


def test_lines_of_any_size_split_across_chunks() -> None:
    big = json.dumps({"type": "ADDED", "object": {"x": "y" * (700 * 1024)}}).encode()
    events = [b'{"type": "ADDED"}', big, b'{"type": "DELETED"}']

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        wire = b"\n".join(events[:2]) + b"\n\n" + events[2]  # blank line; no final newline
        for i in range(0, len(wire), 4099):
            await resp.write(wire[i:i + 4099])
        await resp.write_eof()
        return resp

    async def main() -> list[bytes]:
        app = web.Application()
        app.router.add_get("/", stream)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        try:
            async with aiohttp.ClientSession() as s, s.get(f"http://127.0.0.1:{port}/") as r:
                return [line async for line in _lines(r.content)]
        finally:
            await runner.cleanup()

    assert asyncio.run(main()) == events
