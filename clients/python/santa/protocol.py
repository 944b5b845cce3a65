"""Santa's control protocol, version 1: its messages and their CBOR encoding.

``docs/protocol.md`` in the Santa repository is the specification and
``api/`` the Go reference implementation; ``testdata/protocol/vectors.json``
holds the byte-exact examples this module is tested against.

Every message is one CBOR map with small unsigned integer keys. A key whose
value is zero, empty or false is omitted and a missing key reads as zero.
:func:`encode` produces the core deterministic encoding (RFC 8949 §4.2.1), so
it writes exactly the bytes the Go encoder writes. :func:`decode` is strict:
duplicate keys, indefinite lengths, tags, floats, negative integers, simple
values other than true/false, a wrong type (including bool for an integer and
text for bytes, or the reverse) and trailing bytes are all refused with
:class:`ProtocolError`; keys it does not know, which a newer santad may add,
are skipped with their values.
"""

from __future__ import annotations

import dataclasses
import enum
import errno
import ipaddress
from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar

import cbor2

__all__ = [
    "VERSION", "DEFAULT_SOCKET", "MAX_FRAME", "Op", "Status", "Error", "ProtocolError",
    "OutcomeUnknownError",
    "Condition", "Put", "Copy", "Processor", "Guard", "Rule", "SocketInfo", "RuleStats",
    "Interface", "DaemonInfo", "Message", "encode", "decode",
]

#: The protocol version this module speaks.
VERSION = 1
#: Where santad listens unless told otherwise.
DEFAULT_SOCKET = "/run/santa/santa.sock"
#: The largest CBOR message either side accepts, in bytes.
MAX_FRAME = 256 << 20

_T = TypeVar("_T")

# Decoder limits, as in the Go decoder (api/codec.go).
_MAX_DEPTH = 8
_MAX_MAP_PAIRS = 4096


class Op(enum.IntEnum):
    """What a request asks for, or that a message is an event."""

    HEALTH = 1
    BIND = 2
    UNBIND = 3
    ADD = 4
    REPLACE = 5
    MODIFY = 6
    DELETE = 7
    LIST_SOCKETS = 8
    LIST_RULES = 9
    STATS = 10
    SUBSCRIBE = 11
    SAMPLE = 12


class Status(enum.IntEnum):
    """A response's outcome; every non-zero status comes with an error text."""

    OK = 0
    MALFORMED = 1  #: not a valid frame or message of this protocol
    INVALID = 2  #: a value is refused, e.g. an invalid rule
    PERMISSION = 3  #: permission denied
    NOT_FOUND = 4  #: no rule set for that socket, no such rule
    QUOTA = 5  #: the caller's uid would exceed its quota
    FULL = 6  #: the data plane has no room
    VERSION = 7  #: unsupported protocol version
    INTERNAL = 8  #: santad failed; its log says why
    UNSUPPORTED = 9  #: unknown op


_STATUS_TEXT: dict[int, str] = {
    Status.OK: "ok", Status.MALFORMED: "malformed", Status.INVALID: "invalid",
    Status.PERMISSION: "permission denied", Status.NOT_FOUND: "not found",
    Status.QUOTA: "quota exceeded", Status.FULL: "full", Status.VERSION: "version",
    Status.INTERNAL: "internal", Status.UNSUPPORTED: "unsupported",
}


class Error(Exception):
    """A failure status: santad's refusal of a request, or a protocol violation.

    ``status`` is a :class:`Status` (a plain ``int`` for a status this module
    does not know) and ``message`` the explanation, usually santad's own
    ``error`` text naming the field and the limit.
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)
        self.status: int = Status(status) if status in _STATUS_TEXT else status
        self.message = message

    def __str__(self) -> str:
        name = _STATUS_TEXT.get(self.status, f"status {int(self.status)}")
        return f"{name}: {self.message}" if self.message else name


class ProtocolError(Error):
    """A frame or message that is not valid in this protocol (status ``MALFORMED``)."""

    def __init__(self, message: str) -> None:
        super().__init__(Status.MALFORMED, message)


class OutcomeUnknownError(Error, ConnectionError):
    """santad closed the connection after the request was sent and before its
    answer: santad may or may not have carried the request out (it stopped
    or crashed meanwhile).

    The client does not send the request again, and its next request
    connects anew. Find out what happened (e.g. list the rules) before you
    repeat a request that must not be done twice, such as an add. A
    :class:`ConnectionError` too (``errno`` ``ECONNRESET``); ``status`` is
    ``INTERNAL``.
    """

    def __init__(self, message: str) -> None:
        super().__init__(Status.INTERNAL, message)
        self.errno = errno.ECONNRESET
        self.strerror = message

    def __str__(self) -> str:
        return self.message


# ---------------------------------------------------------------------------
# Field codecs: how one field's value maps to its CBOR value and back.


class _Codec:
    """Converts a field's Python value to its CBOR value and back, with checks."""

    def empty(self, value: Any) -> bool:
        """Whether the value is omitted from its map (zero, empty, false, None)."""
        return not value

    def encode(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def decode(self, wire: Any, path: str) -> Any:
        raise NotImplementedError


def _type_name(value: Any) -> str:
    return {bool: "bool", int: "integer", bytes: "bytes", str: "text", list: "array",
            dict: "map"}.get(type(value), type(value).__name__)


class _UInt(_Codec):
    def __init__(self, bits: int) -> None:
        self.limit = 1 << bits

    def encode(self, value: Any, path: str) -> int:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{path}: want an unsigned integer, got {_type_name(value)}")
        if not 0 <= value < self.limit:
            raise ValueError(f"{path}: {value} is out of range 0..{self.limit - 1}")
        return int(value)

    def decode(self, wire: Any, path: str) -> int:
        if type(wire) is not int:
            raise ProtocolError(f"{path}: want an unsigned integer, got {_type_name(wire)}")
        if not 0 <= wire < self.limit:
            raise ProtocolError(f"{path}: {wire} is out of range 0..{self.limit - 1}")
        return wire


class _Scalar(_Codec):
    """A value of one exact Python type: bool, text or bytes."""

    def __init__(self, kind: type, name: str, accept: tuple[type, ...] = ()) -> None:
        self.kind, self.name, self.accept = kind, name, (kind, *accept)

    def encode(self, value: Any, path: str) -> Any:
        if type(value) not in self.accept:
            raise TypeError(f"{path}: want {self.name}, got {_type_name(value)}")
        if self.kind is str:
            try:  # a lone surrogate (e.g. os.fsdecode of bytes that are not UTF-8) has no UTF-8 form
                value.encode()
            except UnicodeEncodeError as e:
                raise ValueError(f"{path}: {value!r} is not UTF-8 text ({e.reason} at {e.start})") from None
        return self.kind(value)

    def decode(self, wire: Any, path: str) -> Any:
        if type(wire) is not self.kind:
            raise ProtocolError(f"{path}: want {self.name}, got {_type_name(wire)}")
        return wire


_BOOL = _Scalar(bool, "bool")
_TEXT = _Scalar(str, "text")
_BYTES = _Scalar(bytes, "bytes", (bytearray, memoryview))
_U16, _U32, _U64 = _UInt(16), _UInt(32), _UInt(64)


class _List(_Codec):
    def __init__(self, item: _Codec) -> None:
        self.item = item

    def encode(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise TypeError(f"{path}: want a list, got {_type_name(value)}")
        return [self.item.encode(v, f"{path}[{i}]") for i, v in enumerate(value)]

    def decode(self, wire: Any, path: str) -> list[Any]:
        if type(wire) is not list:
            raise ProtocolError(f"{path}: want an array, got {_type_name(wire)}")
        return [self.item.decode(v, f"{path}[{i}]") for i, v in enumerate(wire)]


class _TextMap(_Codec):
    """A map from text to unsigned integers (health counters); zero values stay."""

    def encode(self, value: Any, path: str) -> dict[str, int]:
        if not isinstance(value, dict):
            raise TypeError(f"{path}: want a dict, got {_type_name(value)}")
        return {_TEXT.encode(k, f"{path} key"): _U64.encode(v, f"{path}[{k!r}]") for k, v in value.items()}

    def decode(self, wire: Any, path: str) -> dict[str, int]:
        if type(wire) is not dict:
            raise ProtocolError(f"{path}: want a map, got {_type_name(wire)}")
        return {_TEXT.decode(k, f"{path} key"): _U64.decode(v, f"{path}[{k!r}]") for k, v in wire.items()}


class _Struct(_Codec, Generic[_T]):
    """A dataclass whose fields carry their map key and codec (see :func:`_key`)."""

    def __init__(self, cls: type[_T]) -> None:
        self.cls = cls
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # cls is a dataclass
        self.fields = {f.metadata["key"]: f for f in fields if "key" in f.metadata}

    def empty(self, value: Any) -> bool:
        return value is None  # a present struct is written even when all its fields are zero

    def encode(self, value: Any, path: str) -> dict[int, Any]:
        if not isinstance(value, self.cls):
            raise TypeError(f"{path}: want {self.cls.__name__}, got {_type_name(value)}")
        out = {}
        for key, f in self.fields.items():
            v = getattr(value, f.name)
            codec: _Codec = f.metadata["codec"]
            if not codec.empty(v):
                out[key] = codec.encode(v, f"{path}.{f.name}")
        return out

    def decode(self, wire: Any, path: str) -> _T:
        if type(wire) is not dict:
            raise ProtocolError(f"{path}: want a map, got {_type_name(wire)}")
        kwargs = {}
        for key, v in wire.items():
            if type(key) is not int:
                raise ProtocolError(f"{path}: key {key!r} is not an unsigned integer")
            f = self.fields.get(key)
            if f is None:
                continue  # a key of a later version: skipped with its value
            kwargs[f.name] = f.metadata["codec"].decode(v, f"{path}.{f.name}")
        return self.cls(**kwargs)


class _ProcessorCodec(_Codec):
    """A processor map: key 0 is the kind, which selects :class:`Put` or :class:`Copy`."""

    def __init__(self, *classes: type[Put] | type[Copy]) -> None:
        self.by_kind: dict[int, _Struct[Any]] = {cls.KIND: _Struct(cls) for cls in classes}

    def encode(self, value: Any, path: str) -> dict[int, Any]:
        struct = self.by_kind.get(getattr(type(value), "KIND", 0))
        if struct is None or type(value) is not struct.cls:
            raise TypeError(f"{path}: want Put or Copy, got {_type_name(value)}")
        return {0: value.KIND, **struct.encode(value, path)}

    def decode(self, wire: Any, path: str) -> Any:
        if type(wire) is not dict:
            raise ProtocolError(f"{path}: want a map, got {_type_name(wire)}")
        rest = dict(wire)  # keys are ints or text (see _scan), so 0 is only ever the int key 0
        kind = _U32.decode(rest.pop(0, 0), f"{path}.kind")
        struct = self.by_kind.get(kind)
        if struct is None:
            raise ProtocolError(f"{path}: unknown processor kind {kind}")
        return struct.decode(rest, path)


def _key(key: int, codec: _Codec, default: Any = None, *, factory: Any = None) -> Any:
    """A dataclass field stored under map key ``key`` and converted by ``codec``."""
    meta = {"key": key, "codec": codec}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


# ---------------------------------------------------------------------------
# The protocol's objects.


@dataclass
class Condition:
    """Holds when the request payload carries ``pattern`` at ``offset``.

    With a ``mask`` (one byte per pattern byte) only the request bits set in
    it are compared; the pattern must have no bits outside it. A rule needs a
    condition whose first byte is compared in full (no mask, or mask byte
    0xff): santad finds rules by hashing such bytes.
    """

    offset: int = _key(0, _U32, 0)
    pattern: bytes = _key(1, _BYTES, b"")
    mask: bytes = _key(2, _BYTES, b"")


@dataclass
class Put:
    """A processor that writes ``template`` into the reply at ``reply_offset``."""

    KIND: ClassVar[int] = 1
    reply_offset: int = _key(1, _U32, 0)
    template: bytes = _key(2, _BYTES, b"")


@dataclass
class Copy:
    """A processor that copies ``length`` request bytes from ``src_offset`` to ``reply_offset``.

    With a ``mask`` (``length`` bytes, at most 8) only the request bits set in
    it are copied; the reply's other bits keep what earlier puts wrote (or
    zero). santad refuses a masked copy that would mix its bits into reply
    bytes an earlier copy wrote (mask bytes 0xff overwrite them whole).
    """

    KIND: ClassVar[int] = 2
    reply_offset: int = _key(1, _U32, 0)
    src_offset: int = _key(3, _U32, 0)
    length: int = _key(4, _U32, 0)
    mask: bytes = _key(5, _BYTES, b"")


#: A processor: one step that writes part of the reply.
Processor = Put | Copy


@dataclass
class Guard:
    """Holds while slot ``slot`` (below 2**20) of santad's guard map holds ``version``.

    The guard map belongs to write trackers (e.g. ``santa memcached``'s): they
    bump the slots of what a write changes, so a rule built from a value read
    before the write stops answering.
    """

    slot: int = _key(0, _U32, 0)
    version: int = _key(1, _U64, 0)


@dataclass
class Rule:
    """A rule: when all ``conditions`` hold, the reply of ``reply_len`` bytes is
    built by running ``processors`` in order (bytes none writes are zero).

    Of several matching rules the lowest ``priority`` wins, then the oldest.
    ``id`` names the rule in modify requests and in responses; ``version`` is
    set by santad (1 when added, +1 per modify). A request (UDP payload)
    shorter than ``min_len`` or longer than ``max_len`` does not match the
    rule; 0 is no bound. The rule answers only while all its ``guards`` (at
    most 2) hold; a request it would answer otherwise goes to the application.
    ``close`` (TCP only: santad refuses it for a UDP socket's rules) makes the
    reply end the connection: it goes out with FIN. ``expires`` (Unix time in
    seconds, 0 = never) is when santad removes the rule by itself, e.g. when
    the answer's TTL runs out; from then on the rule never answers, even
    while santad is not running. ``tag`` (at most 64 bytes of UTF-8 without
    control characters, "" = none) says who added the rule, e.g.
    ``"santa-dns"``: a program started anew finds its predecessor's rules
    in :meth:`Client.list_rules` by it.
    """

    conditions: list[Condition] = _key(2, _List(_Struct(Condition)), factory=list)
    processors: list[Processor] = _key(3, _List(_ProcessorCodec(Put, Copy)), factory=list)
    reply_len: int = _key(4, _U32, 0)
    priority: int = _key(5, _U32, 0)
    id: int = _key(0, _U64, 0)
    version: int = _key(1, _U32, 0)
    min_len: int = _key(6, _U32, 0)
    max_len: int = _key(7, _U32, 0)
    guards: list[Guard] = _key(8, _List(_Struct(Guard)), factory=list)
    close: bool = _key(9, _BOOL, False)
    expires: int = _key(10, _U64, 0)
    tag: str = _key(11, _TEXT, "")


@dataclass
class SocketInfo:
    """A socket that has a rule set, as santad describes it."""

    cookie: int = _key(0, _U64, 0)  #: the socket's SO_COOKIE
    family: int = _key(1, _U32, 0)  #: 4 or 6
    protocol: int = _key(2, _U32, 0)  #: IP protocol number: 17 UDP, 6 TCP (a listening socket)
    address: bytes = _key(3, _BYTES, b"")  #: bound address, 4 or 16 bytes; zeros for a wildcard
    port: int = _key(4, _U16, 0)
    owner: int = _key(5, _U32, 0)  #: uid that bound it
    rules: int = _key(6, _U64, 0)
    template_bytes: int = _key(7, _U64, 0)
    hits: int = _key(8, _U64, 0)  #: answers of all its rules
    created: bool = _key(9, _BOOL, False)  #: bind: this request created the rule set
    pid: int = _key(10, _U32, 0)  #: process santad took the socket from, if known
    reply_bytes: int = _key(11, _U64, 0)  #: reply frame bytes all its rules sent

    @property
    def ip(self) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
        """The bound address as an :mod:`ipaddress` object."""
        return ipaddress.ip_address(self.address)


@dataclass
class RuleStats:
    """What one rule answered."""

    id: int = _key(0, _U64, 0)
    hits: int = _key(1, _U64, 0)  #: requests answered
    bytes: int = _key(2, _U64, 0)  #: reply frame bytes sent


@dataclass
class Interface:
    """An interface the rule processor is attached to."""

    name: str = _key(0, _TEXT, "")
    mode: str = _key(1, _TEXT, "")  #: "native", "generic" or "removed"
    #: a veth's (native mode) other end's XDP program, e.g. "veth1: XDP program 12 (santa_peer_pass)"
    peer: str = _key(2, _TEXT, "")


@dataclass
class DaemonInfo:
    """santad's state and the caller's quota, as health reports them."""

    version: str = _key(0, _TEXT, "")
    protocol: int = _key(1, _U32, 0)
    pid: int = _key(2, _U32, 0)
    uptime_seconds: int = _key(3, _U64, 0)
    interfaces: list[Interface] = _key(4, _List(_Struct(Interface)), factory=list)
    sockets: int = _key(5, _U64, 0)
    rules: int = _key(6, _U64, 0)
    max_rules: int = _key(7, _U64, 0)
    data_bytes: int = _key(8, _U64, 0)
    max_data_bytes: int = _key(9, _U64, 0)
    uid: int = _key(10, _U32, 0)  #: the caller, as santad sees it
    quota_rules: int = _key(11, _U64, 0)  #: 0 = unlimited
    quota_bytes: int = _key(12, _U64, 0)  #: 0 = unlimited
    used_rules: int = _key(13, _U64, 0)
    used_bytes: int = _key(14, _U64, 0)
    quota_rulesets: int = _key(15, _U64, 0)  #: rule sets the caller may bind; 0 = unlimited
    used_rulesets: int = _key(16, _U64, 0)  #: rule sets the caller holds


@dataclass
class Message:
    """Every request, response and event: one map from one key space."""

    v: int = _key(0, _U64, 0)
    op: int = _key(1, _U64, 0)
    seq: int = _key(2, _U64, 0)
    status: int = _key(3, _U64, 0)
    error: str = _key(4, _TEXT, "")
    socket: int = _key(5, _U64, 0)  #: socket cookie
    pid: int = _key(6, _U32, 0)
    fd: int = _key(7, _U32, 0)
    port: int = _key(8, _U16, 0)
    rules: list[Rule] = _key(9, _List(_Struct(Rule)), factory=list)
    ids: list[int] = _key(10, _List(_U64), factory=list)
    sockets: list[SocketInfo] = _key(11, _List(_Struct(SocketInfo)), factory=list)
    stats: list[RuleStats] = _key(12, _List(_Struct(RuleStats)), factory=list)
    sample_bytes: int = _key(13, _U32, 0)
    sample_rate: int = _key(14, _U32, 0)
    sample: bytes = _key(15, _BYTES, b"")
    daemon: DaemonInfo | None = _key(16, _Struct(DaemonInfo), None)
    counters: dict[str, int] = _key(17, _TextMap(), factory=dict)
    request_len: int = _key(18, _U32, 0)
    protocol: int = _key(19, _U32, 0)  #: bind by port: 17 UDP (also 0) or 6 TCP
    after: int = _key(20, _U64, 0)  #: list_rules: only rules with a larger id
    limit: int = _key(21, _U32, 0)  #: list_rules: at most this many rules (0: all)
    more: bool = _key(22, _BOOL, False)  #: list_rules response: rules past the last listed one remain
    tag: str = _key(23, _TEXT, "")  #: list_rules: only rules with this tag; delete: every rule with it


_MESSAGE = _Struct(Message)


def encode(message: Message) -> bytes:
    """Return the message's deterministic CBOR encoding, without a frame header.

    Raises :class:`TypeError` or :class:`ValueError` for a field of the wrong
    type or out of its range, naming the field.
    """
    return cbor2.dumps(_MESSAGE.encode(message, "message"), canonical=True)


def decode(data: bytes) -> Message:
    """Parse one message; ``data`` must hold exactly one CBOR map of this protocol.

    Raises :class:`ProtocolError` for anything else.
    """
    _check_structure(data)
    try:
        wire = cbor2.loads(data)
    except (cbor2.CBORDecodeError, ValueError, OverflowError) as e:
        raise ProtocolError(f"not valid CBOR: {e}") from None
    if type(wire) is not dict:
        raise ProtocolError(f"message: want a map, got {_type_name(wire)}")
    return _MESSAGE.decode(wire, "message")


# ---------------------------------------------------------------------------
# Structural pre-scan. cbor2 silently accepts duplicate keys (the last wins),
# indefinite lengths and tags (some of which it turns into ints or dates), and
# it merges the keys false and 0, so the raw bytes are checked against the
# protocol's subset of CBOR first: unsigned integers, byte and text strings,
# arrays, maps keyed by unsigned integers or text, true and false.


def _check_structure(data: bytes) -> None:
    view = memoryview(data)
    end = _scan(view, 0, 0)
    if end != len(view):
        raise ProtocolError(f"trailing bytes after the message: {len(view) - end}")


def _head(data: memoryview, pos: int) -> tuple[int, int, int, int]:
    """Read the item head at ``pos``: (major type, additional info, argument, next pos)."""
    if pos >= len(data):
        raise ProtocolError("truncated message")
    major, info = data[pos] >> 5, data[pos] & 0x1F
    pos += 1
    if info < 24:
        return major, info, info, pos
    if info == 31:
        raise ProtocolError("indefinite length")
    if info > 27:
        raise ProtocolError(f"reserved additional information {info}")
    size = 1 << (info - 24)
    if pos + size > len(data):
        raise ProtocolError("truncated message")
    return major, info, int.from_bytes(data[pos:pos + size], "big"), pos + size


def _scan(data: memoryview, pos: int, depth: int) -> int:
    """Check the item at ``pos`` and everything in it; return the position after it."""
    major, info, arg, pos = _head(data, pos)
    if major == 0:
        return pos
    if major in (2, 3):
        if arg > len(data) - pos:
            raise ProtocolError("truncated message")
        return pos + arg
    if major == 4:
        _check_container(data, pos, depth, arg)
        for _ in range(arg):
            pos = _scan(data, pos, depth + 1)
        return pos
    if major == 5:
        _check_container(data, pos, depth, 2 * arg)
        if arg > _MAX_MAP_PAIRS:
            raise ProtocolError(f"map of {arg} pairs (at most {_MAX_MAP_PAIRS})")
        keys: set[Any] = set()
        for _ in range(arg):
            key_major, _, key_arg, key_pos = _head(data, pos)
            if key_major not in (0, 3):
                raise ProtocolError("map key is neither an unsigned integer nor text")
            end = _scan(data, pos, depth + 1)
            key = key_arg if key_major == 0 else bytes(data[key_pos:end])
            if key in keys:
                raise ProtocolError(f"duplicate map key {key!r}")
            keys.add(key)
            pos = _scan(data, end, depth + 1)
        return pos
    if major == 1:
        raise ProtocolError("negative integer")
    if major == 6:
        raise ProtocolError("tags are not allowed")
    if info in (20, 21):  # false, true
        return pos
    if info in (25, 26, 27):
        raise ProtocolError("floats are not allowed")
    raise ProtocolError("simple values other than true and false are not allowed")


def _check_container(data: memoryview, pos: int, depth: int, items: int) -> None:
    if depth >= _MAX_DEPTH:
        raise ProtocolError(f"nested deeper than {_MAX_DEPTH} levels")
    if items > len(data) - pos:  # every item takes at least one byte
        raise ProtocolError("truncated message")
