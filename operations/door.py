"""The front door (docs/front-door.md): the OS's HAProxy on the head, answering clients at
api_host:api_port, with vLLM behind it on loopback. It holds a request while vLLM is drained for
a change (until the change has served and passed its canaries), tries one again while vLLM takes no connections (a restart, a heal), and exports
its own metrics on loopback: HAProxy's, and its Lua's counts of held requests and of each client's
requests and tokens. Its configuration is staged and checked by the real `haproxy -c`
before it is installed; a new configuration is reloaded (connections kept), a new drop-in or
package restarts it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.files import FileContents

from cluster import Cluster
from facts.door import DoorState
from layout import DOOR, RUN_DIR, VLLM_HOST, paths
from operations.managed import refuse_theirs, show_changed
from operations.own import claimed
from operations.peer import acts_here
from operations.readings import Reading, plans, read
from operations.render import render, show_diff, show_line
from operations.services import differs, from_staging, installed, restarted_or_reloaded, staged, units_put

LUA = Path(__file__).resolve().parents[1] / "files/door"
LUA_WHAT = {"counts.lua": "the door's counts, in Lua", "hold.lua": "the door's hold, in Lua"}  # as a diff names each
STAGING = f"{RUN_DIR}/door-check"


@dataclass(frozen=True)
class DoorSettings:
    """The head's front door: where clients reach it, and every file the deploy writes for it."""

    api_host: str
    api_port: int
    show_program_diffs: bool  # the Lua's full diff, not one line
    files: dict[str, str]  # path -> text: the unit's drop-in, haproxy.cfg, counts.lua, hold.lua
    clients: tuple[str, ...]  # the site's [client.NAME]s: each has a key of its own
    clients_dir: str  # their keys on the head, NAME.key
    deploy_key: str  # the deploy's own key (vLLM's), let in as "deploy"
    deploy_user: str
    state_dir: str
    programs: str


def change_lapse(settings) -> int:
    """Seconds a change may keep vLLM drained at the door (site ``settings``): its drain, its
    wait for a first token and its rollback's, and a minute. Its planned work lapses with it."""
    return settings.door_drain_seconds + 2 * settings.serving_ready_timeout + 60


def door_settings(cluster: Cluster) -> DoorSettings:
    settings = cluster.settings
    config = render("door/haproxy.cfg.j2", api_host=settings.api_host, api_port=settings.api_port, vllm_host=VLLM_HOST,
                    vllm_port=settings.vllm_port, hold=settings.serving_ready_timeout, lapse=change_lapse(settings), socket=DOOR["socket"],
                    metrics_port=settings.door_metrics_port, buffer=settings.door_request_kib * 1024, counts_path=DOOR["counts_path"],
                    clients=("deploy", *cluster.clients), clients_map=DOOR["clients_map"], backend_map=DOOR["backend_map"])
    where = paths(settings.state_dir, settings.model_dir)
    return DoorSettings(api_host=settings.api_host, api_port=settings.api_port, show_program_diffs=settings.show_program_diffs,
                        clients=cluster.clients, clients_dir=where["clients"], deploy_key=where["api_key"], deploy_user=cluster.deploy_user,
                        state_dir=settings.state_dir, programs=where["programs"], files={
        DOOR["dropin"]: render("door/haproxy.service.conf.j2", dir=DOOR["dir"]),
        f"{DOOR['dir']}/haproxy.cfg": config,
        **{f"{DOOR['dir']}/{name}": (LUA / name).read_text() for name in DOOR["files"] if name.endswith(".lua")},
    })


def reading_arguments(settings: DoorSettings) -> dict:
    return {"clients": settings.clients_dir, "deploy_key": settings.deploy_key}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    return [(DoorState, reading_arguments(door_settings(cluster)))] if cluster.node(name).role == "head" else []


def keyed(settings: DoorSettings, keys: dict):
    """Each client's key made on the head (never shown), a key whose client left the site
    removed, and the door's maps written again from the key files when they say otherwise, and
    replaced in the running door's memory: a revoked key is refused once this step ends."""
    wanted, have = set(settings.clients), set(keys["clients"])
    commands = []
    for name in sorted(wanted - have):
        show_line(f"Will make a key for client {name} on the head, never shown: `python -m clients --client {name}` writes its configuration")
    if wanted - have:
        commands.append(StringCommand(claimed(settings.programs, settings.state_dir, "state_dir"), "&&", "install", "-d", "-m", "700", "-o", settings.deploy_user,
                                      "-g", settings.deploy_user, QuoteString(settings.clients_dir)))
        for name in sorted(wanted - have):
            key = QuoteString(f"{settings.clients_dir}/{name}.key")
            commands.append(StringCommand("umask", "077", "&&", "python3", "-c", QuoteString("import secrets; print(secrets.token_urlsafe(32))"),
                                          ">", key, "&&", "chown", QuoteString(f"{settings.deploy_user}:"), key))
    for name in sorted(have - wanted):
        show_line(f"Will revoke client {name}'s key: it is no longer in the site")
        commands.append(StringCommand("rm", "-f", QuoteString(f"{settings.clients_dir}/{name}.key")))
    current = (sorted(keys["admitted"]) == sorted({"deploy", *wanted}) and keys["deploy"] and keys["backend"]
               and all(keys["clients"].get(name) for name in wanted))
    if commands or not current:
        if not commands:
            show_line("Will write the door's keys again from the key files on the head")
        commands.append(StringCommand("mkdir", "-p", DOOR["dir"], "&&", "python3", QuoteString(settings.programs), "door", "keys",
                                      "--deploy-key", QuoteString(settings.deploy_key), "--clients", QuoteString(settings.clients_dir),
                                      "--map", DOOR["clients_map"], "--backend-map", DOOR["backend_map"], "--socket", DOOR["socket"]))
    return commands


@operation()
def door_running(settings: DoorSettings):
    """
    On the head: HAProxy from the OS's packages as the front door, run by a drop-in of its unit
    with the deploy's haproxy.cfg and its Lua, counts.lua and hold.lua (the package's own
    configuration left as shipped). The drop-in is written before the package is installed; a
    configuration that changed is staged, checked by `haproxy -c` and installed, then reloaded
    without dropping a connection; a new drop-in or package restarts it, as does a door that is
    not running.

    + settings: the head's front door (``door_settings``)

    **Example:**

    .. code:: python

        door_running(settings=door_settings(cluster))
    """
    if not acts_here("head"):
        return
    reading = read(host, DoorState, **reading_arguments(settings))
    files = reading["files"]["files"]
    dropin = DOOR["dropin"]
    configs = {f"{DOOR['dir']}/{name}": settings.files[f"{DOOR['dir']}/{name}"] for name in DOOR["files"]}
    commands, dropin_changed = units_put({dropin: settings.files[dropin]}, files)
    changed = [path for path, text in configs.items() if differs(text, files.get(path))]
    for path in changed:
        exists = (files.get(path) or {}).get("kind") == "file"
        current = host.get_fact(FileContents, path=path) if exists else None
        refuse_theirs(path, current, files[path]["owner"] if exists else None)
        if path.endswith(".lua"):
            show_changed(path, configs[path], files.get(path), LUA_WHAT[Path(path).name], settings.show_program_diffs)
        else:
            show_diff(path, current, configs[path])
    if changed:
        commands += staged(configs, STAGING)
    new = list(installed(reading, [DOOR["package"]]))
    commands += new
    keys = keyed(settings, reading["keys"])
    commands += keys  # before the check: the configuration names the maps
    if changed:
        commands.append(StringCommand("haproxy", "-c", "-q", "-C", STAGING, "-f", "haproxy.cfg"))
        commands.append(from_staging(list(configs), STAGING, DOOR["dir"]))
    why = "its drop-in changed" if dropin_changed else "its package is new" if new else None
    what = "configuration" if changed else "keys" if keys else None
    commands += restarted_or_reloaded(DOOR["unit"], reading["service"], why,
                                      what and f"its {what} changed (the connections it holds are kept)")[0]
    if not commands:
        host.noop(f"the front door answers at {settings.api_host}:{settings.api_port}, its configuration up to date")
    yield from commands
