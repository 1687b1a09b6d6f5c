"""Network helpers the tests share."""

import socket


def free_port() -> int:
    """A TCP port nothing listens on now, on loopback."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
