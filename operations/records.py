"""The way back: the states that served, recorded on every node, and the shell that returns a
node to one of them.

Once the head has generated its first token, every node's stack files are copied into
``{stack_dir}/served/`` with a state.json (the cluster's state ID, the node's stack, profile,
image, model, since when); the record there before moves to ``rollback/`` (layout.RECORDS). A
state keeps its image (the deploy removes none: each image's tag names its digest) and its model
(the model store keeps every revision a stack file names). What a state is, and how it is
named, is states.py's; what a node does to record or restore one, its program's
(files/dual_spark/stack.py); running it on every node at once, ``peers all``'s."""

from __future__ import annotations

import shlex

from operations.peer import at_once, target


def record(settings, values: dict) -> str:
    """The node's program call (as root) that records its stack files as the state that serves,
    with ``values`` (the image's ID and the time added); the record there before becomes the
    rollback record. Nothing changes when served/ already holds this state. (``settings``: the
    node's StackSettings.)"""
    model = [arg for key, value in sorted(values["model"].items()) for arg in (f"--model-{key}", value)]
    return shlex.join(["python3", settings.programs, "stack", "record", "--stack-dir", settings.site.stack_dir, "--cluster", values["cluster"],
                       "--stack", values["stack"], "--profile", values["profile"], "--image", values["image"], *model,
                       "--model-digest", values["model_digest"]])


def restore(settings, name: str) -> str:
    """The node's program call (as root) that installs record ``name``'s stack files as its own
    (those it replaces kept as .previous) and starts them fresh, owing no backoff."""
    return shlex.join(["python3", settings.programs, "stack", "restore", "--stack-dir", settings.site.stack_dir, "--record", name,
                       "--starts", f"{settings.restarts_dir}/{settings.role}-starts"])


def on_every_node(stacks: list, scripts: list[str], what: str):
    """The head's call that runs each node's command (as root; a worker's over the fabric, as the
    deploy user's sudo) at the same time, failing naming the nodes where it failed."""
    jobs = [(settings.hostname, "here", script) if settings.role == "head" else
            (settings.hostname, target(settings.cluster.deploy_user, settings.rails), f"sudo -n {script}")
            for settings, script in zip(stacks, scripts)]
    return at_once(stacks[0].programs, jobs, what)
