"""Operations for the deploy user's passwordless SSH over the fabric: from the head to every
worker, and along the chain the runtime image and the model go down (each node to the next in
rank order, ``Cluster.downstream``)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from cluster import Cluster
from facts.ssh_trust import KEY_NAME, SshTrust
from operations.peer import reachable, read_all, warn_unreachable
from operations.readings import Reading, plans, read
from operations.render import listed


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    node, user = cluster.node(name), cluster.deploy_user
    found = [(SshTrust, {"user": user, "netdevs": []})]
    if cluster.logins_from(node):
        found.append((SshTrust, {"user": user, "netdevs": [rail["netdev"] for rail in node.rail_data]}))
    return found


def _private_dir(user: str, path: str) -> StringCommand:
    return StringCommand("mkdir", "-p", "-m", "700", QuoteString(path), "&&", "chown", QuoteString(f"{user}:"), QuoteString(path))


def _owned(user: str, path: str) -> StringCommand:
    return StringCommand("chown", QuoteString(f"{user}:"), QuoteString(path), "&&", "chmod", "600", QuoteString(path))


@operation()
def known_receivers(user: str, rails: list[dict]):
    """
    On a node that logs in to others over the fabric (the head to every worker, a worker to the
    next one in rank order): give ``user`` an ed25519 key pair (no passphrase) if it has none,
    and record each of those nodes' SSH host key at each of its fabric addresses. A rail whose
    link is not up here is skipped with a warning (verification says why); a node that does not
    answer is left for the next run.

    + user: the deploy user
    + rails: this node's rails (``netdev`` of each), in the order of every node's

    **Example:**

    .. code:: python

        known_receivers(user="spark", rails=cluster.node(host.name).rail_data)
    """
    cluster: Cluster = host.data.cluster
    targets = cluster.logins_from(cluster.node(host.name))
    if not targets:
        host.noop("logs in to no other node")
        return
    answering = []
    for target in targets:
        if reachable(target.hostname) is None:
            warn_unreachable("SSH trust", target.hostname)
        else:
            answering.append(target)
    trust = read(host, SshTrust, user=user, netdevs=[rail["netdev"] for rail in rails])
    ssh_dir = f"{trust['home']}/.ssh"
    changed = False
    if not trust["public_key"]:
        changed = True
        yield _private_dir(user, ssh_dir)
        yield StringCommand("sudo", "-n", "-u", QuoteString(user), "ssh-keygen", "-q", "-t", "ed25519", "-N", "''",
                            "-C", QuoteString(f"{user}@{host.name}"), "-f", QuoteString(f"{ssh_dir}/{KEY_NAME}"))
    missing = []
    for target in answering:
        for rail, address in zip(rails, target.fabric_addresses):
            if address in trust["known_hosts"]:
                continue
            if trust["operstate"].get(rail["netdev"]) != "up":
                logger.warning(f"{host.print_prefix}{rail['netdev']} is not up: {address} not scanned")
                continue
            missing.append(address)
    known_hosts = f"{ssh_dir}/known_hosts"
    for address in missing:
        changed = True
        yield StringCommand("key=$(ssh-keyscan", "-T", "5", "-t", "ed25519", QuoteString(address), "2>/dev/null)", "&&",
                            '[ -n "$key" ]', "&&", "printf", "'%s\\n'", '"$key"', ">>", QuoteString(known_hosts))
    if missing:
        yield _owned(user, known_hosts)
    if not changed and len(answering) == len(targets):
        names = [target.hostname for target in targets]
        host.noop(f"{user} has a key and knows {listed(names)} at {'its' if len(names) == 1 else 'their'} "
                  "reachable fabric addresses")


@operation()
def authorized_senders(user: str):
    """
    On a worker: authorize for ``user`` the key of every node that logs in to it (the head, and
    the node before it in rank order). The keys are read from those nodes when this runs, so a
    key one generated earlier in the same run is the one authorized. A node that does not
    answer is left for the next run.

    + user: the deploy user

    **Example:**

    .. code:: python

        authorized_senders(user="spark")
    """
    cluster: Cluster = host.data.cluster
    nodes = cluster.logins_to(cluster.node(host.name))
    if not nodes:
        host.noop("no other node logs in to it")
        return
    mine, *theirs = read_all(SshTrust, [reachable(node.hostname) for node in nodes], user=user, netdevs=[])
    keys: dict[str, str] = {}  # key (or its stand-in) -> the first node with it
    waiting = False
    for node, trust in zip(nodes, theirs):
        if trust is None:
            warn_unreachable("SSH trust", node.hostname)
            waiting = True
            continue
        key = trust["public_key"]
        if key is None and host.state.is_executing:
            raise OperationError(f"{node.hostname} has no SSH key for {user}. Fix: run the deploy again; the SSH "
                                 f"trust step on {node.hostname} (its key) must pass first.")
        if key not in mine["authorized_keys"]:
            keys.setdefault(key or f"<the key {node.hostname} generates in this run>", node.hostname)
    if not keys:
        if not waiting:
            whose = f"{nodes[0].hostname}'s key is" if len(nodes) == 1 else f"the keys of {listed([node.hostname for node in nodes])} are"
            host.noop(f"{whose} authorized for {user}")
        return
    ssh_dir = f"{mine['home']}/.ssh"
    authorized = f"{ssh_dir}/authorized_keys"
    yield _private_dir(user, ssh_dir)
    for key in keys:
        yield StringCommand("printf", "'%s\\n'", QuoteString(key), ">>", QuoteString(authorized))
    yield _owned(user, authorized)
