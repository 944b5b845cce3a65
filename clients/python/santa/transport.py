"""Frames on a Unix stream socket: a 4-byte big-endian length, then one CBOR message.

A socket fd passed along with a request rides as ``SCM_RIGHTS`` on the first
bytes of its frame. These functions serve santad's clients and, in tests, a
stand-in for santad alike.
"""

from __future__ import annotations

import array
import os
import socket
import struct

from .protocol import MAX_FRAME, Message, ProtocolError, decode, encode

__all__ = ["send_message", "recv_message", "TruncatedFrame"]

_HEADER = struct.Struct(">I")


class TruncatedFrame(ProtocolError):
    """The connection closed part way through a frame."""

# Room for the ancillary data of a few fds; a request carries at most one.
_MAX_FDS = 4


def send_message(sock: socket.socket, message: Message, fd: int | None = None) -> None:
    """Write one framed message, passing ``fd`` with its first bytes if given.

    Partial writes are completed; the fd is sent exactly once.
    """
    body = encode(message)
    if len(body) > MAX_FRAME:
        raise ValueError(f"message of {len(body)} bytes exceeds the {MAX_FRAME}-byte frame limit; split the request")
    frame = _HEADER.pack(len(body)) + body
    sent = 0
    if fd is not None:
        sent = socket.send_fds(sock, [frame], [fd])
    if sent < len(frame):
        sock.sendall(memoryview(frame)[sent:])


def recv_message(sock: socket.socket) -> tuple[Message, list[int]]:
    """Read one framed message and any fds passed with it; the caller owns the fds.

    Raises :class:`EOFError` if the peer closed the connection before a frame
    began, :class:`TruncatedFrame` (a :class:`~santa.ProtocolError`) if it
    closed it part way through one, and :class:`~santa.ProtocolError` for a
    bad frame or message (any passed fds are closed then).
    """
    header, fds = _recv_head(sock)
    try:
        if len(header) < _HEADER.size:
            header += _recv_exactly(sock, _HEADER.size - len(header))
        (size,) = _HEADER.unpack(header)
        if not 1 <= size <= MAX_FRAME:
            raise ProtocolError(f"frame length {size} (must be 1..{MAX_FRAME})")
        return decode(_recv_exactly(sock, size)), fds
    except BaseException:
        _close_all(fds)
        raise


def _recv_head(sock: socket.socket) -> tuple[bytes, list[int]]:
    """Receive the first bytes of a frame (1 to 4 of its header) and any fds with them."""
    data, ancdata, _flags, _addr = sock.recvmsg(_HEADER.size, socket.CMSG_SPACE(_MAX_FDS * 4))
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            rights = array.array("i")
            rights.frombytes(payload[: len(payload) - len(payload) % rights.itemsize])
            fds.extend(rights)
    if not data:
        _close_all(fds)
        raise EOFError("connection closed")
    return data, fds


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise TruncatedFrame(f"connection closed {size - got} bytes short of the frame's end")
        got += n
    return bytes(buf)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
