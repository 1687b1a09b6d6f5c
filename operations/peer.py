"""Other nodes of the cluster, as an operation on this one sees them: None for one that did not
answer over SSH, so a step that needs it says so instead of dying in a traceback; and the call
of the program that runs a command on another node, or on several at once."""

from __future__ import annotations

import gevent
from pyinfra import host, inventory, logger, state
from pyinfra.api import Host, QuoteString, StringCommand

from operations.readings import read


def reachable(name: str) -> Host | None:
    """The named node's Host; None if it does not answer over SSH, or failed a step of this run."""
    peer = inventory.get_host(name)
    if peer in state.failed_hosts:
        return None
    if not peer.connected:
        peer.connect(show_errors=False)
    return peer if peer.connected else None


def failed_step(node: Host) -> str | None:
    """The name of the step of this run that failed on ``node`` (pyinfra then leaves the node out of
    every later step, connection and all); None when none did."""
    if node not in state.failed_hosts:
        return None
    for op_hash, op_data in state.ops.get(node, {}).items():
        meta = op_data.operation_meta
        if meta.is_complete() and not meta.did_succeed():
            return ", ".join(sorted(state.get_op_meta(op_hash).names)) or "a step"
    return "a step"


def warn_unreachable(step: str, name: str) -> None:
    """Say the step waits for the named node, and why: a warning with what to check, and the
    no-op reason."""
    peer = inventory.get_host(name)
    if peer.connected:
        host.noop(f"{step} waits: {peer.name} failed an earlier step")
        logger.warning(f"{host.print_prefix}{peer.name} failed an earlier step of this run ({failed_step(peer)}; its error is "
                       f"above): {step} needs it and is left for the next run.")
        return
    host.noop(f"{step} waits: {peer.name} does not answer")
    logger.warning(
        f"{host.print_prefix}{peer.name} does not answer at {peer.data.ssh_hostname}:{peer.data.ssh_port}: "
        f"{step} needs {peer.name} and is left for the next run. Check that {peer.name} is on, that sshd "
        "runs and the management LAN."
    )


def read_all(fact, others: list[Host | None], **kwargs) -> tuple:
    """A fact of this node, then of each of ``others`` (None for a None), all read at the same time
    (as the run read them for every step while it has changed nothing: operations/readings.py)."""
    theirs = [gevent.spawn(read, other, fact, **kwargs) if other is not None else None for other in others]
    mine = read(host, fact, **kwargs)
    return mine, *(greenlet.get() if greenlet is not None else None for greenlet in theirs)


def acts_here(role: str) -> bool:
    """Whether this step acts on this node. Every step is called on every node from one place, so
    pyinfra keeps the steps of all in one order; on a node of the other role it does nothing."""
    if host.data.role == role:
        return True
    host.noop(f"acts on the {role}")
    return False


def target(user: str, rails: list[dict]) -> str:
    """A node as `peers` names it: the deploy user, then its fabric addresses in order."""
    return f"{user}@{','.join(rail['address'] for rail in rails)}"


def on_node(programs: str, name: str, user: str, rails: list[dict], *argv: str) -> StringCommand:
    """``argv`` run on the node ``name`` (a worker, whose ``rails`` these are), over the first of
    its fabric rails that answers, by the program ``peers run`` (files/dual_spark/peers.py)."""
    return StringCommand("python3", QuoteString(programs), "peers", "run", "--node", QuoteString(name), "--user", QuoteString(user),
                         *[arg for rail in rails for arg in ("--rail", QuoteString(rail["address"]))], "--",
                         *(QuoteString(arg) for arg in argv))


def at_once(programs: str, jobs: list[tuple[str, str, str]], what: str, then: str = "") -> StringCommand:
    """Each job (a node's name; `here`, or ``target`` of it; the shell that does ``what`` for it)
    run at the same time by the program ``peers all``, which prints each one's output under its
    node's name and fails naming every node where it failed (saying ``then``: what happens next)."""
    return StringCommand("python3", QuoteString(programs), "peers", "all", "--what", QuoteString(what),
                         *(["--then", QuoteString(then)] if then else []),
                         *[arg for name, place, text in jobs for arg in ("--job", QuoteString(name), QuoteString(place), QuoteString(text))])
