"""Operations that give a cloned Spark an identity of its own."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from cluster import Cluster
from facts.identity import MachineIds
from operations.peer import acts_here, reachable, read_all, warn_unreachable
from operations.readings import Reading, plans
from operations.render import listed


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [(MachineIds, {})]

BACKUP_DIR = "/root"


@operation()
def distinct_machine_id(expected_hostname: str):
    """
    On a worker: give it a new ``/etc/machine-id`` when it shares the head's or that of any
    worker before it in rank order, as cloned factory images do (so the head never gets a new
    one, and of nodes that share an id every one but the first keeps none of it). Every node is
    read at the same time. Refuses unless the hostname is the expected one; backs up the old
    ids under /root first; checks the new id differs. The node must then be rebooted for
    services to pick the new id up.

    + expected_hostname: the hostname this node must have

    **Example:**

    .. code:: python

        distinct_machine_id(expected_hostname="spark-2")
    """
    if not acts_here("worker"):
        return
    cluster: Cluster = host.data.cluster
    me, others = cluster.node(host.name), cluster.others(host.name)
    mine, *theirs = read_all(MachineIds, [reachable(node.hostname) for node in others])
    same = [node for node, reading in zip(others, theirs) if mine["etc"] and reading is not None and reading["etc"] == mine["etc"]]
    shared = [node.hostname for node in same if node.rank < me.rank]
    if not shared:
        before = [node for node in others if node.rank < me.rank]
        unanswered = [node.hostname for node, reading in zip(others, theirs) if node.rank < me.rank and reading is None]
        for name in unanswered:
            warn_unreachable("comparing machine ids", name)
        if not unanswered:
            later = [node.hostname for node in same]
            differs = f"{before[0].hostname}'s" if len(before) == 1 else f"those of {listed([node.hostname for node in before])}"
            host.noop(f"machine id differs from {differs}" + (f"; {listed(later)}, later in rank, will get a new one" if later else ""))
        return
    if mine["hostname"] != expected_hostname:
        raise OperationError(
            f"{host.name}: refusing to replace the machine id: the hostname is {mine['hostname']!r}, "
            f"expected {expected_hostname!r}. Fix: check that the inventory points at the worker, "
            "or set its hostname (hostnamectl set-hostname) and run again."
        )
    old = mine["etc"]
    dbus_is_a_copy = mine["dbus"] is not None and not mine["dbus_is_link"]
    backup = f"{BACKUP_DIR}/machine-id.{old}.bak"
    yield StringCommand("test", "-e", QuoteString(backup), "||", "cp", "-p", "/etc/machine-id", QuoteString(backup))
    if dbus_is_a_copy:
        dbus_backup = f"{BACKUP_DIR}/dbus-machine-id.{old}.bak"
        yield StringCommand("test", "-e", QuoteString(dbus_backup), "||", "cp", "-p", "/var/lib/dbus/machine-id", QuoteString(dbus_backup))
    yield "truncate -s 0 /etc/machine-id && systemd-machine-id-setup"
    yield StringCommand(
        "test", '"$(cat /etc/machine-id)"', "!=", QuoteString(old), "||",
        "{", "echo", QuoteString("systemd-machine-id-setup gave the same id again"), ">&2;", "exit", "1;", "}",
    )
    if dbus_is_a_copy:
        yield "cp /etc/machine-id /var/lib/dbus/machine-id"
    logger.warning(f"{host.print_prefix}machine id {old} is shared with {listed(shared)}: a new one is written; "
                   "reboot this node afterwards (or run again with --data reboot_worker=true)")
