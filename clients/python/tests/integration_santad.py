"""Integration test of the Python client against a real santad.

Not part of the default ``pytest`` run (``python_files`` in pyproject.toml
collects only ``test_*.py``); the Go test in ``internal/daemon`` runs it as
root inside the server network namespace of a veth testbed, with santad's XDP
program on the server veth:

    nsenter --net=/run/netns/$SERVER_NS /usr/bin/python3 -m pytest -q \\
        -p no:cacheprovider clients/python/tests/integration_santad.py

Environment (all required; without them the run fails, naming the missing ones):

* ``SANTA_SOCKET``: santad's control socket;
* ``SANTA_SERVER_ADDR4``, ``SANTA_SERVER_ADDR6``: the server veth's addresses,
  where the test binds its UDP sockets (ports 7600 to 7699);
* ``SANTA_CLIENT_NS``: the client namespace (under /run/netns). Requests are
  sent from sockets made there: a datagram from the server namespace to its
  own address would never pass the veth, so never XDP.

``PYTHONPATH`` may point at clients/python; pytest's ``pythonpath`` setting in
pyproject.toml puts this checkout's ``santa`` on the path as well.

A rule's answer is checked on the wire while the server socket stays unread:
only the kernel can have answered. Every wait is bounded.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import os
import signal
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator

import pytest

REQUIRED_ENV = ("SANTA_SOCKET", "SANTA_SERVER_ADDR4", "SANTA_SERVER_ADDR6", "SANTA_CLIENT_NS")
_missing = [name for name in REQUIRED_ENV if not os.environ.get(name)]
if _missing:
    pytest.fail(
        "integration_santad.py tests the client against a real santad and needs its testbed: "
        f"missing environment variable(s) {', '.join(_missing)} "
        "(SANTA_SOCKET: santad's control socket; SANTA_SERVER_ADDR4/SANTA_SERVER_ADDR6: the server veth's "
        "addresses; SANTA_CLIENT_NS: the client network namespace). The Go test in internal/daemon runs it.",
        pytrace=False,
    )

import santa  # noqa: E402  (after the environment check: its message comes first)
from santa import Condition, Cookie, Copy, Guard, Put, Rule, RuleStats, Sample, SocketInfo, Status  # noqa: E402

SANTA_SOCKET = os.environ["SANTA_SOCKET"]
CLIENT_NS = os.environ["SANTA_CLIENT_NS"]
SERVER = {
    4: (socket.AF_INET, os.environ["SANTA_SERVER_ADDR4"]),
    6: (socket.AF_INET6, os.environ["SANTA_SERVER_ADDR6"]),
}
REPLY_TIMEOUT = 2.0  # seconds to wait for one datagram on the veth
CALL_TIMEOUT = 10.0  # seconds santad may take for one request (and between sample events)
GONE_TIMEOUT = 5.0  # seconds until santad drops the rule set of a closed socket
HEADERS = {4: 14 + 20 + 8, 6: 14 + 40 + 8}  # Ethernet + IP + UDP bytes of a reply frame

#: The paper's Listing 1: answer b"Hello" with b"COMSYS".
LISTING1 = Rule(conditions=[Condition(offset=0, pattern=b"Hello")],
                processors=[Put(reply_offset=0, template=b"COMSYS")], reply_len=6)
#: b"ECHO" + 8 bytes is answered with b"ECHO:" + those 8 bytes; tagged, so
#: every listing checks that santad keeps the tag.
ECHO = Rule(conditions=[Condition(offset=0, pattern=b"ECHO")],
            processors=[Put(reply_offset=0, template=b"ECHO:"), Copy(reply_offset=5, src_offset=4, length=8)],
            reply_len=13, tag="python-integration")

SO_COOKIE = getattr(socket, "SO_COOKIE", 57)
CLONE_NEWNET = 0x40000000


def so_cookie(sock: socket.socket) -> int:
    return struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]


def installed(rule: Rule, rule_id: int, version: int = 1) -> Rule:
    """``rule`` as list_rules shows it."""
    return dataclasses.replace(rule, id=rule_id, version=version)


# -- the client namespace ----------------------------------------------------

def _setns(fd: int) -> None:
    if hasattr(os, "setns"):  # Python 3.12+
        os.setns(fd, CLONE_NEWNET)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns into network namespace {CLIENT_NS}: {os.strerror(err)}")


def in_client_ns(make: Callable[[], socket.socket]) -> socket.socket:
    """Run ``make`` on a thread of its own that joined the client namespace.

    The namespace is a property of the thread; a socket belongs to the
    namespace it was made in, for good, and may be used from any thread. The
    helper thread ends right after, so no other code runs in the client
    namespace.
    """
    result: list[socket.socket] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            fd = os.open(f"/run/netns/{CLIENT_NS}", os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            result.append(make())
        except BaseException as e:  # handed to the caller
            error.append(e)

    t = threading.Thread(target=run, name="client-netns")
    t.start()
    t.join(CALL_TIMEOUT)
    assert not t.is_alive(), "making a socket in the client namespace hung"
    if error:
        raise error[0]
    return result[0]


class Peer:
    """A UDP socket in the client namespace, connected to one server address and port."""

    def __init__(self, family: int, port: int) -> None:
        af, addr = SERVER[family]
        self.server = (addr, port)

        def make() -> socket.socket:
            s = socket.socket(af, socket.SOCK_DGRAM)
            s.connect(self.server)
            return s

        self.sock = in_client_ns(make)
        self.sock.settimeout(REPLY_TIMEOUT)
        self.addr = self.sock.getsockname()[:2]

    def send(self, payload: bytes) -> None:
        self.sock.send(payload)

    def recv(self) -> bytes | None:
        """The next datagram from the server address and port, or None after REPLY_TIMEOUT."""
        try:
            return self.sock.recv(4096)
        except TimeoutError:
            return None

    def ask(self, payload: bytes) -> bytes | None:
        """Send ``payload`` and return the reply (None if none came)."""
        self.send(payload)
        return self.recv()

    def close(self) -> None:
        self.sock.close()


# -- fixtures ----------------------------------------------------------------

@pytest.fixture(scope="module")
def client() -> Iterator[santa.Client]:
    assert os.path.exists(f"/run/netns/{CLIENT_NS}"), f"SANTA_CLIENT_NS={CLIENT_NS}: no /run/netns/{CLIENT_NS}"
    with santa.Client(SANTA_SOCKET, timeout=CALL_TIMEOUT) as c:
        yield c


_ports = itertools.count(7600)


@pytest.fixture
def port() -> int:
    p = next(_ports)
    assert p < 7700, "the test may use ports 7600 to 7699 only"
    return p


@pytest.fixture
def open_server() -> Iterator[Callable[[int, int], socket.socket]]:
    """``open_server(family, port)``: a UDP socket bound to the server veth's address; closed after the test."""
    socks: list[socket.socket] = []

    def open_(family: int, port: int) -> socket.socket:
        af, addr = SERVER[family]
        s = socket.socket(af, socket.SOCK_DGRAM)
        socks.append(s)
        s.bind((addr, port))
        return s

    yield open_
    for s in socks:
        s.close()


@pytest.fixture
def open_peer() -> Iterator[Callable[[int, int], Peer]]:
    """``open_peer(family, port)``: a Peer in the client namespace; closed after the test."""
    peers: list[Peer] = []

    def open_(family: int, port: int) -> Peer:
        peers.append(Peer(family, port))
        return peers[-1]

    yield open_
    for p in peers:
        p.close()


# -- checks ------------------------------------------------------------------

def assert_unread(server: socket.socket) -> None:
    """Nothing reached the application socket."""
    timeout = server.gettimeout()
    server.setblocking(False)  # with a timeout set, Python would wait for data despite MSG_DONTWAIT
    try:
        data, peer = server.recvfrom(4096)
    except BlockingIOError:
        return
    finally:
        server.settimeout(timeout)
    pytest.fail(f"the application socket received {data!r} from {peer}: santa did not answer it")


def app_receives(server: socket.socket, peer: Peer, payload: bytes) -> None:
    """``payload`` from ``peer`` arrives at the application socket (and is the next datagram there)."""
    server.settimeout(REPLY_TIMEOUT)
    try:
        data, src = server.recvfrom(4096)
    except TimeoutError:
        pytest.fail(f"{payload!r} did not reach the application socket in {REPLY_TIMEOUT} s")
    assert (data, src[:2]) == (payload, peer.addr)


def wait_gone(client: santa.Client, cookie: int) -> None:
    """santad drops the rule set of socket ``cookie`` within GONE_TIMEOUT."""
    deadline = time.monotonic() + GONE_TIMEOUT
    while cookie in {s.cookie for s in client.list_sockets()}:
        assert time.monotonic() < deadline, f"rule set of closed socket {cookie} still listed after {GONE_TIMEOUT} s"
        time.sleep(0.02)
    with pytest.raises(santa.Error) as e:
        client.list_rules(Cookie(cookie))
    assert e.value.status == Status.NOT_FOUND


FAMILIES = pytest.mark.parametrize("family", [4, 6], ids=["ipv4", "ipv6"])


# -- tests -------------------------------------------------------------------

def test_health(client: santa.Client) -> None:
    h = client.health()
    assert h.daemon.protocol == santa.VERSION == 1
    assert h.daemon.version
    assert h.daemon.pid > 0
    assert h.daemon.uid == os.getuid()
    assert h.daemon.interfaces, "santad reports no interface"
    here = {name for _, name in socket.if_nameindex()}  # this test runs in santad's namespace
    for iface in h.daemon.interfaces:
        assert iface.name in here
        assert iface.mode in ("native", "generic")
    assert all(isinstance(k, str) and isinstance(v, int) for k, v in h.counters.items())


@FAMILIES
def test_bind(client: santa.Client, open_server: Callable[[int, int], socket.socket], family: int, port: int) -> None:
    af, addr = SERVER[family]
    server = open_server(family, port)
    info = client.bind(server)
    assert info == SocketInfo(cookie=so_cookie(server), family=family, protocol=17,
                              address=socket.inet_pton(af, addr), port=port, owner=os.getuid(),
                              rules=0, template_bytes=0, hits=0, created=True, pid=os.getpid())
    again = client.bind(server)
    assert again == dataclasses.replace(info, created=False)
    assert dataclasses.replace(info, created=False) in client.list_sockets()
    assert client.list_rules(server) == []


@FAMILIES
def test_rules_answered_by_the_kernel(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                                      open_peer: Callable[[int, int], Peer], family: int, port: int) -> None:
    server = open_server(family, port)
    peer = open_peer(family, port)
    cookie = so_cookie(server)
    hello_id, echo_id = ids = client.add(server, [LISTING1, ECHO])
    assert len(set(ids)) == 2

    # answered on the wire; the application socket is never read
    for _ in range(3):
        assert peer.ask(b"Hello") == b"COMSYS"
    tokens = [b"tok%05d" % i for i in range(4)]
    for token in tokens:
        assert peer.ask(b"ECHO" + token) == b"ECHO:" + token
    assert_unread(server)

    want_rules = [installed(LISTING1, hello_id), installed(ECHO, echo_id)]
    assert client.list_rules(server) == want_rules
    assert client.list_rules(Cookie(cookie)) == want_rules
    assert client.list_rules(server, tag=ECHO.tag) == want_rules[1:]
    assert client.list_page(server, limit=1) == (want_rules[:1], True)
    assert client.list_page(server, after=hello_id, limit=1) == (want_rules[1:], False)

    hdr = HEADERS[family]
    hello_stats = RuleStats(hello_id, hits=3, bytes=3 * (hdr + 6))
    echo_stats = RuleStats(echo_id, hits=4, bytes=4 * (hdr + 13))
    assert client.stats(server) == sorted([hello_stats, echo_stats], key=lambda s: s.id)
    assert client.stats(Cookie(cookie), [echo_id, hello_id]) == [echo_stats, hello_stats]
    [listed] = [s for s in client.list_sockets() if s.cookie == cookie]
    assert (listed.rules, listed.hits) == (2, 7)

    # modify: version 2, the new reply on the wire, the counts carried on
    changed = Rule(conditions=[Condition(0, b"Hello")], processors=[Put(0, b"COMSYS v2")], reply_len=9, id=hello_id)
    assert client.modify(server, [changed]) is None
    assert client.list_rules(server) == [installed(changed, hello_id, version=2), installed(ECHO, echo_id)]
    assert peer.ask(b"Hello") == b"COMSYS v2"
    assert_unread(server)
    assert client.stats(server, [hello_id]) == [RuleStats(hello_id, hits=4, bytes=3 * (hdr + 6) + hdr + 9)]

    # delete: the request reaches the application again
    client.delete(server, [hello_id])
    assert client.list_rules(server) == [installed(ECHO, echo_id)]
    peer.send(b"Hello")
    app_receives(server, peer, b"Hello")
    server.sendto(b"app:Hello", peer.addr)
    assert peer.recv() == b"app:Hello"
    assert peer.ask(b"ECHO" + b"after-rm") == b"ECHO:after-rm"
    assert_unread(server)
    assert client.stats(server) == [RuleStats(echo_id, hits=5, bytes=5 * (hdr + 13))]
    with pytest.raises(santa.Error) as e:
        client.stats(server, [hello_id])
    assert e.value.status == Status.NOT_FOUND

    # delete by tag: every rule with it at once, none the second time
    tagged_id, = client.add(server, [dataclasses.replace(LISTING1, tag="python-doomed")])
    assert client.delete_tagged(server, "python-doomed") == [tagged_id]
    assert client.delete_tagged(server, "python-doomed") == []
    assert client.list_rules(server) == [installed(ECHO, echo_id)]
    with pytest.raises(ValueError):
        client.delete_tagged(server, "")


@FAMILIES
def test_masks_and_length_bounds(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                                 open_peer: Callable[[int, int], Peer], family: int, port: int) -> None:
    server = open_server(family, port)
    peer = open_peer(family, port)
    # exactly 7-byte requests <id:2><flags:2>b"MSK" with bit 0x80 of the first
    # flags byte clear; the reply echoes bit 0x01 of the second into its flags
    rule = Rule(conditions=[Condition(2, b"\x00", mask=b"\x80"), Condition(4, b"MSK")],
                processors=[Copy(0, 0, 2), Put(2, b"\x84\x00OK"), Copy(3, 3, 1, mask=b"\x01")],
                reply_len=6, min_len=7, max_len=7)
    [rule_id] = client.add(server, [rule])
    assert client.list_rules(server) == [installed(rule, rule_id)]
    assert peer.ask(b"\x12\x34\x7f\xffMSK") == b"\x12\x34\x84\x01OK"
    assert peer.ask(b"\x56\x78\x00\x00MSK") == b"\x56\x78\x84\x00OK"
    assert_unread(server)
    for missed in (b"\x12\x34\x80\x00MSK", b"\x12\x34\x00\x00MSK!"):  # a compared bit differs; too long
        peer.send(missed)
        app_receives(server, peer, missed)


@FAMILIES
def test_guards(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                open_peer: Callable[[int, int], Peer], family: int, port: int) -> None:
    server = open_server(family, port)
    peer = open_peer(family, port)
    # santad's guard map is fresh (every slot 0) and nothing here writes it: the
    # stale rule never answers, though it has the better priority
    slot = (1 << 20) - 2
    stale = Rule([Condition(0, b"GRD")], [Put(0, b"stale")], reply_len=5, guards=[Guard(slot, 1 << 40)])
    fresh = Rule([Condition(0, b"GRD")], [Put(0, b"fresh")], reply_len=5, priority=1, guards=[Guard(slot, 0)])
    stale_id, fresh_id = client.add(server, [stale, fresh])
    assert client.list_rules(server) == [installed(stale, stale_id), installed(fresh, fresh_id)]
    assert peer.ask(b"GRD") == b"fresh"
    assert_unread(server)
    client.delete(server, [fresh_id])
    invalidated = client.health().counters.get("pass_invalidated", 0)
    peer.send(b"GRD")
    app_receives(server, peer, b"GRD")
    assert client.health().counters.get("pass_invalidated", 0) == invalidated + 1

    for guards, why in [([Guard(0, 0)] * 3, "at most 2"), ([Guard(1 << 20, 0)], "slot 1048576")]:
        with pytest.raises(santa.Error) as e:
            client.add(server, [dataclasses.replace(stale, guards=guards)])
        assert e.value.status == Status.INVALID and why in e.value.message, e.value
    assert client.list_rules(server) == [installed(stale, stale_id)]


def test_replace_is_atomic(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                           open_peer: Callable[[int, int], Peer], port: int) -> None:
    server = open_server(4, port)
    peer = open_peer(4, port)
    old = [Rule([Condition(0, b"Q")], [Put(0, b"old")], reply_len=3),
           Rule([Condition(0, b"A")], [Put(0, b"old-a")], reply_len=5)]
    new = [Rule([Condition(0, b"Q")], [Put(0, b"new")], reply_len=3),
           Rule([Condition(0, b"B")], [Put(0, b"new-b")], reply_len=5)]
    old_ids = client.add(server, old)

    # a client asks "Q" back to back while the rules are swapped: every
    # request is answered, by the old rules until the swap, then by the new
    replies: list[bytes | None] = []
    stop = threading.Event()

    def ask_q() -> None:
        deadline = time.monotonic() + 15
        while not stop.is_set() and time.monotonic() < deadline:
            replies.append(peer.ask(b"Q"))
            if replies[-1] is None:
                return

    asker = threading.Thread(target=ask_q)
    asker.start()
    try:
        deadline = time.monotonic() + 5
        while len(replies) < 50 and asker.is_alive() and time.monotonic() < deadline:
            time.sleep(0.001)
        new_ids = client.replace(server, new)
        swapped_at = len(replies)
        while len(replies) < swapped_at + 50 and asker.is_alive() and time.monotonic() < deadline + 5:
            time.sleep(0.001)
    finally:
        stop.set()
        asker.join(REPLY_TIMEOUT + 5)
    assert not asker.is_alive()
    assert None not in replies, f"request {replies.index(None)} of {len(replies)} was not answered"
    assert b"new" in replies, f"none of {len(replies)} requests was answered by the new rules"
    switch = replies.index(b"new")
    assert switch > 0 and replies == [b"old"] * switch + [b"new"] * (len(replies) - switch), \
        f"replies during the swap: {replies.count(b'old')} old, {replies.count(b'new')} new, not old* new*"
    assert_unread(server)

    assert len(new_ids) == 2 and not set(new_ids) & set(old_ids)
    assert client.list_rules(server) == [installed(r, i) for r, i in zip(new, new_ids)]
    hdr = HEADERS[4]
    n_new = len(replies) - switch
    assert client.stats(server, new_ids) == [RuleStats(new_ids[0], hits=n_new, bytes=n_new * (hdr + 3)),
                                             RuleStats(new_ids[1], hits=0, bytes=0)]
    for gone in old_ids:
        with pytest.raises(santa.Error) as e:
            client.stats(server, [gone])
        assert e.value.status == Status.NOT_FOUND
    assert peer.ask(b"B") == b"new-b"
    peer.send(b"A")  # the old rule's request is the application's again
    app_receives(server, peer, b"A")

    # replace with nothing empties the rule set, which stays bound
    assert client.replace(server, []) == []
    assert client.list_rules(server) == []
    assert (so_cookie(server), 0) in {(s.cookie, s.rules) for s in client.list_sockets()}


def test_errors(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                open_peer: Callable[[int, int], Peer], port: int) -> None:
    server = open_server(4, port)
    peer = open_peer(4, port)
    [hello_id] = client.add(server, [LISTING1])
    before = [installed(LISTING1, hello_id)]
    # the pattern lies beyond the first 1472 bytes of the request the matcher sees
    invalid = Rule([Condition(1400, b"x" * 100)], [Put(0, b"no")], reply_len=2)

    for what, call in [
        ("add", lambda: client.add(server, [ECHO, invalid])),
        ("replace", lambda: client.replace(server, [ECHO, invalid])),
        ("modify", lambda: client.modify(server, [dataclasses.replace(invalid, id=hello_id)])),
    ]:
        with pytest.raises(santa.Error) as e:
            call()
        assert e.value.status == Status.INVALID, f"{what}: {e.value}"
        assert "1472" in e.value.message, f"{what}: {e.value.message!r} does not name the limit"
        assert client.list_rules(server) == before, f"{what} of an invalid rule changed the rule set"
    # a modify without a rule id is santad's to refuse, as for the C and Go clients
    with pytest.raises(santa.Error) as e:
        client.modify(server, [LISTING1])
    assert e.value.status == Status.INVALID and "rule 0: no id" in e.value.message, e.value
    assert client.list_rules(server) == before

    # nothing of the refused requests is installed: ECHO is the application's, Hello still the kernel's
    peer.send(b"ECHO" + b"12345678")
    app_receives(server, peer, b"ECHO12345678")
    assert peer.ask(b"Hello") == b"COMSYS"
    assert_unread(server)

    # a cookie without a rule set: that of a socket santad never saw
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as stranger:
        unknown = Cookie(so_cookie(stranger))
    assert unknown.value not in {s.cookie for s in client.list_sockets()}
    for what, call in [
        ("list_rules", lambda: client.list_rules(unknown)),
        ("stats", lambda: client.stats(unknown)),
        ("add", lambda: client.add(unknown, [LISTING1])),
        ("replace", lambda: client.replace(unknown, [LISTING1])),
        ("modify", lambda: client.modify(unknown, [installed(LISTING1, hello_id)])),
        ("delete", lambda: client.delete(unknown, [hello_id])),
        ("unbind", lambda: client.unbind(unknown)),
    ]:
        with pytest.raises(santa.Error) as e:
            call()
        assert e.value.status == Status.NOT_FOUND, f"{what}: {e.value}"
    assert client.list_rules(server) == before


@FAMILIES
def test_subscribe_samples_misses(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                                  open_peer: Callable[[int, int], Peer], family: int, port: int) -> None:
    server = open_server(family, port)
    peer = open_peer(family, port)
    cookie = so_cookie(server)
    client.add(server, [LISTING1])
    misses = [b"miss", bytes(range(100)), b"Hell", b"x" * 64, b"y" * 65, b"Hello"[1:] + b"Hello"]
    with santa.Client(SANTA_SOCKET, timeout=CALL_TIMEOUT) as events:
        samples = events.subscribe(server, sample_bytes=64, sample_rate=1000)
        for payload in misses:
            assert peer.ask(b"Hello") == b"COMSYS"  # answered: no sample
            peer.send(payload)
            app_receives(server, peer, payload)  # sampled misses still reach the application
            # a subscription waits for samples past the client's timeout: bound it here
            signal.signal(signal.SIGALRM, lambda *_: pytest.fail(f"no sample of {payload!r} in {CALL_TIMEOUT} s"))
            signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT)
            try:
                sample = next(samples)
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            assert sample == Sample(socket=cookie, data=payload[:64], request_len=len(payload))
        with pytest.raises(RuntimeError):
            events.health()  # the connection carries only events now
    assert_unread(server)
    [hits] = [s.hits for s in client.list_sockets() if s.cookie == cookie]
    assert hits == len(misses)


def test_unbind(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                open_peer: Callable[[int, int], Peer], port: int) -> None:
    server = open_server(6, port)
    peer = open_peer(6, port)
    info = client.bind(server)
    client.add(server, [LISTING1])
    assert peer.ask(b"Hello") == b"COMSYS"
    client.unbind(server)
    assert info.cookie not in {s.cookie for s in client.list_sockets()}
    for call in (lambda: client.list_rules(server), lambda: client.list_rules(Cookie(info.cookie)),
                 lambda: client.unbind(server)):
        with pytest.raises(santa.Error) as e:
            call()
        assert e.value.status == Status.NOT_FOUND
    peer.send(b"Hello")
    app_receives(server, peer, b"Hello")
    # the socket may be bound again, afresh
    assert client.bind(server) == dataclasses.replace(info, created=True)


@FAMILIES
def test_rules_die_with_the_socket(client: santa.Client, open_server: Callable[[int, int], socket.socket],
                                   open_peer: Callable[[int, int], Peer], family: int, port: int) -> None:
    server = open_server(family, port)
    peer = open_peer(family, port)
    cookie = so_cookie(server)
    client.add(server, [LISTING1])
    assert peer.ask(b"Hello") == b"COMSYS"
    server.close()
    wait_gone(client, cookie)
    # a new socket on the port has a new cookie and none of the old rules
    fresh = open_server(family, port)
    assert so_cookie(fresh) != cookie
    peer.send(b"Hello")
    app_receives(fresh, peer, b"Hello")
