"""Other nodes of the cluster, as an operation on this one sees them: None for one that did not
answer over SSH, so a step that needs it says so instead of dying in a traceback; and the shell
that runs a command on another node, or on several at once."""

from __future__ import annotations

import shlex

import gevent
from pyinfra import host, inventory, logger, state
from pyinfra.api import Host, QuoteString, StringCommand

from layout import FABRIC_CIPHER, SSH_OPTIONS
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


def on_node(rails: list[dict], user: str, body: str) -> StringCommand:
    """Shell that runs ``body`` with `w CMD` meaning "run CMD on that node" (a worker, the one whose
    ``rails`` these are), over the first fabric rail it answers on, saying which rails it skipped."""
    ssh = f"sudo -n -u {shlex.quote(user)} ssh {' '.join(SSH_OPTIONS)}"
    script = [f"job() {{ {body}; }};"]  # written once, run over the first rail that answers
    for rail in rails:
        target = shlex.quote(f"{user}@{rail['address']}")
        script.append(
            f"if {ssh} {target} true 2>/dev/null; then w() {{ {ssh} -c {FABRIC_CIPHER} {target} \"$@\"; }}; "
            f"job; exit $?; fi; echo 'the worker does not answer over SSH at {rail['address']}: trying the next rail' >&2;"
        )
    script.append("echo 'the worker answers on no fabric rail: run pyinfra inventory.py tasks/verify.py' >&2; exit 1")
    return StringCommand("sh", "-c", QuoteString(" ".join(script)))


def at_once(jobs: list[tuple[str, str]], what: str, then: str = "") -> StringCommand:
    """Shell that runs each job (a node's name, the shell that does ``what`` for it) at the same
    time, in the background, each one's output kept apart; then waits for each and prints its
    output, every line under its node's name, after a line naming the node when it failed; and
    fails when any did, naming them all (and saying ``then``: what happens next)."""
    script = ['d="$(mktemp -d)" || exit 1; failed=;']
    script += [f'( {body} ) >"$d/{i}" 2>&1 & p{i}=$!;' for i, (_, body) in enumerate(jobs)]
    for i, (name, _) in enumerate(jobs):
        script.append(f'wait "$p{i}" || {{ failed="$failed {name}"; echo {shlex.quote(f"{what} failed on {name}:")} >&2; }}; '
                      f'sed {shlex.quote(f"s/^/{name}: /")} "$d/{i}" >&2;')
    script.append(f'rm -rf "$d"; [ -z "$failed" ] || {{ echo {shlex.quote(f"{what} failed on:")}"$failed"'
                  f'{shlex.quote(then)} >&2; exit 1; }}')
    return StringCommand("sh", "-c", QuoteString(" ".join(script)))
