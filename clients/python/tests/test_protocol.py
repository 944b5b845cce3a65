"""The codec against the shared vectors, and the strict decoder's refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import types
import typing

import pytest

from santa import protocol
from santa.protocol import (
    Condition, Copy, DaemonInfo, Guard, Message, ProtocolError, Put, Rule, SocketInfo, Status, decode, encode,
)

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "testdata" / "protocol" / "vectors.json"


def from_json(tp: typing.Any, value: typing.Any) -> typing.Any:
    """Build a value of type ``tp`` from a vector's JSON (byte strings as hex).

    Driven by the dataclasses' type hints and field names only, so it checks
    the codec's key numbers independently of them.
    """
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        members = [t for t in typing.get_args(tp) if t is not type(None)]
        if members == [Put, Copy]:
            return from_json(Put if value.pop("kind") == Put.KIND else Copy, value)
        (tp,) = members
        return from_json(tp, value)
    if origin is list:
        (item,) = typing.get_args(tp)
        return [from_json(item, v) for v in value]
    if origin is dict:
        return dict(value)
    if tp is bytes:
        return bytes.fromhex(value)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        names = {f.name for f in dataclasses.fields(tp)}
        assert set(value) <= names, f"{tp.__name__}: JSON names {set(value) - names} are no fields"
        return tp(**{k: from_json(hints[k], v) for k, v in value.items()})
    assert type(value) is tp, f"want {tp}, got {value!r}"
    return value


def load_vectors() -> list[dict[str, typing.Any]]:
    return json.loads(VECTORS.read_text())


@pytest.mark.parametrize("vector", load_vectors(), ids=lambda v: v["name"])
def test_vector_encodes_exactly(vector: dict[str, typing.Any]) -> None:
    message = from_json(Message, vector["message"])
    assert encode(message).hex() == vector["cbor"]


@pytest.mark.parametrize("vector", load_vectors(), ids=lambda v: v["name"])
def test_vector_decodes_exactly(vector: dict[str, typing.Any]) -> None:
    assert decode(bytes.fromhex(vector["cbor"])) == from_json(Message, vector["message"])


def test_vectors_cover_every_op() -> None:
    assert {v["message"]["op"] for v in load_vectors()} == set(protocol.Op)


@pytest.mark.parametrize("hexmsg, why", [
    # api/vectors_test.go TestDecodeRefuses
    ("a200010002", "duplicate map key 0"),  # duplicate key: {0:1, 0:2}
    ("83010203", "want a map, got array"),  # not a map: [1,2,3]
    ("a1000100", "trailing bytes"),  # trailing bytes: {0:1} 0
    ("bf0001ff", "indefinite length"),  # indefinite map: {_ 0:1}
    ("a12001", "map key is neither"),  # negative key: {-1:1}
    ("a1016161", "want an unsigned integer, got text"),  # text where uint: {1:"a"}
    ("a100c11a5f5e1000", "tags are not allowed"),  # tag: {0: 1(...)}
    ("a2000101", "truncated message"),  # truncated
    ("", "truncated message"),  # empty
    # and more
    ("a10981a10901", "want bool, got integer"),  # close as an integer: rules[0] = {9: 1}
    ("a20001180001", "duplicate map key 0"),  # duplicate key in a non-shortest encoding: {0:1, 0:1}
    ("a100f5", "want an unsigned integer, got bool"),  # bool where uint: {0: true}
    ("a10b81a10901", "want bool, got integer"),  # uint where bool: sockets[0].created = 1
    ("a10f6161", "want bytes, got text"),  # text where bytes: {15: "a"}
    ("a1044161", "want text, got bytes"),  # bytes where text: {4: h'61'}
    ("a100f93c00", "floats are not allowed"),  # half float
    ("a100fb3ff0000000000000", "floats are not allowed"),  # double float
    ("a100f6", "simple values other than true and false"),  # null
    ("a100f7", "simple values other than true and false"),  # undefined
    ("a10020", "negative integer"),  # negative value
    ("a100c24101", "tags are not allowed"),  # bignum tag (cbor2 would turn it into an int)
    ("a1005f4101ff", "indefinite length"),  # indefinite byte string
    ("a10a9f01ff", "indefinite length"),  # indefinite array
    ("a1f401", "map key is neither"),  # key false (cbor2 would merge it with key 0)
    ("a1616101", "key 'a' is not an unsigned integer"),  # text key
    ("a1001c", "reserved additional information 28"),  # reserved additional information
    ("a1001a0000", "truncated message"),  # truncated argument
    ("a10f45010203", "truncated message"),  # byte string longer than the data
    ("a10a9a00010000", "truncated message"),  # array longer than the data
    ("a1081a00010000", "65536 is out of range"),  # port 65536 overflows uint16
    ("a1061b0000000100000000", "4294967296 is out of range"),  # pid 2^32 overflows uint32
    ("a10981a10381a10003", "unknown processor kind 3"),  # processor kind 3
    ("a10981a10881a1001b0000000100000000", "4294967296 is out of range"),  # guard slot 2^32 overflows uint32
    ("a1118101", "want a map, got array"),  # counters is an array
    ("a111a1016100", "want text, got integer"),  # counters keyed by uint
    ("a111a2616100616100", "duplicate map key b'a'"),  # counters with a duplicate text key
    ("a110a104818181818181818100", "nested deeper than 8 levels"),  # nested deeper than 8 levels
])
def test_decode_refuses(hexmsg: str, why: str) -> None:
    with pytest.raises(ProtocolError, match=why) as info:
        decode(bytes.fromhex(hexmsg))
    assert info.value.status == Status.MALFORMED


SKIPPED_KEYS = VECTORS.with_name("skipped_keys.json")


@pytest.mark.parametrize("vector", json.loads(SKIPPED_KEYS.read_text()), ids=lambda v: v["name"])
def test_decode_skips_keys_of_later_versions(vector: dict[str, typing.Any]) -> None:
    assert decode(bytes.fromhex(vector["cbor"])) == from_json(Message, vector["message"])


@pytest.mark.parametrize("hexmsg, want", [
    ("a2000118ff01", Message(v=1)),  # {0:1, 255:1}
    ("a10981a10c01", Message(rules=[Rule()])),  # rules[0] = {12: 1}
    ("a10981a10381a200010301", Message(rules=[Rule(processors=[Put()])])),  # a put with a copy's src_offset
    ("a10981a10881a10241ff", Message(rules=[Rule(guards=[Guard()])])),  # a guard with a key 2
])
def test_decode_skips_unknown_keys(hexmsg: str, want: Message) -> None:
    assert decode(bytes.fromhex(hexmsg)) == want


def test_decode_keeps_zero_counters_and_empty_structs() -> None:
    assert decode(bytes.fromhex("a210a011a1616100")) == Message(daemon=DaemonInfo(), counters={"a": 0})


def test_daemon_info_has_the_ruleset_quota() -> None:
    # {16: {15: 64, 16: 2}}: santad's health with quota.rulesets 64, 2 bound
    msg = decode(bytes.fromhex("a110a20f18401002"))
    assert msg.daemon == DaemonInfo(quota_rulesets=64, used_rulesets=2)
    assert encode(msg) == bytes.fromhex("a110a20f18401002")


def test_zero_values_are_omitted() -> None:
    assert encode(Message()) == b"\xa0"
    rule = Rule([Condition(0, b"x")], [Copy(0, 0, 0)], reply_len=1)
    assert encode(Message(rules=[rule])).hex() == "a10981a30281a1014178" "0381a10002" "0401"


def test_encode_accepts_bytes_like_and_enums() -> None:
    message = Message(v=1, op=protocol.Op.ADD, sample=bytearray(b"ab"))
    assert decode(encode(message)) == Message(v=1, op=4, sample=b"ab")


@pytest.mark.parametrize("message, error", [
    (Message(rules=[Rule([Condition(0, "Hello")], [Put(0, b"x")], 1)]), TypeError),  # text pattern
    (Message(rules=[Rule([Condition(-1, b"x")], [Put(0, b"x")], 1)]), ValueError),
    (Message(rules=[Rule([Condition(0, b"x")], [Put(0, b"x")], 1 << 32)]), ValueError),
    (Message(rules=[Rule([Condition(0, b"x")], ["put"], 1)]), TypeError),
    (Message(rules=[Rule([Condition(0, b"x")], [Put(0, b"x")], True)]), TypeError),
    (Message(port=65536), ValueError),
    (Message(rules=[Rule([Condition(0, b"x")], [Put(0, b"x")], 1, guards=[Guard(0, 1 << 64)])]), ValueError),
    (Message(rules=[Rule([Condition(0, b"x")], [Put(0, b"x")], 1, guards=[(0, 1)])]), TypeError),
    (Message(sockets=[SocketInfo(created=1)]), TypeError),
    (Message(error=b"x"), TypeError),
    (Message(rules=[Condition(0, b"x")]), TypeError),
])
def test_encode_refuses(message: Message, error: type[Exception]) -> None:
    with pytest.raises(error):
        encode(message)


def test_encode_refuses_text_that_is_not_utf8() -> None:
    with pytest.raises(ValueError, match=r"message\.rules\[0\]\.tag: .* is not UTF-8"):
        encode(Message(rules=[Rule([Condition(0, b"x")], [Put(0, b"x")], 1, tag=os.fsdecode(b"santa\xffdns"))]))


def test_error_text() -> None:
    assert str(protocol.Error(3, "uid 1000 did not bind socket 4097")) == "permission denied: uid 1000 did not bind socket 4097"
    assert protocol.Error(2, "x").status is Status.INVALID
    assert str(protocol.Error(99, "new")) == "status 99: new"
