"""Operations for the deploy user's passwordless SSH from the head to the worker over the fabric."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from facts.ssh_trust import KEY_NAME, SshTrust
from operations.peer import acts_here, reachable_peer, warn_unreachable


def _private_dir(user: str, path: str) -> StringCommand:
    return StringCommand("mkdir", "-p", "-m", "700", QuoteString(path), "&&", "chown", QuoteString(f"{user}:"), QuoteString(path))


def _owned(user: str, path: str) -> StringCommand:
    return StringCommand("chown", QuoteString(f"{user}:"), QuoteString(path), "&&", "chmod", "600", QuoteString(path))


@operation()
def head_trust(user: str, rails: list[dict], peer_rails: list[dict]):
    """
    On the head: give ``user`` an ed25519 key pair (no passphrase) if it has none, and record
    the worker's SSH host key at each of its fabric addresses. A rail whose link is not up is
    skipped with a warning (verification says why).

    + user: the deploy user
    + rails: this node's rails (``netdev`` of each)
    + peer_rails: the worker's rails, in the same order (``address`` of each)

    **Example:**

    .. code:: python

        head_trust(user="spark", rails=host.data.rails, peer_rails=host.data.peer_rails)
    """
    if not acts_here("head"):
        return
    waiting = reachable_peer() is None
    if waiting:
        warn_unreachable("SSH trust with the worker")
    trust = host.get_fact(SshTrust, user=user, netdevs=[rail["netdev"] for rail in rails])
    ssh_dir = f"{trust['home']}/.ssh"
    changed = False
    if not trust["public_key"]:
        changed = True
        yield _private_dir(user, ssh_dir)
        yield StringCommand("sudo", "-n", "-u", QuoteString(user), "ssh-keygen", "-q", "-t", "ed25519", "-N", "''",
                            "-C", QuoteString(f"{user}@{host.name}"), "-f", QuoteString(f"{ssh_dir}/{KEY_NAME}"))
    missing = []
    for rail, peer in zip(rails, peer_rails) if not waiting else ():
        if peer["address"] in trust["known_hosts"]:
            continue
        if trust["operstate"].get(rail["netdev"]) != "up":
            logger.warning(f"{host.print_prefix}{rail['netdev']} is not up: {peer['address']} not scanned")
            continue
        missing.append(peer["address"])
    known_hosts = f"{ssh_dir}/known_hosts"
    for address in missing:
        changed = True
        yield StringCommand("key=$(ssh-keyscan", "-T", "5", "-t", "ed25519", QuoteString(address), "2>/dev/null)", "&&",
                            '[ -n "$key" ]', "&&", "printf", "'%s\\n'", '"$key"', ">>", QuoteString(known_hosts))
    if missing:
        yield _owned(user, known_hosts)
    if not changed and not waiting:
        host.noop(f"{user} has a key and knows the worker at its reachable fabric addresses")


@operation()
def authorized_peer_key(user: str):
    """
    On the worker: authorize the head's key for ``user``. The key is read from the head when
    this runs, so a key the head generated earlier in the same run is the one authorized.

    + user: the deploy user

    **Example:**

    .. code:: python

        authorized_peer_key(user="spark")
    """
    if not acts_here("worker"):
        return
    peer = reachable_peer()
    if peer is None:
        warn_unreachable("SSH trust with the head")
        return
    key = peer.get_fact(SshTrust, user=user, netdevs=[])["public_key"]
    mine = host.get_fact(SshTrust, user=user, netdevs=[])
    if key and key in mine["authorized_keys"]:
        host.noop(f"{peer.name}'s key is authorized for {user}")
        return
    if key is None and host.state.is_executing:
        raise OperationError(f"{peer.name} has no SSH key for {user}. Fix: run the deploy again; the head's "
                             "SSH trust step (its key) must pass first.")
    ssh_dir = f"{mine['home']}/.ssh"
    authorized = f"{ssh_dir}/authorized_keys"
    yield _private_dir(user, ssh_dir)
    yield StringCommand("printf", "'%s\\n'", QuoteString(key or f"<the key {peer.name} generates in this run>"),
                        ">>", QuoteString(authorized))
    yield _owned(user, authorized)
