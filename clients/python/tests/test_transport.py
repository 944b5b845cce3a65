"""Framing over a real Unix socketpair, including fd passing with SCM_RIGHTS."""

from __future__ import annotations

import os
import socket
import struct
import threading
from collections.abc import Iterator
from collections.abc import Callable

import pytest

from santa.protocol import Message, ProtocolError, encode
from santa.transport import recv_message, send_message

from helpers import cookie

@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.settimeout(10)
    b.settimeout(10)
    with a, b:
        yield a, b


def in_thread(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


def frame(message: Message) -> bytes:
    body = encode(message)
    return struct.pack(">I", len(body)) + body


def test_round_trip(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    messages = [Message(v=1, op=1, seq=1), Message(v=1, op=10, seq=2, socket=4097, ids=[3, 1 << 40])]
    for m in messages:
        send_message(a, m)
    for m in messages:
        assert recv_message(b) == (m, [])


def test_fd_travels_with_the_frame(pair: tuple[socket.socket, socket.socket], udp: socket.socket) -> None:
    a, b = pair
    send_message(a, Message(v=1, op=2, seq=1), udp.fileno())
    send_message(a, Message(v=1, op=8, seq=2))
    message, fds = recv_message(b)
    assert message == Message(v=1, op=2, seq=1) and len(fds) == 1
    try:
        assert fds[0] != udp.fileno()
        assert cookie(fds[0]) == cookie(udp.fileno())
        with socket.socket(fileno=os.dup(fds[0])) as passed:
            assert passed.getsockname() == udp.getsockname()
    finally:
        os.close(fds[0])
    assert recv_message(b) == (Message(v=1, op=8, seq=2), [])  # no fd with the next frame


def test_frame_split_into_single_bytes(pair: tuple[socket.socket, socket.socket], udp: socket.socket) -> None:
    """The reader reassembles a frame that arrives one byte per write, fd on the first."""
    a, b = pair
    message = Message(v=1, op=4, seq=7, sample=b"x" * 40)
    data = frame(message)

    def trickle() -> None:
        socket.send_fds(a, [data[:1]], [udp.fileno()])
        for i in range(1, len(data)):
            a.send(data[i:i + 1])

    in_thread(trickle).join()
    got, fds = recv_message(b)
    assert got == message and len(fds) == 1
    assert cookie(fds[0]) == cookie(udp.fileno())
    os.close(fds[0])


def test_large_frame_with_fd(pair: tuple[socket.socket, socket.socket], udp: socket.socket) -> None:
    """A frame far larger than the socket buffer goes out in partial sends."""
    a, b = pair
    message = Message(v=1, op=12, seq=1, sample=os.urandom(8 << 20))
    sender = in_thread(lambda: send_message(a, message, udp.fileno()))
    got, fds = recv_message(b)
    sender.join()
    assert got == message and len(fds) == 1
    os.close(fds[0])


def test_eof_between_frames(pair: tuple[socket.socket, socket.socket]) -> None:
    a, b = pair
    send_message(a, Message(v=1, op=1, seq=1))
    a.shutdown(socket.SHUT_WR)
    assert recv_message(b)[0].seq == 1
    with pytest.raises(EOFError):
        recv_message(b)


@pytest.mark.parametrize("data, why", [
    (b"\x00\x00\x00\x05\xa3\x00", "short of the frame's end"),  # closed inside a frame
    (b"\x00\x00", "short of the frame's end"),  # closed inside the header
    (b"\x00\x00\x00\x00", "frame length 0"),
    (b"\x10\x00\x00\x01", "frame length 268435457"),
])
def test_bad_frames(pair: tuple[socket.socket, socket.socket], udp: socket.socket, data: bytes, why: str) -> None:
    a, b = pair
    socket.send_fds(a, [data], [udp.fileno()])
    a.shutdown(socket.SHUT_WR)
    fds_before = set(os.listdir("/proc/self/fd"))
    with pytest.raises(ProtocolError, match=why):
        recv_message(b)
    assert set(os.listdir("/proc/self/fd")) <= fds_before  # the passed fd was closed


def test_bad_message_keeps_the_stream(pair: tuple[socket.socket, socket.socket]) -> None:
    """A frame whose message does not decode is consumed whole; the next one reads fine."""
    a, b = pair
    a.sendall(b"\x00\x00\x00\x03\xa1\x00\x20")  # {0: -1}
    send_message(a, Message(v=1, op=1, seq=2))
    with pytest.raises(ProtocolError, match="negative integer"):
        recv_message(b)
    assert recv_message(b) == (Message(v=1, op=1, seq=2), [])
