"""The client when santad closes its connection: it connects again, and
tells a request santad never read from one whose outcome is unknown.

A scripted stand-in for santad plays one part per connection it accepts.
"""

from __future__ import annotations

import os
import pathlib
import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest

import santa
from santa.protocol import Message, Op, Status
from santa.transport import recv_message, send_message

from helpers import ok

LISTING1 = santa.Rule([santa.Condition(0, b"Hello")], [santa.Put(0, b"COMSYS")], reply_len=6)


class ScriptedSantad:
    """Listens at ``path``; the n-th connection gets ``parts[n]``:

    * ``"drop"``: closed at once, as by a santad that stops;
    * ``"refuse"``: answered quota (seq 0) and closed, as santad does past
      ``quota.connections``;
    * ``"read_close"``: one request read, then closed without an answer;
    * ``"serve"``: every request answered ok.
    """

    def __init__(self, path: str, parts: list[str]) -> None:
        self.path = path
        self.parts = parts
        self.accepted = 0
        self.requests: list[tuple[int, Message]] = []  # (connection, request)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        threading.Thread(target=self._run, daemon=True).start()

    def stop(self) -> None:
        self.listener.close()
        os.unlink(self.path)

    def _run(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            n, self.accepted = self.accepted, self.accepted + 1
            threading.Thread(target=self._serve, args=(conn, n, self.parts[n]), daemon=True).start()

    def _serve(self, conn: socket.socket, n: int, part: str) -> None:
        with conn:
            if part == "refuse":
                send_message(conn, Message(v=1, status=Status.QUOTA, error="uid 0 holds 64 connections"))
            if part in ("drop", "refuse"):
                return
            while True:
                try:
                    request, fds = recv_message(conn)
                except (EOFError, OSError):
                    return
                for fd in fds:
                    os.close(fd)
                self.requests.append((n, request))
                if part == "read_close":
                    return
                send_message(conn, ok(request, daemon=santa.DaemonInfo(version="fake")))


@pytest.fixture
def sock_path(tmp_path: pathlib.Path) -> Iterator[str]:
    yield str(tmp_path / "santa.sock")


def wait_closed(client: santa.Client) -> None:
    """Waits until santad's end of the client's connection is closed."""
    assert client._sock is not None
    p = select.poll()
    p.register(client._sock.fileno(), select.POLLRDHUP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(ev & (select.POLLRDHUP | select.POLLHUP) for _, ev in p.poll(1000)):
            return
    pytest.fail("the stand-in did not close the connection in 10 s")


def test_redial_when_santad_closed_the_connection(sock_path: str) -> None:
    fake = ScriptedSantad(sock_path, ["drop", "serve"])
    with santa.Client(sock_path, timeout=10) as client:
        wait_closed(client)
        assert client.health().daemon.version == "fake"  # sent again on a new connection
        assert client.health().daemon.version == "fake"  # which stays
    assert fake.accepted == 2
    assert [(n, m.op, m.seq) for n, m in fake.requests] == [(1, Op.HEALTH, 1), (1, Op.HEALTH, 2)]


def test_refusal_is_raised_not_redialed(sock_path: str) -> None:
    fake = ScriptedSantad(sock_path, ["refuse", "serve"])
    with santa.Client(sock_path, timeout=10) as client:
        wait_closed(client)
        with pytest.raises(santa.Error, match="64 connections") as info:
            client.health()
        assert info.value.status is Status.QUOTA
        assert not isinstance(info.value, santa.OutcomeUnknownError)
        assert fake.requests == [] and fake.accepted == 1
        client.health()  # the next request connects again
    assert [(n, m.seq) for n, m in fake.requests] == [(1, 2)]


def test_outcome_unknown_is_not_resent(sock_path: str) -> None:
    fake = ScriptedSantad(sock_path, ["read_close", "serve"])
    with santa.Client(sock_path, timeout=10) as client:
        with pytest.raises(santa.OutcomeUnknownError, match="outcome is unknown") as info:
            client.add(santa.Cookie(4097), [LISTING1])
        assert isinstance(info.value, santa.Error) and isinstance(info.value, ConnectionError)
        client.health()  # connects again
    assert [(n, m.op, m.seq) for n, m in fake.requests] == [(0, Op.ADD, 1), (1, Op.HEALTH, 2)]
    assert fake.accepted == 2


def test_redial_fails_then_succeeds(sock_path: str) -> None:
    fake = ScriptedSantad(sock_path, ["drop"])
    with santa.Client(sock_path, timeout=10) as client:
        wait_closed(client)
        fake.stop()
        for _ in range(2):
            with pytest.raises(FileNotFoundError) as info:
                client.health()
            text = str(info.value)
            assert sock_path in text and "was lost" in text and "connecting again failed" in text, text
        fake = ScriptedSantad(sock_path, ["serve"])
        client.health()
    assert [(n, m.seq) for n, m in fake.requests] == [(0, 3)]


def test_a_closed_client_does_not_redial(sock_path: str) -> None:
    fake = ScriptedSantad(sock_path, ["drop", "serve"])
    client = santa.Client(sock_path, timeout=10)
    client.close()
    with pytest.raises(OSError, match="closed"):
        client.health()
    assert fake.accepted <= 1  # the first connection, if the stand-in accepted it yet
