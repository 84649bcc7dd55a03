"""Free TCP ports, for each attempt's rendezvous."""

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now (``""``: on every interface, for a multi-node rendezvous)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
