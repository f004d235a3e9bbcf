"""The benchmarks' Service port: the kernel spreads new connections over the live replicas,
stops sending to a dropped one, and leaves no rule behind."""

from __future__ import annotations

import socket
import subprocess
import threading
from collections.abc import Iterator

import pytest

from tessera_e2e.operator.service import KernelService


class _Backend:
    """A TCP server on loopback that answers each connection with its own name."""

    def __init__(self, name: bytes) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.name = name
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(self.name)


@pytest.fixture
def service() -> Iterator[KernelService]:
    svc = KernelService().start()
    try:
        yield svc
    finally:
        svc.stop()


def _ask(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        return s.recv(16)


def test_connections_spread_over_live_replicas_and_leave_a_dropped_one(
        service: KernelService) -> None:
    a, b = _Backend(b"a"), _Backend(b"b")
    service.route("a", a.port)
    service.route("b", b.port)
    answers = [_ask(service.port) for _ in range(60)]
    assert set(answers) == {b"a", b"b"}, answers
    assert 10 <= answers.count(b"a") <= 50, answers  # uniform: P(outside) < 1e-5
    counted = service.connections
    assert counted == {a.port: answers.count(b"a"), b.port: answers.count(b"b")}

    service.drop("a", a.port)
    assert {_ask(service.port) for _ in range(20)} == {b"b"}
    service.drop("b", b.port)
    with pytest.raises(ConnectionRefusedError):  # no endpoints: refused, as with a Service
        _ask(service.port)


def test_stop_removes_the_rules() -> None:
    svc = KernelService().start()
    svc.stop()
    rules = subprocess.run(["iptables", "-w", "-t", "nat", "-S"], capture_output=True,
                           text=True, check=True).stdout
    assert svc.chain not in rules
