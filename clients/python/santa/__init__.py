"""Python client of santad, Santa's control daemon.

An application hands its own UDP socket's rules to santad, which installs them
in the eBPF/XDP rule processor; matching requests are then answered in the
kernel. The wire protocol is ``docs/protocol.md`` in the Santa repository.

Example::

    import socket, santa

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("198.18.0.1", 5353))
    with santa.Client() as client:
        [rule_id] = client.add(sock, [santa.Rule(
            conditions=[santa.Condition(0, b"Hello")],
            processors=[santa.Put(0, b"COMSYS")],
            reply_len=6)])
"""

from .client import Client, Cookie, Health, Sample, Target, socket_path
from .protocol import (
    DEFAULT_SOCKET, MAX_FRAME, VERSION, Condition, Copy, DaemonInfo, Error, Guard, Interface, Op,
    OutcomeUnknownError, Processor, ProtocolError, Put, Rule, RuleStats, SocketInfo, Status,
)

__version__ = "0.2.0"

__all__ = [
    "Client", "Cookie", "Health", "Sample", "Target", "socket_path",
    "Condition", "Put", "Copy", "Processor", "Guard", "Rule", "SocketInfo", "RuleStats", "Interface",
    "DaemonInfo", "Error", "ProtocolError", "OutcomeUnknownError", "Status", "Op",
    "VERSION", "DEFAULT_SOCKET", "MAX_FRAME", "__version__",
]
