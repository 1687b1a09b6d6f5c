"""The benchmarks' SSH checks the node's host key against known_hosts over a real SSH handshake
(paramiko's server side on a loopback port): a new key is a clear error unless accepted, a
changed key always is, and none of it is a Python warning."""

import socket
import threading
import warnings

import paramiko
import pytest

from bench.remote import HostKeyError, Target, connect


class AnyKey(paramiko.ServerInterface):
    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL


@pytest.fixture(scope="module")
def client_key(tmp_path_factory):
    path = tmp_path_factory.mktemp("keys") / "id_rsa"
    paramiko.RSAKey.generate(1024).write_private_key_file(str(path))
    return str(path)


@pytest.fixture
def server():
    """A loopback SSH server whose host key the test can swap; yields (port, set_key)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    host_key = {"key": paramiko.RSAKey.generate(1024)}
    transports = []

    def serve():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            transport = paramiko.Transport(sock)
            transport.add_server_key(host_key["key"])
            transport.start_server(server=AnyKey())
            transports.append(transport)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[1], lambda key: host_key.update(key=key)
    listener.close()
    for transport in transports:
        transport.close()


def attempt(port, client_key, known_hosts, accept_new=False):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning fails the test
        client = connect(Target("bench", "127.0.0.1", port, client_key), str(known_hosts), accept_new)
    client.close()


def test_a_new_host_key_is_an_error_naming_the_fix(server, client_key, tmp_path):
    port, _ = server
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    with pytest.raises(HostKeyError, match=r"127\.0\.0\.1's SSH host key is not in .*known_hosts\. Fix: .*--accept-new-host-key"):
        attempt(port, client_key, known_hosts)
    assert known_hosts.read_text() == ""


def test_an_accepted_key_is_recorded_and_then_trusted(server, client_key, tmp_path):
    port, _ = server
    known_hosts = tmp_path / "known_hosts"
    attempt(port, client_key, known_hosts, accept_new=True)
    assert known_hosts.read_text().startswith(f"[127.0.0.1]:{port} ssh-rsa ")
    attempt(port, client_key, known_hosts)


def test_a_changed_host_key_is_an_error_even_when_accepting_new_ones(server, client_key, tmp_path):
    port, set_key = server
    known_hosts = tmp_path / "known_hosts"
    attempt(port, client_key, known_hosts, accept_new=True)
    recorded = known_hosts.read_text()
    set_key(paramiko.RSAKey.generate(1024))
    for accept_new in (False, True):
        with pytest.raises(HostKeyError, match=r"not the one recorded in .*ssh-keygen -R 127\.0\.0\.1"):
            attempt(port, client_key, known_hosts, accept_new)
    assert known_hosts.read_text() == recorded
