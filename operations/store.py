"""The model store: one directory per model source in model_dir (layout.store_entry), staged
beside the one that serves (operations/runtime.py); the directories no stack file names any
more are removed once the head serves the new stack."""

from __future__ import annotations

import posixpath

from pyinfra import host, logger
from pyinfra.api import operation

from cluster import Cluster
from facts.store import StoreState
from operations.own import own
from operations.peer import reachable, warn_unreachable
from operations.readings import Reading, plans, read

# What the stack files named on each node when this run planned (change detection, --dry): the
# run that follows keeps those too, so it removes only what its diff showed, whatever the stack
# files it installs meanwhile (compose.yaml.previous moves on) no longer name.
_planned: dict = {"state": None, "named": {}}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [(StoreState, {"model_dir": cluster.settings.model_dir, "stack_dir": cluster.settings.stack_dir})]


@operation()
def store_pruned(model_dir: str, stack_dir: str, keep: str, user: str, programs: str):
    """
    On every node, once the head serves: remove each directory of the model store that carries
    the deploy's marker and that no stack file (any ``compose.yaml*`` under ``stack_dir``: the
    stack, the one before it, rollback records) mounts at /model, and that is not ``keep``. A
    directory without the marker, one another user than root and ``user`` can change (or whose
    marker is another's), a link, or a name the store does not give stays; so does every
    directory while a stack file does not read, and what the stack files named when the run
    planned (its diff lists all it removes). The program (``own remove``) checks owner and marker
    again as it removes.

    + model_dir: the model store
    + stack_dir: where the stack files are
    + keep: the store's directory of the model the site names (``layout.store_entry``)
    + user: the deploy user, the store's owner
    + programs: the archive of the programs on the node (``own remove``)

    **Example:**

    .. code:: python

        store_pruned(model_dir="/var/lib/dual-spark/model", stack_dir="/etc/dual-spark",
                     keep=store_entry("/var/lib/dual-spark/model", cluster.model.source), user="spark",
                     programs="/var/lib/dual-spark/bin/dual-spark.pyz")
    """
    head = host.data.cluster.head.hostname
    if reachable(head) is None:
        warn_unreachable("cleaning the model store", head)
        return
    reading = read(host, StoreState, model_dir=model_dir, stack_dir=stack_dir)
    if reading["unreadable"]:
        logger.warning(f"{host.print_prefix}the model store keeps every directory: {', '.join(reading['unreadable'])} "
                       "does not read as a stack file")
        host.noop("the model store keeps every directory: a stack file does not read")
        return
    named = {posixpath.normpath(path) for path in reading["mounted"]} | {keep}
    if _planned["state"] is not host.state:
        _planned.update(state=host.state, named={})
    if host.state.is_executing:
        named |= _planned["named"].get(host.name, set())
    else:
        _planned["named"][host.name] = named
    unused = [f"{model_dir}/{name}" for name, ours in sorted(reading["entries"].items()) if ours and f"{model_dir}/{name}" not in named]
    if not unused:
        kept = sum(reading["entries"].values())
        host.noop(f"the model store keeps {kept} director{'y' if kept == 1 else 'ies'}, each named by a stack file or the site")
        return
    for path in unused:
        host.log(f"will remove {path}: no stack file mounts it", logger.info)
        yield own(programs, "remove", "--dir", path, "--owner", user)
