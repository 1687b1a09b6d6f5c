"""Rollback on purpose (tasks/rollback.py): every node back to a state that served before, from
the records every node keeps (operations/records.py)."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, operation

from facts.serving import RecordFiles
from layout import LABELS
from operations.canary import canaries
from operations.handover import own, probe, read_cluster, recording, served_or_rolled_back, starts, way_back
from operations.peer import acts_here, reachable, read_all
from operations.render import show_diff
from operations.stack import StackSettings, planned_done
from states import cluster_state

STACK_LABEL = f"{LABELS['stack']}: "  # the line of compose.yaml naming its stack hash


def file_stack(lines: list[str] | None) -> str | None:
    """The stack hash a compose file names (its label), None without one."""
    found = [line.split(STACK_LABEL, 1)[1].strip() for line in lines or [] if STACK_LABEL in line]
    return found[0] if len(found) == 1 else None


@operation()
def rolled_back(stacks: list[StackSettings], ready_timeout: int):
    """
    On the head: return every node to the state that served before the one in service (its
    rollback record); or, where the stacks in place are not the ones that served last (a failed
    change left in place), to the one that served last. Shows each node's stack diff first; then
    the head stops, every worker starts fresh from its record, then the head, which waits for the
    first token and records that state as the one that serves (so a second rollback returns). No
    way back when a node lacks the record, the nodes' records disagree, or a node does not
    answer: refused before anything changes.

    + stacks: every node's stack settings (``stack_settings``), in rank order
    + ready_timeout: seconds the head waits for the first token

    **Example:**

    .. code:: python

        rolled_back(stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes], ready_timeout=1800)
    """
    if not acts_here("head"):
        return
    readings = read_cluster(stacks, "rolling back")
    if None in readings:
        down = [settings.hostname for settings, reading in zip(stacks, readings) if reading is None]
        raise OperationError(f"{', '.join(down)} did not answer: nothing was rolled back. Fix: bring every node up, then run this again")
    current = [file_stack(reading["compose"]) for reading in readings]
    served = [reading["records"]["served"] for reading in readings]
    name = "rollback" if all(found is not None and found["stack"] == stack for found, stack in zip(served, current)) else "served"
    back, what = way_back(stacks, readings, cluster_state([stack or "none" for stack in current]), name)
    if back is None:
        raise OperationError(f"no state to roll back to: {what}. Nothing was changed. A state is recorded once it serves: "
                             "after a change that served, this returns to the one before it")
    files = read_all(RecordFiles, [reachable(settings.hostname) for settings in stacks[1:]], stack_dir=own(stacks).site.stack_dir, record=name)
    for settings, reading, found in zip(stacks, readings, files):
        for key, file in (("compose", "compose.yaml"), ("launch", "launch.sh")):
            if found[key] is not None:
                show_diff(f"{settings.hostname}:{settings.site.stack_dir}/{file}", reading[key], "\n".join(found[key]) + "\n")
    host.log(f"will return every node to {what}", logger.info)
    yield from back
    states = [{key: value for key, value in reading["records"][name].items() if key not in ("image_id", "since")} for reading in readings]
    yield FunctionCommand(served_or_rolled_back, (
        probe(own(stacks)), int(ready_timeout), f"rolling back to {what}", [settings.hostname for settings in stacks], starts(stacks),
        canaries(own(stacks), states[0]["cluster"], states[0]["model_digest"], None), recording(stacks, states), None, "a rollback is not rolled back in turn: see the status above, then run the deploy",
        planned_done(own(stacks))), {})
