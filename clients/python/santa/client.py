"""A connection to santad: bind sockets, manage their rules, read statistics."""

from __future__ import annotations

import errno
import os
import socket
import threading
from dataclasses import dataclass
from typing import Protocol
from collections.abc import Iterable, Iterator, Sequence

from .protocol import (
    DEFAULT_SOCKET, VERSION, DaemonInfo, Error, Message, Op, OutcomeUnknownError, ProtocolError, Rule,
    RuleStats, SocketInfo, Status,
)
from .transport import TruncatedFrame, recv_message, send_message

__all__ = ["Client", "Cookie", "Health", "Sample", "Target", "socket_path"]

#: How many rules :meth:`Client.list_rules` asks for per page.
LIST_PAGE_RULES = 16384


class _HasFileno(Protocol):
    def fileno(self) -> int: ...


class _Untargeted:
    """The target of a request about no one socket (health, a root bind by pid or port)."""


_UNTARGETED = _Untargeted()


@dataclass(frozen=True)
class Cookie:
    """Names an existing rule set by its socket's cookie (``SO_COOKIE``).

    A target that is a socket object or an ``int`` is a file descriptor and is
    passed to santad; only a ``Cookie`` is sent as a cookie.
    """

    value: int

    def __int__(self) -> int:
        return self.value


#: What a request is about: a socket the caller holds (any object with
#: ``fileno()``, or an ``int`` fd), which is passed to santad as proof of
#: ownership, or the :class:`Cookie` of a socket that already has a rule set.
Target = _HasFileno | int | Cookie


@dataclass
class Health:
    """santad's answer to :meth:`Client.health`."""

    daemon: DaemonInfo  #: the daemon's state and the caller's quota and use
    counters: dict[str, int]  #: the rule processor's answer and pass counters


@dataclass
class Sample:
    """A miss sample: the first bytes of a request no rule answered."""

    socket: int  #: cookie of the socket the request was for
    data: bytes  #: the first bytes of the request's payload
    request_len: int  #: the request's full payload length


def socket_path(path: str | None = None) -> str:
    """The santad socket to use: ``path``, else ``$SANTA_SOCKET``, else the default."""
    return path or os.environ.get("SANTA_SOCKET") or DEFAULT_SOCKET


class Client:
    """A connection to santad.

    ``path`` is santad's Unix socket (default: ``$SANTA_SOCKET``, else
    ``/run/santa/santa.sock``); ``timeout`` (seconds) bounds every socket
    operation of a request, not the wait for miss samples (:meth:`subscribe`). Connecting raises :class:`OSError` (e.g.
    :class:`FileNotFoundError`, :class:`ConnectionRefusedError`) if santad is
    unreachable. Every method raises :class:`santa.Error` when santad refuses
    the request, :class:`santa.ProtocolError` when its answer is not valid,
    and :class:`OSError` when the connection fails.

    A client may be shared by threads; requests go one at a time. Use it as a
    context manager, or call :meth:`close`.

    A client outlives santad's restarts (santad keeps its rule sets across
    them). A request that meets a connection santad closed before reading
    it (the send fails with ``EPIPE`` or ``ECONNRESET`` and no answer
    follows) is sent once more, with the same seq, on a new connection to
    :attr:`path`; the caller sees only its result. An answer santad sent
    before closing (the ``QUOTA`` refusal of a connection past
    ``quota.connections``) is raised as it is, without a new connection. If
    the connection ends after the request was sent and before its answer,
    the request raises :class:`santa.OutcomeUnknownError` and is not sent
    again. A connection lost (or failed) in one request is replaced at the
    start of the next; if connecting fails (santad not running), the request
    raises :class:`OSError` (e.g. :class:`FileNotFoundError`) naming the lost
    connection, the path and the reason, and a later request tries again. A
    subscription is never reconnected (see :meth:`subscribe`).
    """

    def __init__(self, path: str | None = None, *, timeout: float | None = None) -> None:
        self.path = socket_path(path)
        self._timeout = timeout
        self._lock = threading.RLock()
        self._seq = 0
        self._subscribed = False
        self._closed = False
        self._sock: socket.socket | None = self._connect()

    def _connect(self) -> socket.socket:
        if len(os.fsencode(self.path)) > _MAX_PATH:  # connect would raise an OSError without errno
            raise OSError(errno.ENAMETOOLONG, f"santad socket path {self.path}: longer than {_MAX_PATH} bytes")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self._timeout)
        try:
            sock.connect(self.path)
        except OSError as e:
            sock.close()
            raise OSError(e.errno, f"connect to santad at {self.path}: {e.strerror or e} ({_dial_hint(e.errno)})") from e
        return sock

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection (and end a subscription on it)."""
        self._closed = True
        sock = self._sock
        if sock is not None:
            sock.close()

    # -- requests ----------------------------------------------------------

    def health(self) -> Health:
        """santad's state, the caller's uid, quota and use, and the global counters."""
        resp = self._call(Op.HEALTH)
        return Health(resp.daemon or DaemonInfo(), resp.counters)

    def bind(self, target: Target, sample_bytes: int = 0, sample_rate: int = 0) -> SocketInfo:
        """Give the socket ``target`` (a socket or fd, not a cookie) a rule set.

        Idempotent: binding a socket that has one returns it with ``created``
        false and updates its miss sampling if ``sample_bytes`` is given
        (request bytes per sample, at most 1472; ``sample_rate`` samples per
        second and CPU).
        """
        resp = self._call(Op.BIND, target, sample_bytes=sample_bytes, sample_rate=sample_rate)
        return self._one_socket(resp)

    def bind_pid(self, pid: int, fd: int, sample_bytes: int = 0, sample_rate: int = 0) -> SocketInfo:
        """(root) Give the socket behind fd ``fd`` of process ``pid`` a rule set."""
        # 0 is no pid on the wire (santad: "not found: process 0: invalid argument"), as Go's BindPID refuses
        if not (1 <= pid <= _MAX_PID and 0 <= fd <= _MAX_PID):
            raise ValueError(f"santad bind: pid {pid}, fd {fd}: want a process id from 1 and an fd from 0 (to {_MAX_PID})")
        resp = self._call(Op.BIND, pid=pid, fd=fd, sample_bytes=sample_bytes, sample_rate=sample_rate)
        return self._one_socket(resp)

    def bind_port(self, port: int, sample_bytes: int = 0, sample_rate: int = 0, *,
                  protocol: int = socket.IPPROTO_UDP) -> list[SocketInfo]:
        """(root) Give every UDP socket bound to ``port`` (v4 and v6, every
        member of a reuseport group) a rule set of its own; with ``protocol``
        ``socket.IPPROTO_TCP``, every TCP socket listening on ``port``."""
        # UDP goes without the key, which a santad without TCP support refuses
        proto = 0 if protocol == socket.IPPROTO_UDP else protocol
        return self._call(Op.BIND, port=port, protocol=proto, sample_bytes=sample_bytes,
                          sample_rate=sample_rate).sockets

    def unbind(self, target: Target) -> None:
        """Remove the socket's rule set and all its rules."""
        self._call(Op.UNBIND, target)

    def add(self, target: Target, rules: Sequence[Rule]) -> list[int]:
        """Add ``rules``, all or none; return their ids in order.

        A passed socket without a rule set is bound first.
        """
        return self._rule_ids(Op.ADD, target, rules)

    def replace(self, target: Target, rules: Sequence[Rule]) -> list[int]:
        """Swap all the socket's rules for ``rules`` (may be empty) in one step; return the new ids."""
        return self._rule_ids(Op.REPLACE, target, rules)

    def modify(self, target: Target, rules: Sequence[Rule]) -> None:
        """Change rules in place, all or none; each rule's ``id`` says which (and stays its id)."""
        self._rule_ids(Op.MODIFY, target, rules)

    def delete(self, target: Target, ids: Iterable[int]) -> None:
        """Delete the rules with these ids, all or none."""
        self._call(Op.DELETE, target, ids=list(ids))

    def list_sockets(self) -> list[SocketInfo]:
        """The rule sets the caller may see (root: all; others: their own)."""
        return self._call(Op.LIST_SOCKETS).sockets

    def delete_tagged(self, target: Target, tag: str) -> list[int]:
        """Delete every rule tagged ``tag``, all or none; return their ids (none if no rule has it)."""
        if not tag:
            raise ValueError("delete by tag: no tag given")
        return self._call(Op.DELETE, target, tag=tag).ids

    def list_rules(self, target: Target, tag: str = "") -> list[Rule]:
        """The socket's rules (only those tagged ``tag`` if given), with ``id`` and ``version``, oldest first.

        It asks in pages (:meth:`list_page`), so a rule set of any size can be
        listed: a rule added meanwhile may be listed or not, one deleted
        meanwhile may already be missing, every other rule is listed once.
        """
        rules: list[Rule] = []
        after, more = 0, True
        while more:
            page, more = self.list_page(target, tag=tag, after=after, limit=LIST_PAGE_RULES)
            rules += page
            if page:
                after = page[-1].id
        return rules

    def list_page(self, target: Target, *, tag: str = "", after: int = 0, limit: int = 0) -> tuple[list[Rule], bool]:
        """Up to ``limit`` (0: no limit) of the socket's rules tagged ``tag``
        ("": all) whose id is above ``after``, oldest first, and whether more
        follow: ask again with ``after`` the last id returned. santad may end a
        page early to keep it within the frame limit."""
        resp = self._call(Op.LIST_RULES, target, tag=tag, after=after, limit=limit)
        if resp.more and not resp.rules:
            raise ProtocolError("list_rules: santad says more rules follow but listed none")
        return resp.rules, resp.more

    def stats(self, target: Target, ids: Iterable[int] | None = None) -> list[RuleStats]:
        """Per-rule statistics of the rules ``ids`` (all the socket's rules if ``None`` or empty: the protocol cannot ask for none, as Go's ``Stats`` with no ids)."""
        return self._call(Op.STATS, target, ids=list(ids or ())).stats

    def subscribe(self, target: Target, sample_bytes: int, sample_rate: int) -> Iterator[Sample]:
        """Set the socket's miss sampling and stream its samples.

        After this call the connection carries only sample events: the
        returned iterator yields a :class:`Sample` per event and ends when the
        connection closes; other requests on this client raise
        :class:`RuntimeError`. The stream is not reconnected: when santad
        stops or restarts the iterator ends, and the caller subscribes again
        (on a new client). Close the client to unsubscribe (the socket's
        sampling returns to what bind set, or to the widest other subscribers
        ask for). Errors in the request itself are
        raised here, not on iteration.
        """
        with self._lock:  # no other request may slip in between
            seq = self._call(Op.SUBSCRIBE, target, sample_bytes=sample_bytes, sample_rate=sample_rate).seq
            self._subscribed = True
            # samples come only when requests miss: a quiet spell longer than
            # the timeout would end the iterator, and its stream, for good
            assert self._sock is not None
            self._sock.settimeout(None)
        return self._samples(seq)

    # -- plumbing ----------------------------------------------------------

    def _samples(self, seq: int) -> Iterator[Sample]:
        while True:
            try:
                event = self._recv()
            except OSError:
                if self._closed:  # the client was closed: the subscription ended
                    return
                raise
            if event is None:
                return
            if event.status != Status.OK:
                raise Error(event.status, event.error)
            if event.op != Op.SAMPLE or event.seq != seq:
                raise ProtocolError(f"subscription: unexpected message op {event.op} seq {event.seq} (want sample seq {seq})")
            yield Sample(event.socket, event.sample, event.request_len)

    def _rule_ids(self, op: Op, target: Target, rules: Sequence[Rule]) -> list[int]:
        rules = list(rules)
        ids = self._call(op, target, rules=rules).ids
        if len(ids) != len(rules):
            raise ProtocolError(f"{op.name.lower()}: santad returned {len(ids)} ids for {len(rules)} rules")
        return ids

    @staticmethod
    def _one_socket(resp: Message) -> SocketInfo:
        if len(resp.sockets) != 1:
            raise ProtocolError(f"bind: santad returned {len(resp.sockets)} sockets, want 1")
        return resp.sockets[0]

    def _call(self, op: Op, target: Target | None | _Untargeted = _UNTARGETED, **fields: object) -> Message:
        """Send a request about ``target`` (if it is about a socket) and return santad's successful response."""
        name = op.name.lower()
        fd, cookie = (None, 0) if isinstance(target, _Untargeted) else _resolve(target, name)
        if fd is not None:  # else sendmsg's EBADF reads as if the connection to santad were bad
            try:
                os.fstat(fd)
            except OSError as e:
                raise OSError(e.errno, f"santad {name}: the target fd {fd} is not open") from None
        with self._lock:
            if self._subscribed:
                raise RuntimeError("this connection carries sample events since subscribe(); use another Client")
            if self._closed:
                raise OSError(errno.EBADF, f"santad {name}: the client is closed")
            self._seq += 1
            request = Message(v=VERSION, op=op, seq=self._seq, socket=cookie, **fields)  # type: ignore[arg-type]
            if self._sock is None:  # lost in an earlier request
                self._redial(name, "")
            resp = self._exchange(request, fd)
            if isinstance(resp, OSError):
                # santad closed the connection before the request went out
                # (it restarted): it never saw it, so send it once more
                self._redial(name, f" ({resp.strerror or resp})")
                resp = self._exchange(request, fd)
                if isinstance(resp, OSError):
                    raise ConnectionError(errno.EPIPE, f"santad {name}: santad at {self.path} closed the new "
                                          "connection too before reading the request")
        answered = resp.seq == request.seq and resp.op == op
        # santad answers a request whose seq it could not read with seq 0: still this request's answer.
        if resp.status != Status.OK and (answered or resp.seq == 0):
            raise Error(resp.status, resp.error)
        if not answered:
            raise ProtocolError(f"{name}: response out of order (op {resp.op} seq {resp.seq}, want seq {request.seq})")
        if resp.v != VERSION:
            raise ProtocolError(f"{name}: response speaks protocol version {resp.v}, want {VERSION}")
        return resp

    def _exchange(self, request: Message, fd: int | None) -> Message | OSError:
        """Send ``request`` and read its answer; the caller holds the lock.

        Returns the send's error if santad had closed the connection before
        the request went out and no answer was waiting (santad never saw the
        request). Raises :class:`OutcomeUnknownError` if the connection ended
        after the request went out. Either way, and on any other failure of
        the connection, the connection is dropped: the next request makes a
        new one.
        """
        name = Op(request.op).name.lower()
        sock = self._sock
        assert sock is not None
        try:
            try:
                send_message(sock, request, fd)
            except (BrokenPipeError, ConnectionResetError) as e:
                # santad closed the connection, perhaps refusing it with an
                # answer first (quota.connections): read it, it says why
                try:
                    resp = self._recv(sock)
                except (ConnectionResetError, TruncatedFrame):
                    resp = None
                self._drop()
                if resp is None:  # the frame never went out whole
                    return e
                return resp
            try:
                resp = self._recv(sock)
            except (ConnectionResetError, TruncatedFrame) as e:
                resp, why = None, str(e)
            else:
                why = "end of file"
            if resp is None:
                raise OutcomeUnknownError(
                    f"santad {name}: santad closed the connection before answering ({why}): the outcome is "
                    "unknown, santad may or may not have carried the request out; the next request connects again")
            return resp
        except OSError:
            self._drop()  # a frame may be half sent or half read: the stream is lost
            raise

    def _drop(self) -> None:
        """Close the connection; the next request makes a new one."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()

    def _redial(self, name: str, lost: str) -> None:
        """Replace the lost connection with a new one to :attr:`path`; the caller holds the lock."""
        try:
            sock = self._connect()
        except OSError as e:
            raise OSError(e.errno, f"santad {name}: the connection to santad at {self.path} was lost{lost} and "
                          f"connecting again failed: {os.strerror(e.errno) if e.errno else e} "
                          f"({_dial_hint(e.errno)})") from e
        self._sock = sock
        if self._closed:  # closed meanwhile by another thread
            self._drop()
            raise OSError(errno.EBADF, f"santad {name}: the client is closed")

    def _recv(self, sock: socket.socket | None = None) -> Message | None:
        """The next message on ``sock`` (the client's connection if ``None``),
        or ``None`` if santad closed the connection."""
        try:
            message, fds = recv_message(sock or self._sock)  # type: ignore[arg-type]
        except EOFError:
            return None
        for fd in fds:  # santad passes no fds to clients
            os.close(fd)
        return message


#: The largest process id and fd number (Linux's are C ints).
_MAX_PID = 2**31 - 1

#: The longest path a Unix socket address holds (sun_path, less its NUL).
_MAX_PATH = 107


def _dial_hint(err: int | None) -> str:
    """Why connecting to santad's socket may have failed."""
    if err == errno.EACCES:  # santad may be running, but not for this user
        return "santad's socket_mode and socket_group decide who may connect"
    return "is santad running?"


def _resolve(target: Target | None, name: str) -> tuple[int | None, int]:
    """Split the target of request ``name`` into the fd to pass and the
    cookie to name (0 for none); refuse one that names no socket, as the C
    and Go clients do (docs/api.md "Targets")."""
    if isinstance(target, bool):
        raise TypeError("target must be a socket, an fd or a santa.Cookie, not a bool")
    fd, cookie = None, 0
    if isinstance(target, Cookie):
        cookie = target.value
    elif isinstance(target, int):
        fd = target
    elif callable(getattr(target, "fileno", None)):
        fd = target.fileno()
    elif target is not None:
        raise TypeError(f"target must be a socket, an fd or a santa.Cookie, not {type(target).__name__}")
    if fd is not None and fd >= 0:
        return fd, 0
    if name == "bind":  # a Cookie is a target of another kind
        refusal = TypeError if isinstance(target, Cookie) else ValueError
        raise refusal("santad bind: no target socket: bind needs the socket's fd (a cookie names a rule set that exists)")
    if fd is not None or cookie == 0:
        raise ValueError(f"santad {name}: no target socket: pass the socket's fd or name its cookie")
    return None, cookie
