"""SSH from the control machine to a node with paramiko: commands, streamed command output,
and a local port forward to the head's loopback-only API."""

from __future__ import annotations

import select
import socketserver
import threading
from contextlib import contextmanager
from dataclasses import dataclass

import paramiko


@dataclass(frozen=True)
class Target:
    """``user@host[:port]`` with an optional private key file."""

    user: str
    host: str
    port: int = 22
    key_filename: str | None = None

    @classmethod
    def parse(cls, spec: str, key_filename: str | None = None) -> Target:
        user, _, rest = spec.rpartition("@")
        host, _, port = rest.partition(":")
        return cls(user or None, host, int(port or 22), key_filename)


def connect(target: Target, known_hosts: str | None = None) -> paramiko.SSHClient:
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    if known_hosts:
        client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.WarningPolicy())
    client.connect(target.host, port=target.port, username=target.user, key_filename=target.key_filename, timeout=10)
    return client


def run(client: paramiko.SSHClient, command: str, timeout: float = 600) -> tuple[int, str]:
    """Run a command; its exit status and stdout+stderr."""
    channel = client.get_transport().open_session(timeout=30)
    channel.set_combine_stderr(True)
    channel.settimeout(timeout)
    channel.exec_command(command)
    output = b""
    while data := channel.recv(65536):
        output += data
    return channel.recv_exit_status(), output.decode(errors="replace")


class LineStream:
    """A long-running remote command whose output lines are collected until it is stopped."""

    def __init__(self, client: paramiko.SSHClient, command: str):
        self.lines: list[str] = []
        self._channel = client.get_transport().open_session()
        self._channel.exec_command(command)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        pending = b""
        while True:
            data = self._channel.recv(4096)
            if not data:
                break
            pending += data
            *complete, pending = pending.split(b"\n")
            self.lines += [line.decode(errors="replace") for line in complete]

    def stop(self) -> list[str]:
        self._channel.close()
        self._thread.join(timeout=5)
        return self.lines


@contextmanager
def forward(client: paramiko.SSHClient, remote_host: str, remote_port: int):
    """Listen on 127.0.0.1:<free port> here and carry each connection to remote_host:remote_port
    as seen from the node. Yields the local port."""
    transport = client.get_transport()

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            channel = transport.open_channel("direct-tcpip", (remote_host, remote_port), self.request.getpeername())
            try:
                while True:
                    readable, _, _ = select.select([self.request, channel], [], [], 60)
                    if not readable:
                        break
                    if self.request in readable:
                        data = self.request.recv(65536)
                        if not data:
                            break
                        channel.sendall(data)
                    if channel in readable:
                        data = channel.recv(65536)
                        if not data:
                            break
                        self.request.sendall(data)
            finally:
                channel.close()

    class Server(socketserver.ThreadingTCPServer):
        daemon_threads = True
        allow_reuse_address = True

    server = Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()

