"""Operations that give a cloned Spark an identity of its own."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import OperationError, QuoteString, StringCommand, operation

from facts.identity import MachineIds
from operations.peer import acts_here, reachable_peer, warn_unreachable

BACKUP_DIR = "/root"


@operation()
def distinct_machine_id(expected_hostname: str):
    """
    On the worker: give it a new ``/etc/machine-id`` when it shares the head's, as cloned factory
    images do (never the head's). Refuses unless the hostname is the expected one; backs up the
    old ids under /root first; checks the new id differs. The node must then be rebooted for
    services to pick the new id up.

    + expected_hostname: the hostname this node must have

    **Example:**

    .. code:: python

        distinct_machine_id(expected_hostname="spark-worker")
    """
    if not acts_here("worker"):
        return
    peer = reachable_peer()
    if peer is None:
        warn_unreachable("comparing machine ids")
        return
    mine = host.get_fact(MachineIds)
    theirs = peer.get_fact(MachineIds)
    if not mine["etc"] or mine["etc"] != theirs["etc"]:
        host.noop(f"machine id differs from {peer.name}'s")
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
    logger.warning(f"{host.print_prefix}machine id {old} is shared with {peer.name}: a new one is written; "
                   "reboot this node afterwards (or run again with --data reboot_worker=true)")
