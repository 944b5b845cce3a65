"""The client against a scripted stand-in for santad on a real Unix socket.

Tests against a real santad live with the integration tests; these check the
client's side of the conversation: what it sends, what it passes, how it reads
answers.
"""

from __future__ import annotations

import errno
import os
import pathlib
import socket
from collections.abc import Callable

import pytest

import santa
from santa.protocol import Message, Op

from helpers import FakeSantad, Handler, cookie, ok

LISTING1 = santa.Rule([santa.Condition(0, b"Hello")], [santa.Put(0, b"COMSYS")], reply_len=6)


def test_add_passes_the_socket(santad: Callable[[Handler], FakeSantad], udp: socket.socket) -> None:
    fake = santad(lambda r, c: [ok(r, ids=list(range(10, 10 + len(r.rules))))])
    with santa.Client(fake.path, timeout=10) as client:
        assert client.add(udp, [LISTING1]) == [10]
        assert client.add(udp.fileno(), [LISTING1, LISTING1]) == [10, 11]
        assert client.replace(santa.Cookie(4097), []) == []
    (first, passed1), (second, passed2), (third, passed3) = fake.requests
    assert first == Message(v=1, op=Op.ADD, seq=1, rules=[LISTING1])
    assert passed1 == passed2 == cookie(udp.fileno())
    assert second.seq == 2 and len(second.rules) == 2
    assert third == Message(v=1, op=Op.REPLACE, seq=3, socket=4097) and passed3 is None


def test_every_request(santad: Callable[[Handler], FakeSantad], udp: socket.socket) -> None:
    info = santa.SocketInfo(cookie=4097, family=6, protocol=17, address=bytes(15) + b"\x01", port=5353, created=True)
    stats = [santa.RuleStats(3, hits=5, bytes=300)]
    daemon = santa.DaemonInfo(version="0.3.0", protocol=1, interfaces=[santa.Interface("veth0", "native")])
    answers: dict[Op, dict[str, object]] = {
        Op.HEALTH: dict(daemon=daemon, counters={"answered": 7}),
        Op.BIND: dict(sockets=[info]),
        Op.LIST_SOCKETS: dict(sockets=[info, info]),
        Op.LIST_RULES: dict(rules=[LISTING1]),
        Op.STATS: dict(stats=stats),
        Op.MODIFY: dict(ids=[3]),
    }
    fake = santad(lambda r, c: [ok(r, **answers.get(Op(r.op), {}))])
    target = santa.Cookie(4097)
    with santa.Client(fake.path, timeout=10) as client:
        assert client.health() == santa.Health(daemon, {"answered": 7})
        assert client.bind(udp, sample_bytes=64, sample_rate=100) == info
        assert info.ip.compressed == "::1"
        assert client.bind_pid(1234, 5) == info
        assert client.bind_port(53) == [info]
        assert client.list_sockets() == [info, info]
        assert client.list_rules(target) == [LISTING1]
        assert client.stats(target) == stats
        assert client.stats(target, [3]) == stats
        assert client.modify(target, [santa.Rule(id=3)]) is None
        client.delete(target, iter([3, 4]))
        client.unbind(target)
        assert client.bind_port(80, protocol=socket.IPPROTO_TCP) == [info]
    sent = [m for m, _ in fake.requests]
    assert [m.seq for m in sent] == list(range(1, len(sent) + 1))
    assert sent[1] == Message(v=1, op=Op.BIND, seq=2, sample_bytes=64, sample_rate=100)
    assert fake.requests[1][1] == cookie(udp.fileno())
    assert sent[2] == Message(v=1, op=Op.BIND, seq=3, pid=1234, fd=5)
    assert sent[3] == Message(v=1, op=Op.BIND, seq=4, port=53)
    assert sent[6].ids == [] and sent[7].ids == [3]
    assert sent[9] == Message(v=1, op=Op.DELETE, seq=10, socket=4097, ids=[3, 4])
    assert sent[11] == Message(v=1, op=Op.BIND, seq=12, port=80, protocol=6)
    assert all(passed is None for _, passed in fake.requests[2:])


def test_refusal_raises_error(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: [Message(v=1, op=r.op, seq=r.seq, status=3, error="uid 1000 did not bind socket 4097")])
    with santa.Client(fake.path, timeout=10) as client, pytest.raises(santa.Error) as info:
        client.unbind(santa.Cookie(4097))
    assert info.value.status is santa.Status.PERMISSION
    assert info.value.message == "uid 1000 did not bind socket 4097"


def test_unparsed_request_refusal_has_seq_0(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: [Message(v=1, status=1, error="unknown key 19")])
    with santa.Client(fake.path, timeout=10) as client, pytest.raises(santa.Error, match="unknown key 19"):
        client.health()


@pytest.mark.parametrize("response", [
    lambda r: Message(v=1, op=r.op, seq=r.seq + 1),  # another seq
    lambda r: Message(v=1, op=Op.BIND, seq=r.seq),  # another op
    lambda r: Message(v=2, op=r.op, seq=r.seq),  # another version
    lambda r: Message(v=1, op=r.op, seq=r.seq, ids=[1, 2]),  # two ids for one rule
])
def test_bad_response_raises_protocol_error(santad: Callable[[Handler], FakeSantad],
                                            response: Callable[[Message], Message]) -> None:
    fake = santad(lambda r, c: [response(r)])
    with santa.Client(fake.path, timeout=10) as client, pytest.raises(santa.ProtocolError):
        client.add(santa.Cookie(1), [LISTING1])


def test_santad_closing_raises(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: None)
    with santa.Client(fake.path, timeout=10) as client, pytest.raises(ConnectionError):
        client.health()


def test_subscribe(santad: Callable[[Handler], FakeSantad], udp: socket.socket) -> None:
    def events(r: Message, c: int | None) -> list[Message]:
        return [ok(r)] + [Message(v=1, op=Op.SAMPLE, seq=r.seq, socket=4097, sample=b"q%d" % i, request_len=29)
                          for i in range(3)]

    fake = santad(events)
    with santa.Client(fake.path, timeout=10) as client:
        samples = client.subscribe(udp, 64, 10)
        assert [next(samples) for _ in range(3)] == [santa.Sample(4097, b"q%d" % i, 29) for i in range(3)]
        with pytest.raises(RuntimeError):
            client.health()
    assert list(samples) == []  # closing the client ends the stream
    assert fake.requests[0] == (Message(v=1, op=Op.SUBSCRIBE, seq=1, sample_bytes=64, sample_rate=10), cookie(udp.fileno()))


def test_subscribe_waits_past_the_timeout(santad: Callable[[Handler], FakeSantad]) -> None:
    def events(r: Message, c: int | None) -> list[Message | float]:
        return [ok(r), 0.6, Message(v=1, op=Op.SAMPLE, seq=r.seq, socket=9, sample=b"late", request_len=4)]

    fake = santad(events)
    with santa.Client(fake.path, timeout=0.2) as client:
        assert next(client.subscribe(santa.Cookie(9), 64, 10)) == santa.Sample(9, b"late", 4)


def test_subscribe_refused(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: [Message(v=1, op=r.op, seq=r.seq, status=4, error="socket 9 has no rule set")])
    with santa.Client(fake.path, timeout=10) as client, pytest.raises(santa.Error, match="no rule set"):
        client.subscribe(santa.Cookie(9), 64, 10)


def test_bind_pid_range(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: [ok(r)])
    with santa.Client(fake.path, timeout=10) as client:
        for pid, fd in ((0, 3), (-1, 3), (1, -1), (2**31, 3), (1, 2**31)):
            with pytest.raises(ValueError, match="want a process id from 1"):
                client.bind_pid(pid, fd)
        client.health()
    assert [m.op for m, _ in fake.requests] == [Op.HEALTH]  # nothing went to santad


def test_closed_target_fd(santad: Callable[[Handler], FakeSantad], udp: socket.socket) -> None:
    fake = santad(lambda r, c: [ok(r)])
    with santa.Client(fake.path, timeout=10) as client:
        client.health()  # the fake has accepted: no thread takes the closed fd's number meanwhile
        closed = os.dup(udp.fileno())
        os.close(closed)
        with pytest.raises(OSError, match=f"santad add: the target fd {closed} is not open") as e:
            client.add(closed, [LISTING1])
        assert e.value.errno == errno.EBADF
        client.health()
    assert [m.op for m, _ in fake.requests] == [Op.HEALTH, Op.HEALTH]


def test_targets_are_unambiguous() -> None:
    assert santa.client._resolve(santa.Cookie(3), "add") == (None, 3)
    assert santa.client._resolve(3, "add") == (3, 0)
    with pytest.raises(TypeError):
        santa.client._resolve(True, "add")
    with pytest.raises(TypeError):
        santa.client._resolve("/run/santa/santa.sock", "add")  # type: ignore[arg-type]


def test_bind_needs_the_socket(santad: Callable[[Handler], FakeSantad]) -> None:
    fake = santad(lambda r, c: [])
    with santa.Client(fake.path) as client, pytest.raises(TypeError, match="cookie"):
        client.bind(santa.Cookie(1))


def test_targets_that_name_no_socket(santad: Callable[[Handler], FakeSantad]) -> None:
    """A target naming no socket is refused before anything is sent, with
    the words of the C and Go clients (docs/api.md "Targets"): it went to
    santad (None, Cookie(0)), or was refused as a closed fd (-1)."""
    fake = santad(lambda r, c: [ok(r)])
    bind = "santad bind: no target socket: bind needs the socket's fd"
    with santa.Client(fake.path, timeout=10) as client:
        for call, error, words in [
            (lambda: client.bind(-1), ValueError, bind),
            (lambda: client.bind(None), ValueError, bind),  # type: ignore[arg-type]
            (lambda: client.bind(santa.Cookie(5)), TypeError, bind),
            (lambda: client.add(-1, [LISTING1]), ValueError, "santad add: no target socket: pass the socket's fd or name its cookie"),
            (lambda: client.unbind(santa.Cookie(0)), ValueError, "santad unbind: no target socket"),
            (lambda: client.list_rules(None), ValueError, "santad list_rules: no target socket"),  # type: ignore[arg-type]
        ]:
            with pytest.raises(error, match=words):
                call()
        client.health()
    assert [m.op for m, _ in fake.requests] == [Op.HEALTH]  # nothing else went to santad


def test_socket_path(monkeypatch: pytest.MonkeyPatch, santad: Callable[[Handler], FakeSantad]) -> None:
    monkeypatch.delenv("SANTA_SOCKET", raising=False)
    assert santa.socket_path() == "/run/santa/santa.sock"
    fake = santad(lambda r, c: [ok(r)])
    monkeypatch.setenv("SANTA_SOCKET", fake.path)
    assert santa.socket_path() == fake.path
    assert santa.socket_path("/x") == "/x"
    with santa.Client() as client:
        assert client.path == fake.path


def test_socket_path_too_long() -> None:
    path = "/run/" + "x" * 103 + "/santa.sock"
    with pytest.raises(OSError, match="longer than 107 bytes"):
        santa.Client(path)


def test_unreachable_santad(tmp_path: pathlib.Path) -> None:
    path = str(tmp_path / "absent.sock")
    with pytest.raises(FileNotFoundError, match=f"connect to santad at {path}.*is santad running"):
        santa.Client(path)
