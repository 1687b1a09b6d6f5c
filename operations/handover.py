"""The hand-over of a change: reading every node's stack, waiting for the first token while
watching each node's backoff record, recording the state that serves, and, when none comes, the
way back to the state that served before (operations/records.py on every node). Used by
operations/serving.py and operations/rollback.py."""

from __future__ import annotations

import json
import time

import click
from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand

from checks import table
from cluster import Cluster
from facts.serving import ServingState
from facts.verify import api_reading
from layout import VLLM_HOST
from operations.peer import reachable, read_all, warn_unreachable
from operations.readings import Reading, plans
from operations.records import on_every_node, record, restore
from operations.runtime import streamed
from operations.stack import (
    Stack,
    StackSettings,
    desired,
    drained_stop,
    gid_index,
    in_place,
    stack_settings,
    state_arguments,
)
from operations.status import cluster_status
from states import described

PROBE_SLICE = 5  # seconds of each wait for the first token between two readings of the nodes' backoff records


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [(ServingState, state_arguments(stack_settings(cluster, name)))]


def own(stacks: list[StackSettings]) -> StackSettings:
    """This node's stack settings among every node's."""
    return next(settings for settings in stacks if settings.hostname == host.name)


def read_cluster(stacks: list[StackSettings], step: str) -> list[dict | None]:
    """Every node's ServingState in rank order, read at the same time; None for a node that does
    not answer (a warning says the step waits for it)."""
    names = [settings.hostname for settings in stacks if settings.hostname != host.name]
    others = [reachable(name) for name in names]
    mine, *theirs = read_all(ServingState, others, **state_arguments(own(stacks)))
    for name, other in zip(names, others):
        if other is None:
            warn_unreachable(step, name)
    found = {host.name: mine, **dict(zip(names, theirs))}
    return [found[settings.hostname] for settings in stacks]


def cluster_stacks(stacks: list[StackSettings], readings: list[dict | None]) -> tuple[list[Stack | None], bool]:
    """Every node's desired stack (None for a node not read), and whether every node runs its
    own. Every stack names the model of the head's manifest: new weights restart the cluster."""
    mine = readings[own(stacks).rank]
    model = (readings[0] or mine)["model_digest"]
    wanted = [desired(settings, gid_index(settings, reading), model) if reading is not None else None
              for settings, reading in zip(stacks, readings)]
    everywhere = all(stack is not None and in_place(stack, reading) for stack, reading in zip(wanted, readings))
    return wanted, everywhere


def failed_starts(state, starts: list[tuple[str, str]]) -> list[str]:
    """The nodes whose backoff record (``starts``: each node's name and record, watchdog.py's)
    says a start ended without serving: vLLM exited, or its watchdog ended it, before it served."""
    failed = []
    for name, path in starts:
        _, output = state.inventory.get_host(name).run_shell_command(StringCommand("cat", QuoteString(path), "2>/dev/null"), _sudo=True)
        try:
            record = json.loads("\n".join(output.stdout_lines) or "{}")
        except ValueError:
            continue
        if isinstance(record, dict) and not record.get("healthy", True) and record.get("failed_starts", 0) >= 1:
            failed.append(name)
    return failed


def first_token(state, host, probe: StringCommand, wait: int, what: str, node_names: list[str], backoff: list[tuple[str, str]]) -> bool:
    """Run the health probe until the head generates a token, for ``wait`` seconds at most and no
    longer once a node's vLLM has ended before it served (its backoff record says so, read
    between probes of PROBE_SLICE seconds). When none comes, the step fails saying why: the
    status table of every node (tasks/status.py's: the failing side's rows show the last lines
    of its container's log), then which rows fail."""
    started = time.monotonic()
    while True:
        left = int(wait - (time.monotonic() - started))
        ok, output = host.run_shell_command(StringCommand(probe, "--wait", str(max(0, min(PROBE_SLICE, left)))), _sudo=True)
        waited = time.monotonic() - started
        if ok:
            host.log(f"{what}: first token after {waited:.1f} s", logger.info)
            return True
        failed = failed_starts(state, backoff)
        if failed or waited >= wait:
            break
    reading = api_reading(output.stdout_lines)
    error = reading["error"]
    if failed:
        error = f"vLLM ended before it served on {', '.join(failed)}, and Docker started it again; the probe: {error}"
    for line in output.stderr_lines[-10:]:
        host.log(line, logger.error)
    checks = cluster_status([state.inventory.get_host(name) for name in node_names], own_work=True)
    click.echo(table.render(checks, "status"))
    host.log(f"{what}: no token after {waited:.1f} s ({error}); failing: {table.failure_summary(checks) or 'no row of the status'}",
             logger.error)
    return False


def probe(settings: StackSettings) -> StringCommand:
    """The head's one-token probe of vLLM itself, behind the front door (its --wait is the caller's)."""
    return StringCommand("python3", QuoteString(settings.programs), "health", "--url",
                         QuoteString(f"http://{VLLM_HOST}:{settings.site.vllm_port}"), "--key-file", QuoteString(settings.api_key_file))


def starts(stacks: list[StackSettings]) -> list[tuple[str, str]]:
    """Every node's name and backoff record (watchdog.py's), for ``first_token``."""
    return [(settings.hostname, f"{settings.restarts_dir}/{settings.role}-starts") for settings in stacks]


def recording(stacks: list[StackSettings], states: list[dict]) -> StringCommand:
    """Every node's stack recorded as the state that serves, each with its ``states`` entry
    (operations/records.py)."""
    return on_every_node(stacks, [record(settings, values) for settings, values in zip(stacks, states)],
                         "recording the state that serves")


def way_back(stacks: list[StackSettings], readings: list[dict], cluster: str, name: str) -> tuple[list[StringCommand] | None, str]:
    """The commands that return every node to its record ``name`` (the head stopped first, the
    workers started fresh, then the head) and a line naming that state; or None and why there is
    no way back."""
    records = [reading["records"][name] for reading in readings]
    missing = [settings.hostname for settings, found in zip(stacks, records) if found is None]
    if missing:
        return None, f"no state that served before is recorded on {', '.join(missing)}"
    if len({found["cluster"] for found in records}) != 1:
        return None, "the nodes' records of the state that served before disagree (a node was out of the run that recorded it)"
    if records[0]["cluster"] == cluster:
        return None, "it is the state recorded as the one that served"
    head, workers = stacks[0], stacks[1:]
    return [drained_stop(head), on_every_node(workers, [restore(worker, name) for worker in workers], "the rollback"),
            StringCommand(restore(head, name))], described(records[0])


def served_or_rolled_back(state, host, probe: StringCommand, wait: int, what: str, node_names: list[str], backoff: list[tuple[str, str]],
                          checked: StringCommand | None, recorded: StringCommand, back: list[StringCommand] | None, back_what: str,
                          done: StringCommand) -> bool:
    """``handed_over``, then ``done`` (the end of the planned work the head's drained stop marked),
    whichever way it went."""
    served = handed_over(state, host, probe, wait, what, node_names, backoff, checked, recorded, back, back_what)
    return streamed(state, host, done) and served


def handed_over(state, host, probe: StringCommand, wait: int, what: str, node_names: list[str], backoff: list[tuple[str, str]],
                checked: StringCommand | None, recorded: StringCommand, back: list[StringCommand] | None, back_what: str) -> bool:
    """Wait for the first token, then run the canaries (``checked``; None: none); once they pass,
    record the state that serves. When no token comes, or a canary fails, run ``back`` (the state
    that served before, on every node) and wait for it in turn; the step fails either way, saying
    what failed and where the cluster is."""
    served = first_token(state, host, probe, wait, what, node_names, backoff)
    if served and (checked is None or streamed(state, host, checked)):
        return streamed(state, host, recorded)
    why = "generated no token" if not served else "answered wrongly (the canary lines above say which canary failed, how and where)"
    if served:
        host.log(f"{what} {why}: it is not kept", logger.error)
    if back is None:
        host.log(f"{what}: not rolled back: {back_what}", logger.error)
        return False
    host.log(f"{what} failed: rolling every node back to the state that served before it: {back_what}", logger.warning)
    for command in back:
        if not streamed(state, host, command):
            host.log("the rollback failed at the step above: nothing serves. Fix: see the errors above, then run the deploy again",
                     logger.error)
            return False
    if first_token(state, host, probe, wait, f"rolled back to {back_what}", node_names, backoff):
        host.log(f"{what} {why}, so every node was rolled back, and serves again: {back_what}. Why it failed: the "
                 "status table and log lines above. The site still names the change: the next run tries it again. To leave a failed "
                 "change in place for debugging: --data rollback_on_failure=false", logger.error)
    return False


def recorded_if_serving(state, host, probe: StringCommand, recorded: StringCommand) -> bool:
    """Record the state in place as the one that serves, if the head generates a token now."""
    ok, _ = host.run_shell_command(StringCommand(probe, "--wait", "30"), _sudo=True)
    if not ok:
        host.log("the stacks are in place but the head generates no token now: the state is recorded by a later run", logger.warning)
        return True
    return streamed(state, host, recorded)
