"""The way back: the states that served, recorded on every node, and the shell that returns a
node to one of them.

Once the head has generated its first token, every node's stack files are copied into
``{stack_dir}/served/`` with a state.json (the cluster's state ID, the node's stack, profile,
image, model, since when); the record there before moves to ``rollback/`` (layout.RECORDS). A
state keeps its image (the deploy removes none: each image's tag names its digest) and its model
(the model store keeps every revision a stack file names). What a state is, and how it is
named, is states.py's."""

from __future__ import annotations

import json
import shlex

from layout import STOP_TIMEOUT
from operations.own import claimed
from operations.peer import at_once, on_node

FILES = {"compose.yaml": "644", "launch.sh": "755"}




def record(stack_dir: str, values: dict) -> str:
    """Shell (as root) that records the node's stack files as the state that serves, with
    ``values`` and the image's ID and the time added; the record there before becomes the
    rollback record. Nothing changes when served/ already holds this state."""
    d = shlex.quote(stack_dir)
    text = json.dumps(values, sort_keys=True, separators=(",", ":"))
    fields = text[:-1].replace("%", "%%") + ',"image_id":"%s","since":"%s"}\\n'
    image_id = f"\"$(docker image inspect -f '{{{{.Id}}}}' {shlex.quote(values['image'])} 2>/dev/null)\""
    return (f"{claimed(stack_dir, 'stack_dir').get_raw_value()} && cd {d} && "
            f"if grep -qF {shlex.quote(json.dumps({'cluster': values['cluster']}, separators=(',', ':'))[1:-1])} served/state.json "
            "2>/dev/null; then :; else "
            "{ [ ! -d served ] || { rm -rf rollback && mv served rollback; }; } && rm -rf served.new && mkdir served.new && "
            f"cp -p {' '.join(FILES)} served.new/ && printf {shlex.quote(fields)} {image_id} \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\" "
            "> served.new/state.json && mv served.new served; fi")


def restore(settings, name: str) -> str:
    """Shell (as root) that installs record ``name``'s stack files as the node's own (those it
    replaces kept as .previous) and starts them fresh, owing no backoff."""
    d = shlex.quote(settings.stack_dir)
    copies = " && ".join(f"{{ test ! -f {f} || cp -p {f} {f}.previous; }} && install -m {mode} {name}/{f} {f}"
                         for f, mode in FILES.items())
    starts = shlex.quote(f"{settings.restarts_dir}/{settings.role}-starts")
    return (f"{claimed(settings.stack_dir, 'stack_dir').get_raw_value()} && cd {d} && "
            f"test -f {name}/compose.yaml && test -f {name}/launch.sh && {copies} && rm -f {starts} && "
            f"docker compose --project-directory {d} -f {d}/compose.yaml up -d --force-recreate --remove-orphans --timeout {STOP_TIMEOUT}")


def on_every_node(stacks: list, scripts: list[str], what: str):
    """Shell run on the head that runs each node's script (as root; a worker's over the fabric,
    as the deploy user's sudo) at the same time, failing naming the nodes where it failed."""
    jobs = []
    for settings, script in zip(stacks, scripts):
        if settings.role == "head":
            jobs.append((settings.hostname, script))
        else:
            remote = "w " + shlex.quote("sudo -n sh -c " + shlex.quote(script))
            jobs.append((settings.hostname, on_node(settings.rails, settings.deploy_user, remote).get_raw_value()))
    return at_once(jobs, what)
