"""Helpers shared by the tests."""

from __future__ import annotations

import os
import socket
import struct
import time
from dataclasses import dataclass, field
from collections.abc import Callable

from santa.protocol import Message
from santa.transport import recv_message, send_message

SO_COOKIE = getattr(socket, "SO_COOKIE", 57)


def cookie(fd: int) -> int:
    """The SO_COOKIE of the socket behind ``fd``: equal cookies mean the same socket."""
    with socket.socket(fileno=os.dup(fd)) as s:
        return struct.unpack("=Q", s.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]


#: Answers one request (and the cookie of the socket passed with it, if any)
#: with the messages to send back (a float: a pause of that many seconds
#: first), or None to close the connection.
Handler = Callable[[Message, int | None], list[Message | float] | None]


@dataclass
class FakeSantad:
    """Serves one connection at ``path``, recording each request and passed socket's cookie."""

    path: str
    handler: Handler
    requests: list[tuple[Message, int | None]] = field(default_factory=list)

    def serve(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except OSError:  # the test ended, closing the listener, before this thread ran
            return
        with conn:
            while True:
                try:
                    request, fds = recv_message(conn)
                except (EOFError, OSError):
                    return
                passed = cookie(fds[0]) if fds else None
                for fd in fds:
                    os.close(fd)
                self.requests.append((request, passed))
                responses = self.handler(request, passed)
                if responses is None:
                    return
                for response in responses:
                    if isinstance(response, float):
                        time.sleep(response)
                    else:
                        send_message(conn, response)


def ok(request: Message, **fields: object) -> Message:
    """The successful response to ``request``."""
    return Message(v=1, op=request.op, seq=request.seq, **fields)  # type: ignore[arg-type]
