"""A replica that is told to stop drains first: it goes on answering admission reviews for a
while, closing each connection after its answer (so the API server does not send the next
review on a connection the replica is about to close), and stops only then."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from tessera.kube.shutdown import Drain
from tessera_operator.webhooks import server


class _Admission:
    async def review(self, req: Any) -> dict[str, Any]:
        return {"uid": req["uid"], "allowed": True}

    mutate_pod = review_partition = review_quota = mutate_claim = validate_claim = review


async def _review_then_wait(port: int) -> tuple[int, bytes, bool]:
    """One review on a new kept-alive connection: (status, the Connection header's value,
    whether the server closed the connection after its answer)."""
    r, w = await asyncio.open_connection("127.0.0.1", port)
    body = json.dumps({"request": {"uid": "u"}}).encode()
    w.write(b"POST /validate/gpuquotas HTTP/1.1\r\nHost: t\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    await w.drain()
    head = await r.readuntil(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":")
                                                          for x in lines[1:] if x)}
    await r.readexactly(int(headers[b"content-length"]))
    try:
        closed = await asyncio.wait_for(r.read(1), 0.5) == b""
    except TimeoutError:
        closed = False
    w.close()
    return int(lines[0].split()[1]), headers.get(b"connection", b""), closed


def test_while_draining_each_answer_closes_its_connection() -> None:
    async def run() -> list[tuple[int, bytes, bool]]:
        drain = Drain(30)
        app = server.webhook_app(_Admission(), None,  # type: ignore[arg-type]
                                 closing=lambda: drain.draining)
        runner = await server.start(app, "127.0.0.1", 0)
        port = runner.addresses[0][1]
        seen = [await _review_then_wait(port)]
        stopped = asyncio.Event()
        drain.stop(stopped.set)
        seen.append(await _review_then_wait(port))  # still answered while draining
        assert not stopped.is_set()
        await runner.cleanup()
        return seen

    before, draining = asyncio.run(run())
    assert before == (200, b"", False)  # kept alive for the next review
    assert draining == (200, b"close", True)


def test_the_stop_comes_after_the_drain_and_a_second_request_stops_at_once() -> None:
    async def run() -> list[str]:
        events: list[str] = []
        drain = Drain(0.3)
        drain.stop(lambda: events.append("stopped"))
        assert drain.draining
        await asyncio.sleep(0.1)
        events.append("still draining")
        await asyncio.sleep(0.4)
        again = Drain(30)
        again.stop(lambda: events.append("never"))
        again.stop(lambda: events.append("second signal"))
        await asyncio.sleep(0.1)
        Drain(0).stop(lambda: events.append("no drain"))
        return events

    assert asyncio.run(run()) == ["still draining", "stopped", "second signal", "no drain"]


def test_a_negative_drain_is_refused() -> None:
    with pytest.raises(ValueError, match="seconds >= 0"):
        Drain(-1)
