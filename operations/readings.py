"""What the steps of a run read of each node, read once per node. The first reading a step takes
reads every node at the same time, each in one round trip (NodeState): all the facts the steps
read there (``step_readings``). Until the run changes something, every step takes its readings
from there; once any step has run a command on any node, every reading is taken anew. Change
detection (and --dry) reads the nodes once; the run that follows reads them again before it
changes anything. A reading outside the plan, or of a node that did not answer, is taken when asked.

Only for what an operation reads before it yields its first command: a callback run while the
changes execute (a FunctionCommand) reads the node itself."""

from __future__ import annotations

import json
from weakref import WeakKeyDictionary

import gevent
from pyinfra import host, inventory, state
from pyinfra.api import FactBase, Host

from checks.node import USERNS_KEY
from cluster import Cluster
from facts.fabric import FabricState
from facts.host_prep import HostSettings, ManagedPaths, PackageStatus, UserGroups
from facts.identity import MachineIds
from facts.node import NodeState
from facts.observability import ObservabilityState
from facts.runtime import ImageState, ModelState
from facts.serving import ModelHeads, ServingState
from facts.ssh_trust import SshTrust
from facts.store import StoreState
from layout import paths, smoke_marker, store_entry
from operations.own import NAMES, Claim, deploy_directories, reading_paths

# node -> (taken while the changes execute, the greenlet reading it: {reading's key: its value})
_taken: WeakKeyDictionary[Host, tuple[bool, gevent.Greenlet]] = WeakKeyDictionary()


def step_readings(cluster: Cluster, name: str) -> list[tuple[type[FactBase], dict]]:
    """Every (fact, arguments) a step of tasks/ reads of the node ``name`` (as its task gives the
    arguments), whichever node's step reads it."""
    settings, user, node = cluster.settings, cluster.deploy_user, cluster.node(name)
    model_dir = store_entry(settings.model_dir, cluster.model.source)
    where = paths(settings.state_dir, model_dir)
    claims = [Claim(*entry) for entry in deploy_directories(settings, user)]
    readings = [
        (PackageStatus, {"packages": settings.host_packages}),
        (UserGroups, {"user": user}),
        (HostSettings, {"paths": [settings.memlock_limits_path, settings.memlock_systemd_path, settings.userns_sysctl_path],
                        "key": USERNS_KEY}),
        (MachineIds, {}),
        (FabricState, {"path": settings.netplan_path}),
        (SshTrust, {"user": user, "netdevs": []}),
        (ManagedPaths, {"files": [where["programs"]], "directories": reading_paths(claims), "names": NAMES}),
        (ImageState, {"tag": cluster.image.tag, "marker": smoke_marker(settings.state_dir, cluster.image.tag)}),
        (ModelState, {"programs": where["programs"], "model_dir": model_dir, "manifest": where["manifest"],
                      "state": where["verified"], "user": user, "token_file": settings.hf_token_file}),
        (ModelHeads, {"model_dir": model_dir}),
        (StoreState, {"model_dir": settings.model_dir, "stack_dir": settings.stack_dir}),
        (ServingState, {"stack_dir": settings.stack_dir, "key_file": where["api_key"], "model_record": where["manifest"]}),
    ]
    if cluster.logins_from(node):
        readings.append((SshTrust, {"user": user, "netdevs": [rail["netdev"] for rail in node.rail_data]}))
    if settings.observability:
        from operations.observability import observability_settings, reading_arguments  # it reads through this module

        readings.append((ObservabilityState, reading_arguments(observability_settings(cluster, name))))
    return readings


def fact_name(fact: type[FactBase]) -> str:
    """The "module.Class" NodeState names a fact of facts/ by."""
    return f"{fact.__module__.rsplit('.', 1)[-1]}.{fact.__name__}"


def key(fact: type[FactBase], arguments: dict) -> str:
    return json.dumps([fact_name(fact), arguments], sort_keys=True)


def changed_nothing() -> bool:
    """No step of this run has run a command on any node yet."""
    return not any(data.operation_meta.executed for ops in state.ops.values() for data in ops.values())


def taken(node: Host) -> dict[str, object]:
    """The node's readings of this stage (change detection, or the changes executing), every node
    read at once on the first call."""
    executing = bool(state.is_executing)
    if node not in _taken or _taken[node][0] != executing:
        for name in (other.hostname for other in host.data.cluster.nodes):
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
