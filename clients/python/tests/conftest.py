"""Fixtures shared by the tests."""

from __future__ import annotations

import pathlib
import socket
import threading
from collections.abc import Iterator
from collections.abc import Callable

import pytest

from helpers import FakeSantad, Handler


@pytest.fixture
def udp() -> Iterator[socket.socket]:
    """A bound UDP socket, the kind of socket an application hands santad."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        yield s


@pytest.fixture
def santad(tmp_path: pathlib.Path) -> Iterator[Callable[[Handler], FakeSantad]]:
    """Starts stand-ins for santad: ``santad(handler)`` listens on a fresh path and serves one connection."""
    listeners: list[socket.socket] = []

    def start(handler: Handler) -> FakeSantad:
        path = str(tmp_path / f"santa{len(listeners)}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        listeners.append(listener)
        fake = FakeSantad(path, handler)
        threading.Thread(target=fake.serve, args=(listener,), daemon=True).start()
        return fake

    yield start
    for listener in listeners:
        listener.close()
