#!/usr/bin/env python3
"""The paper's Listing 1 with the Python client: an unprivileged UDP server
that lets Santa answer "Hello" with "COMSYS" and serves everything else itself.

    python3 listing1.py [--socket SANTA_SOCKET_PATH] ADDR PORT

Binds a UDP socket to ADDR:PORT (IPv4 or IPv6), adds one rule for it
(condition: b"Hello" at offset 0; processor: put b"COMSYS" at offset 0; reply
length 6), prints ``ready cookie=<cookie> rule=<rule id>`` and then serves the
socket: a datagram b"stats" is answered with ``hits=<the rule's hits>``, any
other datagram that reaches the application with b"app:" + the datagram.
Exits 0 on SIGTERM or SIGINT, non-zero if santad is unreachable or refuses.
"""

from __future__ import annotations

import argparse
import ipaddress
import pathlib
import signal
import socket
import sys
from types import FrameType

try:
    import santa
except ImportError:  # run from a checkout: use the package next to this directory
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
    import santa

PROG = "listing1"


class Stop(Exception):
    """Raised by the signal handler to end the server loop."""


def on_signal(signum: int, frame: FrameType | None) -> None:
    raise Stop


def port_number(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise ValueError(text)
    return port


def open_udp(addr: ipaddress.IPv4Address | ipaddress.IPv6Address, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if addr.version == 6 else socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((str(addr), port))
    except OSError as e:
        sock.close()
        raise OSError(e.errno, f"bind UDP {addr} port {port}: {e.strerror}") from e
    return sock


def serve(sock: socket.socket, client: santa.Client, rule_id: int) -> None:
    """Answer what Santa did not: b"stats" with the rule's hits, the rest with b"app:" + payload."""
    while True:
        payload, peer = sock.recvfrom(65535)
        if payload == b"stats":
            try:
                hits = sum(s.hits for s in client.stats(sock, [rule_id]) if s.id == rule_id)
                reply = b"hits=%d" % hits
            except (santa.Error, OSError) as e:
                print(f"{PROG}: stats: {e}", file=sys.stderr, flush=True)
                reply = b"error=" + str(e).encode()
        else:
            reply = b"app:" + payload
        sock.sendto(reply, peer)


def main() -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--socket", metavar="SANTA_SOCKET_PATH",
                        help="santad's socket (default: $SANTA_SOCKET, else /run/santa/santa.sock)")
    parser.add_argument("addr", metavar="ADDR", type=ipaddress.ip_address, help="IPv4 or IPv6 address to bind")
    parser.add_argument("port", metavar="PORT", type=port_number, help="UDP port to bind")
    args = parser.parse_args()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        with open_udp(args.addr, args.port) as sock, santa.Client(args.socket) as client:
            # Listing 1: match "Hello" at offset 0, answer with the template "COMSYS".
            rule = santa.Rule(conditions=[santa.Condition(offset=0, pattern=b"Hello")],
                              processors=[santa.Put(reply_offset=0, template=b"COMSYS")],
                              reply_len=6)
            info = client.bind(sock)
            [rule_id] = client.add(sock, [rule])
            print(f"ready cookie={info.cookie} rule={rule_id}", flush=True)
            serve(sock, client, rule_id)
    except Stop:
        return 0
    except santa.Error as e:
        print(f"{PROG}: santad refused: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"{PROG}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
