"""What the steps of a run read of each node, read once per node. The first reading a step takes
reads every node at the same time, each in one round trip (NodeState): all the facts the steps
of the loaded operation modules read there (``step_readings``; deploy.py loads them all first). Until the run changes something, every
step takes its readings from there; once any step has run a command on any node, every reading
is taken anew. Change
detection (and --dry) reads the nodes once; the run that follows reads them again before it
changes anything, unless change detection found nothing to change on any node: then the run
changes nothing, and its steps decide again from the same readings. A reading outside the plan,
or of a node that did not answer, is taken when asked.

Only for what an operation reads before it yields its first command: a callback run while the
changes execute (a FunctionCommand) reads the node itself."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from pathlib import Path
from weakref import WeakKeyDictionary

import gevent
from pyinfra import inventory, state
from pyinfra.api import FactBase, Host

from cluster import Cluster
from facts.node import NodeState

Reading = tuple[type[FactBase], dict]
# What each operation module's steps read of a node, as it declares (``plans``).
_plans: list[Callable[[Cluster, str], list[Reading]]] = []

# node -> (taken while the changes execute, the greenlet reading it: {reading's key: its value})
_taken: WeakKeyDictionary[Host, tuple[bool, gevent.Greenlet]] = WeakKeyDictionary()


def plans(plan: Callable[[Cluster, str], list[Reading]]) -> Callable[[Cluster, str], list[Reading]]:
    """Declare ``plan(cluster, name)``: every (fact, arguments) its module's steps read of the node
    ``name``, with the arguments its task gives them. A module declares its own, beside the steps."""
    _plans.append(plan)
    return plan


def plan_every_module() -> None:
    """Load every operation module, and with it its plan: for deploy.py, which runs them all.
    Change detection reads a node as soon as the first task calls its first step, before the
    deploy file has loaded the tasks after it; so loaded, the one round trip reads for them too.
    A task run alone (status, profile, rollback) plans for the modules it loads, no more: its
    round trip does not wait on verification's probe of the API."""
    for path in sorted(Path(__file__).parent.glob("*.py")):
        importlib.import_module(f"operations.{path.stem}")


def step_readings(cluster: Cluster, name: str) -> list[Reading]:
    """Every (fact, arguments) the steps of the modules a run has loaded read of the node
    ``name``, whichever node's step reads it: each once."""
    found = {key(fact, arguments): (fact, arguments) for plan in _plans for fact, arguments in plan(cluster, name)}
    return list(found.values())


def fact_name(fact: type[FactBase]) -> str:
    """The "module.Class" NodeState names a fact of facts/ by."""
    return f"{fact.__module__.rsplit('.', 1)[-1]}.{fact.__name__}"


def key(fact: type[FactBase], arguments: dict) -> str:
    return json.dumps([fact_name(fact), arguments], sort_keys=True)


def changed_nothing() -> bool:
    """No step of this run has run a command on any node yet."""
    return not any(data.operation_meta.executed for ops in state.ops.values() for data in ops.values())


def nothing_to_change(cluster: Cluster) -> bool:
    """Change detection found no step with a command for any node of ``cluster``."""
    nodes = [inventory.get_host(node.hostname) for node in cluster.nodes]
    return all(state.get_meta_for_host(node).ops_change == 0 for node in nodes)


def taken(node: Host) -> dict[str, object]:
    """The node's readings of this stage (change detection, or the changes executing; those of
    change detection when it found nothing to change), every node read at once on the first call."""
    executing = bool(state.is_executing) and not nothing_to_change(node.data.cluster)
    if node not in _taken or _taken[node][0] != executing:
        for name in (other.hostname for other in node.data.cluster.nodes):
            peer = inventory.get_host(name)
            if peer.connected and peer not in state.failed_hosts and (peer not in _taken or _taken[peer][0] != executing):
                _taken[peer] = (executing, gevent.spawn(read_node, peer))
    return _taken[node][1].get() if node in _taken and _taken[node][0] == executing else {}


def read_node(node: Host) -> dict[str, object]:
    """Every step's readings of ``node`` in one round trip, by key; none that did not read."""
    planned = step_readings(node.data.cluster, node.name)
    names = [[fact_name(fact), arguments] for fact, arguments in planned]
    values = node.get_fact(NodeState, readings=names)["readings"]
    return {key(fact, arguments): value for (fact, arguments), value in zip(planned, values) if value is not None}


def read(node: Host, fact: type[FactBase], **arguments):
    """``fact`` of ``node``: as the node was read for every step while the run has changed
    nothing; otherwise (or where that reading lacks it) read now."""
    if changed_nothing():
        found = taken(node).get(key(fact, arguments))
        if found is not None:
            return found
    return node.get_fact(fact, **arguments)


def read_many(node: Host, wanted: list[Reading]) -> list:
    """Each of ``wanted`` of ``node``, as ``read`` gives it; those it would read anew, in one round
    trip (NodeState), each its fact's default where the node printed nothing of it."""
    found = taken(node) if changed_nothing() else {}
    missing = [(fact, arguments) for fact, arguments in wanted if key(fact, arguments) not in found]
    if missing:
        values = node.get_fact(NodeState, readings=[[fact_name(fact), arguments] for fact, arguments in missing])["readings"]
        found = {**found, **{key(fact, arguments): value if value is not None else fact.default()
                             for (fact, arguments), value in zip(missing, [*values, *[None] * len(missing)])}}
    return [found[key(fact, arguments)] for fact, arguments in wanted]
