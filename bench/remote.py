"""SSH from the control machine to a node with paramiko: commands, streamed command output,
a local port forward to the head's loopback-only API, and what the site's head serves."""

from __future__ import annotations

import json
import select
import shlex
import socketserver
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import click
import paramiko

import layout
from cluster import Cluster


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


class HostKeyError(click.ClickException):
    """The node's SSH host key is unknown or not the recorded one: an error, never a warning."""


def connect(target: Target, known_hosts: str | None = None, accept_new: bool = False) -> paramiko.SSHClient:
    """An SSH session that checks the node's host key against the system's and ``known_hosts``;
    a key seen for the first time is an error, unless ``accept_new`` records it there; a key
    other than the recorded one is always an error."""
    client = paramiko.SSHClient()
    client.load_system_host_keys()
    if known_hosts and Path(known_hosts).exists():
        client.load_host_keys(known_hosts)
    client.set_missing_host_key_policy(paramiko.AutoAddPolicy() if accept_new else paramiko.RejectPolicy())
    where = known_hosts or "~/.ssh/known_hosts"
    try:
        client.connect(target.host, port=target.port, username=target.user, key_filename=target.key_filename, timeout=10)
    except paramiko.BadHostKeyException:
        raise HostKeyError(f"{target.host}'s SSH host key is not the one recorded in {where}: someone may be in the "
                           f"middle, or the node was reinstalled. Fix: find out which; if reinstalled, remove the old key "
                           f"(ssh-keygen -R {target.host} -f {where}) and run again with --accept-new-host-key") from None
    except paramiko.SSHException as error:
        if "not found in known_hosts" in str(error):
            raise HostKeyError(f"{target.host}'s SSH host key is not in {where}. Fix: check it and run again with "
                               "--accept-new-host-key (or run the deploy once, which records it)") from None
        raise
    if accept_new and known_hosts:
        client.save_host_keys(known_hosts)
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
                while True:  # however long it is quiet: a request held at the front door sends nothing for minutes
                    readable, _, _ = select.select([self.request, channel], [], [])
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



def head_of(cluster: Cluster, accept_new: bool = False) -> paramiko.SSHClient:
    """An SSH session to the cluster's head, as the deploy user, with the site's key and known_hosts."""
    key = str(Path(cluster.ssh_key).expanduser()) if cluster.ssh_key else None
    known = str(Path(cluster.known_hosts).expanduser()) if cluster.known_hosts else str(Path("~/.ssh/known_hosts").expanduser())
    return connect(Target(cluster.deploy_user, cluster.head.ssh_host, cluster.ssh_port, key), known, accept_new)


def read_secret(client: paramiko.SSHClient, path: str) -> str:
    """A file's content from the node, kept out of every output (the API key)."""
    status, output = run(client, f"cat {shlex.quote(path)}")
    if status != 0:
        raise RuntimeError(f"cannot read {path} on the head (it is the deploy user's): deploy first")
    return output.strip()


def serving_identity(client: paramiko.SSHClient, manifest_path: str) -> dict:
    """What the head serves, read there: the running profile, the image ID, the model's source."""
    inspect = shlex.join(["docker", "inspect", "-f", f'{{{{index .Config.Labels "{layout.LABELS["profile"]}"}}}} {{{{.Image}}}}', layout.CONTAINER])
    _, labels = run(client, f"{inspect} 2>/dev/null || sudo -n {inspect}")
    words = labels.split()
    status, manifest = run(client, f"cat {shlex.quote(manifest_path)}")
    source = json.loads(manifest).get("source", {}) if status == 0 else {}
    return {"profile": words[0] if len(words) == 2 else "unknown", "image_id": words[1] if len(words) == 2 else "unknown",
            "model_revision": source.get("revision") or source.get("path") or "unknown",
            "model_digest": json.loads(manifest).get("digest", "unknown") if status == 0 else "unknown"}
