"""A small fake host for testing operations without one, in the manner of pyinfra's own
tests/util.py: facts come from a fixture (by fact name, then by arguments), commands are
collected as text, the no-op description and what pyinfra's logger printed are recorded."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import ipaddress
import json
import logging
import tempfile
import tomllib
import typing
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import click
from pyinfra import logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.util import get_kwargs_str
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

import serving_data
from cluster import Cluster, Image, Model, Node, Profile, Rail, Settings
from site_config import default_settings, load_site

REPO = Path(__file__).resolve().parents[1]
SITES = REPO / "tests" / "sites"


def fact_key(cls) -> str:
    return f"{cls.__module__.split('.')[-1]}.{cls.__name__}"


def args_key(kwargs: dict) -> str:
    """The fixture key of a fact's arguments: pyinfra's own rendering, sorted."""
    return ", ".join(sorted(get_kwargs_str(kwargs).split(", "))) if kwargs else ""


class FakeHost:
    def __init__(self, name: str, data: dict, facts: dict, state, connected: bool = True):
        self.name = name
        self.data = SimpleNamespace(**data)
        self.facts = facts
        self.state = state
        self.connected = connected
        self.noop_description: str | None = None
        self.print_prefix = f"[{name}] "
        self.in_op = True
        self.current_op_global_arguments = None

    def get_fact(self, cls, **kwargs):
        key = fact_key(cls)
        if key not in self.facts:
            raise KeyError(f"{self.name}: missing test fact {key}")
        by_args = self.facts[key]
        wanted = args_key(kwargs)
        if wanted not in by_args:
            raise KeyError(f"{self.name}: missing test fact {key} for ({wanted}); have: {list(by_args)}")
        return by_args[wanted]

    def noop(self, description: str) -> None:
        self.noop_description = description

    def log(self, message: str, log_func=logger.info) -> None:
        log_func(f"{self.print_prefix}{message}")

    def connect(self, **kwargs) -> None:
        pass

    def get_temp_filename(self, hash_key: str | None = None, **kwargs) -> str:
        return "_tempfile_"


class FakeInventory:
    def __init__(self, hosts: dict[str, FakeHost]):
        self.hosts = hosts

    def get_host(self, name: str) -> FakeHost:
        return self.hosts[name]


def command_text(command) -> str | list:
    if isinstance(command, str):
        return command.strip()
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        source = command.src
        if hasattr(source, "read"):
            source.seek(0)
            source = source.read()
        if isinstance(source, bytes):
            source = f"<{len(source)} bytes, sha256 {hashlib.sha256(source).hexdigest()}>"
        return ["upload", source, command.dest]
    if isinstance(command, FunctionCommand):
        return ["function", command.function.__name__, *(command_text(arg) if isinstance(arg, StringCommand) else arg
                                                         for arg in command.args)]
    raise TypeError(f"{command!r} is not a pyinfra command")


class Printed(logging.Handler):
    """The lines pyinfra's logger prints, without colour."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(click.unstyle(record.getMessage()))


def load(path: Path) -> dict:
    """A JSON case with every ``"base"`` in it resolved (tests/test_operations.py says how)."""
    return resolved(json.loads(path.read_text()), path.parent)


def resolved(value, folder: Path):
    if isinstance(value, list):
        return [resolved(item, folder) for item in value]
    if not isinstance(value, dict):
        return value
    if "base" in value:
        base = folder / value["base"]
        return merged(load(base), {key: item for key, item in value.items() if key != "base"}, folder)
    return {key: resolved(item, folder) for key, item in value.items()}


def merged(base, patch, folder: Path):
    """``base`` with ``patch`` merged in: key by key into objects, by index into lists, ``"*"``
    into every value of an object; any other value replaces."""
    if not isinstance(patch, dict) or "base" in patch or not isinstance(base, (dict, list)):
        return resolved(patch, folder)
    out = dict(base) if isinstance(base, dict) else list(base)
    for key, change in patch.items():
        if isinstance(out, list):
            targets = [int(key)]
        else:
            targets = list(out) if key == "*" else [key]
        for target in targets:
            known = isinstance(out, list) or target in out
            out[target] = merged(out[target], change, folder) if known else resolved(change, folder)
    return out


def toml(value) -> str:
    """A TOML value, tables inline."""
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(key)} = {toml(item)}" for key, item in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml(item) for item in value) + "]"
    return json.dumps(value)


def site(name: str, settings: dict | None = None, tables: dict | None = None) -> Cluster:
    """The cluster of tests/sites/<name>.toml, parsed as the inventory parses a site: ``tables``
    laid over the file's tables (merged as a case's patch), ``settings`` given as --data."""
    return _site(name, json.dumps(settings or {}), json.dumps(tables or {}))


@functools.cache
def _site(name: str, settings: str, tables: str) -> Cluster:
    path = SITES / f"{name}.toml"
    if tables == "{}":
        return load_site(path, json.loads(settings))
    raw = merged(tomllib.loads(path.read_text()), json.loads(tables), SITES)
    with tempfile.TemporaryDirectory() as directory:
        patched = Path(directory) / path.name
        patched.write_text("".join(f"{json.dumps(key)} = {toml(value)}\n" for key, value in raw.items()))
        return load_site(patched, json.loads(settings))


def cluster_of(spec: dict) -> Cluster:
    """A fixture's ``"cluster"``: {"nodes": [{"hostname", "ssh_host", "rails": [{"netdev", "rdma",
    "address": CIDR, "gid_index"?}]}], "settings": {...}, "serving": {"model", "images",
    "profiles"}}, nodes in rank order. What it leaves out is group_data's: the settings'
    defaults, the model, and an image or profile laid over the first one declared there."""
    nodes = tuple(
        Node(rank, node["hostname"], node["ssh_host"],
             tuple(Rail(r["netdev"], r["rdma"], ipaddress.IPv4Interface(r["address"]), r.get("gid_index", "auto")) for r in node["rails"]))
        for rank, node in enumerate(spec["nodes"])
    )
    settings = {**default_settings(), "topology": "direct" if len(nodes) == 2 else "switch", **spec.get("settings", {})}
    served, given = serving_data.defaults(), spec.get("serving", {})
    model = {**served["model"], **given.get("model", {})}
    if "path" in given.get("model", {}):
        model.pop("repo"), model.pop("revision")
    first_image, first_profile = next(iter(served["image"].values())), next(iter(served["profile"].values()))
    images = {name: Image(**{"env": {}, "tag": f"dual-spark/{name}:fixture", **served["image"].get(name, first_image), **image})
              for name, image in {**served["image"], **given.get("images", {})}.items()}
    profiles = {name: Profile(**{**served["profile"].get(name, first_profile), **profile})
                for name, profile in {**served["profile"], **given.get("profiles", {})}.items()}
    return Cluster(Path("site.toml"), spec.get("deploy_user", "spark"), None, 22, None, nodes, Settings(**settings), Model(**model),
                   images, profiles)


def typed(value, hint):
    """A fixture's JSON ``value`` as the operation's parameter ``hint`` takes it: a dataclass
    from its object, field by field; a list of them from a list."""
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        hints = typing.get_type_hints(hint)
        return hint(**{key: typed(item, hints[key]) for key, item in value.items()})
    if typing.get_origin(hint) is list and isinstance(value, list):
        (item_hint,) = typing.get_args(hint)
        return [typed(item, item_hint) for item in value]
    return value


def typed_arguments(op, arguments: dict) -> dict:
    hints = typing.get_type_hints(op._inner)
    return {name: typed(value, hints.get(name)) for name, value in arguments.items()}


def run_operation(op, case: dict) -> tuple[list, FakeHost]:
    """Run an operation's generator against the fixture's host and the other nodes (``"peer"``,
    then ``"others"``), with the fixture's ``"cluster"`` in every node's data, diffs on if the
    case says ``"diff": true``; its commands, and the host with what was printed (``host.printed``)."""
    state = SimpleNamespace(
        is_executing=case.get("executing", False),
        failed_hosts=set(),
        config=SimpleNamespace(DIFF=case.get("diff", False), TEMP_DIR=None, DEFAULT_TEMP_DIR="/tmp"),
        print_noop_info=False,
        cwd=None,
        ops={},
        get_op_meta=lambda op_hash: SimpleNamespace(names={op_hash}),
    )
    common = {"cluster": cluster_of(case["cluster"])} if "cluster" in case else {}
    host_case = case["host"]
    host = FakeHost(host_case["name"], {**common, **host_case.get("data", {})}, host_case.get("facts", {}), state)
    hosts = {host.name: host}
    for other in ([case["peer"]] if "peer" in case else []) + case.get("others", []):
        reachable = other.get("reachable", True)
        peer = FakeHost(other["name"], {**common, **other.get("data", {})}, other.get("facts", {}), state, connected=reachable)
        hosts[peer.name] = peer
        if not reachable:
            state.failed_hosts.add(peer)
        if "failed_step" in other:  # it answers, but a step of this run failed on it
            state.failed_hosts.add(peer)
            failed = SimpleNamespace(is_complete=lambda: True, did_succeed=lambda: False)
            state.ops[peer] = {other["failed_step"]: SimpleNamespace(operation_meta=failed)}
    printed = Printed()
    with ExitStack() as stack:
        logger.addHandler(printed)
        stack.callback(logger.removeHandler, printed)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.INFO)
        stack.enter_context(ctx_state.use(state))
        stack.enter_context(ctx_host.use(host))
        stack.enter_context(ctx_inventory.use(FakeInventory(hosts)))
        commands = [command_text(command) for command in op._inner(**typed_arguments(op, case.get("args", {})))]
    host.printed = printed.lines
    return commands, host
