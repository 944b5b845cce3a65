"""examples/listing1.py as the integration test runs it, against a stand-in for santad."""

from __future__ import annotations

import pathlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from collections.abc import Callable

import pytest

import santa
from santa.protocol import Message, Op

from helpers import FakeSantad, Handler, ok

LISTING1 = pathlib.Path(__file__).resolve().parents[1] / "examples" / "listing1.py"
RULE = santa.Rule([santa.Condition(0, b"Hello")], [santa.Put(0, b"COMSYS")], reply_len=6)


def santad_answers(request: Message, passed: int | None) -> list[Message]:
    """bind: the passed socket's real cookie; add: rule id 7; stats: 5 hits."""
    assert passed is not None, "listing1 must pass its socket"
    if request.op == Op.BIND:
        return [ok(request, sockets=[santa.SocketInfo(cookie=passed, family=4, protocol=17, created=True)])]
    if request.op == Op.ADD:
        assert request.rules == [RULE]
        return [ok(request, ids=[7])]
    assert request.op == Op.STATS and request.ids == [7]
    return [ok(request, stats=[santa.RuleStats(7, hits=5, bytes=5 * 48)])]


def free_port(family: socket.AddressFamily, addr: str) -> int:
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def run(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(LISTING1), *args], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.fixture
def server() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    procs: list[subprocess.Popen[str]] = []

    def start(*args: str) -> subprocess.Popen[str]:
        procs.append(run(*args))
        return procs[-1]

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.communicate()


@pytest.mark.parametrize("family, addr", [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serves_and_stops(santad: Callable[[Handler], FakeSantad], server: Callable[..., subprocess.Popen[str]],
                          family: socket.AddressFamily, addr: str, sig: signal.Signals) -> None:
    fake = santad(santad_answers)
    port = free_port(family, addr)
    proc = server("--socket", fake.path, addr, str(port))
    assert proc.stdout is not None
    line = proc.stdout.readline()
    cookie = fake.requests[0][1]
    assert line == f"ready cookie={cookie} rule=7\n"
    with socket.socket(family, socket.SOCK_DGRAM) as c:
        c.settimeout(10)
        c.connect((addr, port))
        c.send(b"Hello")  # no XDP here: the application sees it
        assert c.recv(100) == b"app:Hello"
        c.send(b"stats")
        assert c.recv(100) == b"hits=5"
    proc.send_signal(sig)
    assert proc.wait(10) == 0


def test_santad_unreachable(tmp_path: pathlib.Path, server: Callable[..., subprocess.Popen[str]]) -> None:
    proc = server("--socket", str(tmp_path / "absent.sock"), "127.0.0.1", "0")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode != 0 and out == ""
    assert "connect to santad" in err and "is santad running" in err


def test_santad_refuses(santad: Callable[[Handler], FakeSantad], server: Callable[..., subprocess.Popen[str]]) -> None:
    fake = santad(lambda r, c: [Message(v=1, op=r.op, seq=r.seq, status=5, error="uid 1000 would hold 101 rules, quota 100")])
    proc = server("--socket", fake.path, "127.0.0.1", "0")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode != 0 and out == ""
    assert "quota exceeded: uid 1000 would hold 101 rules, quota 100" in err


def test_socket_from_environment(santad: Callable[[Handler], FakeSantad], server: Callable[..., subprocess.Popen[str]],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    fake = santad(santad_answers)
    monkeypatch.setenv("SANTA_SOCKET", fake.path)
    proc = server("127.0.0.1", "0")
    assert proc.stdout is not None and proc.stdout.readline().startswith("ready cookie=")
    proc.terminate()
    assert proc.wait(10) == 0
