"""Operations for the deploy user's passwordless SSH from the head to the worker over the fabric."""

from __future__ import annotations

from pyinfra import host, inventory, logger
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents
from pyinfra.facts.server import Home

from facts.fabric import NetLinks

KEY_NAME = "id_ed25519"


def _ssh_dir(user: str) -> str:
    return f"{host.get_fact(Home, user=user)}/.ssh"


def _as_user(user: str, *command) -> StringCommand:
    return StringCommand("sudo", "-n", "-u", QuoteString(user), *command)


@operation()
def user_key_pair(user: str):
    """
    Give ``user`` an ed25519 key pair (no passphrase) if it has none.

    + user: the deploy user

    **Example:**

    .. code:: python

        user_key_pair(user="spark")
    """
    key = f"{_ssh_dir(user)}/{KEY_NAME}"
    if host.get_fact(FileContents, path=f"{key}.pub"):
        host.noop(f"{user} has {key}.pub")
        return
    yield _as_user(user, "mkdir", "-p", "-m", "700", QuoteString(_ssh_dir(user)))
    yield _as_user(user, "ssh-keygen", "-q", "-t", "ed25519", "-N", "''", "-C", QuoteString(f"{user}@{host.name}"),
                   "-f", QuoteString(key))


@operation()
def authorized_peer_key(user: str, peer_name: str):
    """
    Authorize the peer's ``user`` key for ``user`` here. The peer's key is read when the
    operation runs, so a key generated earlier in the same run is the one authorized.

    + user: the deploy user (the same name on both nodes)
    + peer_name: inventory name of the node that logs in

    **Example:**

    .. code:: python

        authorized_peer_key(user="spark", peer_name="spark-head")
    """
    peer = inventory.get_host(peer_name)
    peer_key_lines = peer.get_fact(FileContents, path=f"{peer.get_fact(Home, user=user)}/.ssh/{KEY_NAME}.pub")
    authorized = f"{_ssh_dir(user)}/authorized_keys"
    if peer_key_lines and peer_key_lines[0] in (host.get_fact(FileContents, path=authorized) or []):
        host.noop(f"{peer_name}'s key is authorized for {user}")
        return
    key = peer_key_lines[0] if peer_key_lines else f"<the key {peer_name} generates in this run>"
    yield _as_user(user, "mkdir", "-p", "-m", "700", QuoteString(_ssh_dir(user)))
    yield _as_user(user, "sh", "-c", QuoteString(f"umask 077 && echo '{key}' >> {authorized}"))


@operation()
def known_peer_addresses(user: str, rails: list[dict], peer_rails: list[dict]):
    """
    Record the peer's SSH host key at each of its fabric addresses in ``user``'s known_hosts.
    A rail whose link is not up is skipped with a warning (verification says why).

    + user: the deploy user
    + rails: this node's rails (``netdev`` of each)
    + peer_rails: the peer's rails, in the same order (``address`` of each)

    **Example:**

    .. code:: python

        known_peer_addresses(user="spark", rails=host.data.rails, peer_rails=host.data.peer_rails)
    """
    known_hosts = f"{_ssh_dir(user)}/known_hosts"
    known = {line.split()[0] for line in host.get_fact(FileContents, path=known_hosts) or [] if line.strip()}
    links = host.get_fact(NetLinks)
    missing = []
    for rail, peer in zip(rails, peer_rails):
        if peer["address"] in known:
            continue
        if links.get(rail["netdev"], {}).get("operstate") != "up":
            logger.warning(f"{host.print_prefix}{rail['netdev']} is not up: {peer['address']} not scanned")
            continue
        missing.append(peer["address"])
    if not missing:
        host.noop(f"{user} knows the peer's host key at its reachable fabric addresses")
        return
    yield _as_user(user, "mkdir", "-p", "-m", "700", QuoteString(_ssh_dir(user)))
    for address in missing:
        scan = f'key=$(ssh-keyscan -T 5 -t ed25519 {address} 2>/dev/null) && [ -n "$key" ] && echo "$key" >> {known_hosts}'
        yield _as_user(user, "sh", "-c", QuoteString(scan))
