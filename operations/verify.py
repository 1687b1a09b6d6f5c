"""Readiness: read every Spark back (one round trip each, all at once), apply the rules, print
one table in rank order. The reporting (the head reports, every node read at once, a FAIL fails
the run) is shared with `operations/status.py`."""

from __future__ import annotations

from collections.abc import Callable

import click
import gevent
from pyinfra import host, inventory, state
from pyinfra.api import QuoteString, StringCommand, operation

from checks import FAIL, Check
from checks.node import USERNS_KEY, earlier_step_failed, node_checks, unreachable
from checks.table import failure_summary, render
from cluster import Cluster
from facts.host_prep import UserGroups
from facts.identity import MachineIds
from facts.serving import ServingState
from facts.verify import SHARED, Readiness, Readings, ping_targets, ssh_targets
from layout import VLLM_HOST, paths
from operations.peer import failed_step, reachable
from operations.readings import Reading, plans, read_many
from operations.runtime import image_reading, model_entry, model_reading
from operations.stack import stack_settings, state_arguments


def answers(node) -> bool:
    """Connected, or connects now; False for a node that does not answer over SSH. A node that
    failed a step of this run is read while its connection holds (it answers: the step failed)."""
    if not node.connected and node not in state.failed_hosts:
        node.connect(show_errors=False)
    return bool(node.connected)


def readiness_arguments(cluster: Cluster, name: str) -> dict:
    """The arguments of the node ``name``'s Readiness."""
    settings = cluster.settings
    api = None
    if cluster.node(name).role == "head":
        where = paths(settings.state_dir, model_entry(cluster))
        api = {"programs": where["programs"], "host": settings.api_host, "port": settings.api_port, "key_file": where["api_key"],
               "backend": f"http://{VLLM_HOST}:{settings.vllm_port}"}
    return {"user": cluster.deploy_user, "pings": [f"{netdev} {address}" for _, netdev, _, address in ping_targets(cluster, name)],
            "size": settings.fabric_mtu - 28, "ssh_to": [address for _, address in ssh_targets(cluster, name)],
            "userns_key": USERNS_KEY, "api": api}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    """What verification reads of the node ``name``, by its name in Readings: Readiness, and the
    steps' readings it shares, with the steps' own arguments (one reading serves both). Read with
    every step's readings: a run that changes nothing reports from them, read a second before."""
    shared = {"identity": (MachineIds, {}), "user": (UserGroups, {"user": cluster.deploy_user}), "image": image_reading(cluster),
              "model": model_reading(cluster), "serving": (ServingState, state_arguments(stack_settings(cluster, name)))}
    return [(Readiness, readiness_arguments(cluster, name)), *(shared[part] for part in SHARED)]


def read_node(node) -> Readings | None:
    """One node's readings, or None when it does not answer over SSH."""
    if not answers(node):
        return None
    own, *shared = read_many(node, readings(node.data.cluster, node.name))
    return {**own, **dict(zip(SHARED, shared))}


def all_checks(nodes: list, read: Callable = read_node, rules: Callable = node_checks) -> list[Check]:
    """Every row of every node, in the order of ``nodes`` (``read`` each node at the same time as
    the others, then ``rules(name, data, readings)`` with every node's readings by name, None for
    one that did not answer); a node that does not answer is one FAIL row, a node that failed a
    step of this run one more."""
    reads = {node.name: gevent.spawn(read, node) for node in nodes}
    readings = {name: greenlet.get() for name, greenlet in reads.items()}
    checks = []
    for node in nodes:
        if readings[node.name] is None:
            checks.append(unreachable(node.name, node.data.ssh_hostname, node.data.ssh_port))
            continue
        if step := failed_step(node):
            checks.append(earlier_step_failed(node.name, step))
        checks += rules(node.name, node.data.cluster, readings)
    return checks


def reports_here() -> bool:
    """The head reports, or the first node in rank order that answers when the head does not;
    only while the deploy executes (change detection and --dry skip it)."""
    for node in host.data.cluster.nodes[:host.data.rank]:
        if reachable(node.hostname) is not None:
            host.noop("the head reports" if node.role == "head" else f"{node.hostname} reports (the head does not answer)")
            return False
    if not host.state.is_executing:
        host.noop("reads every node back once the changes before it have run")
        return False
    return True


def report(checks: list[Check], title: str, passed: str):
    """Print the table; a command that fails the run on any FAIL (pyinfra then says so)."""
    click.echo(render(checks, title))
    if any(check.status == FAIL for check in checks):
        yield StringCommand("echo", QuoteString(f"{title} FAILED: {failure_summary(checks)}"), ">&2;", "exit", "1")
    else:
        host.noop(passed)


@operation()
def readiness(node_names: list[str]):
    """
    Read every node back and print one readiness table, in rank order; fail on any FAIL. The
    head reports, or the first node that answers when the head does not. Runs when the deploy
    executes (after every change before it); change detection and --dry skip it.

    + node_names: the inventory names of every node, in rank order

    **Example:**

    .. code:: python

        readiness(node_names=["spark-head", "spark-worker1", "spark-worker2"])
    """
    if reports_here():
        yield from report(all_checks([inventory.get_host(name) for name in node_names]), "readiness", "every node is ready")
