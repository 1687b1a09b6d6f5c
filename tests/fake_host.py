"""A small fake host for testing operations without one, in the manner of pyinfra's own
tests/util.py: facts come from a fixture (by fact name, then by arguments), commands are
collected as text, the no-op description and what pyinfra's logger printed are recorded. The
cluster is a site file of tests/sites/ through the real parse, the operation's arguments those its
task gives it."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import importlib
import inspect
import json
import logging
import re
import runpy
import tempfile
import tomllib
from contextlib import ExitStack, contextmanager
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import click
from pyinfra import logger
from pyinfra.api import FileUploadCommand, FunctionCommand, StringCommand
from pyinfra.api.util import get_kwargs_str
from pyinfra.context import ctx_host, ctx_inventory, ctx_state

import programs
from cluster import Cluster
from facts.node import NodeState
from site_config import inventory_groups, load_site
from site_schema import toml_value

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
        self.read: list[tuple[str, dict]] = []  # every fact read of this host: (fact key, arguments)
        self.classes: dict[str, type] = {}  # the fact class of each key read

    def get_fact(self, cls, **kwargs):
        self.read.append((fact_key(cls), kwargs))
        self.classes[fact_key(cls)] = cls
        if cls is NodeState:  # each reading from the fixture, as the fact alone would read it; None where it has none
            return {"readings": [self.facts.get(name, {}).get(args_key(arguments)) for name, arguments in kwargs["readings"]],
                    "unreadable": []}
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


def argument_text(argument):
    """A callback's argument as a fixture holds it: commands (also in a list) as their text, a
    tuple as a list."""
    if isinstance(argument, (list, tuple)):
        return [argument_text(item) for item in argument]
    return command_text(argument) if isinstance(argument, StringCommand) else argument


def command_text(command, rendered=lambda: {}) -> str | list:
    """A command as a fixture writes it. An upload of bytes: the programs' archive as built now, a
    file the deploy renders (``rendered()``: path by text) named by its path, anything else by size
    and digest; so that a change to a template or a program changes no fixture's upload."""
    if isinstance(command, str):
        return command.strip()
    if isinstance(command, StringCommand):
        return command.get_raw_value()
    if isinstance(command, FileUploadCommand):
        source = command.src
        if hasattr(source, "read"):
            source.seek(0)
            source = source.read()
        if source == programs.built():
            source = "<the programs' archive (programs.py)>"
        elif isinstance(source, bytes) and (path := rendered().get(source.decode(errors="replace"))):
            source = f"<{path} as deployed>"
        elif isinstance(source, bytes):
            source = f"<{len(source)} bytes, sha256 {hashlib.sha256(source).hexdigest()}>"
        return ["upload", source, command.dest]
    if isinstance(command, FunctionCommand):
        return ["function", command.function.__name__, *(argument_text(arg) for arg in command.args)]
    raise TypeError(f"{command!r} is not a pyinfra command")


class Printed(logging.Handler):
    """The lines pyinfra's logger prints, without colour, the repository written ``<repo>``."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(click.unstyle(record.getMessage()).replace(str(REPO), "<repo>"))


AS_DEPLOYED = "as deployed"  # a reading's sha256 of a file the deploy writes: the digest of what it writes there now


def deployed(cluster: Cluster, hostname: str) -> dict[str, str]:
    """The text of each file the deploy writes by rendering, by path, on ``hostname``."""
    # imported when needed: loading this module loads no operation module (the tests of the readings'
    # plan load them in an order of their own)
    from operations.door import door_settings
    from operations.observability import observability_settings
    files = dict(observability_settings(cluster, hostname).files)
    return files | door_settings(cluster).files if cluster.node(hostname).role == "head" else files


def rendered(cluster: Cluster, hostname: str) -> dict[str, str]:
    """``deployed`` the other way round: each file's path by its text (once per site: ``site``
    gives one cluster object for the same arguments)."""
    key = (id(cluster), hostname)
    if key not in _RENDERED:
        _RENDERED[key] = {text: path for path, text in deployed(cluster, hostname).items()}
    return _RENDERED[key]


_RENDERED: dict[tuple[int, str], dict[str, str]] = {}


def as_deployed(facts, files: dict[str, str], path: str | None = None):
    """``facts`` with every ``{"sha256": AS_DEPLOYED}`` under a path's key made the digest of what
    the deploy writes there (``files``), so that a reading "as the deploy writes it" stays one
    when a template changes; a path it does not write fails the test."""
    if isinstance(facts, list):
        return [as_deployed(item, files) for item in facts]
    if not isinstance(facts, dict):
        return facts
    if facts.get("sha256") == AS_DEPLOYED:
        assert path in files, f"{path}: the deploy writes no such file here, so it has no digest {AS_DEPLOYED!r}"
        return {**facts, "sha256": hashlib.sha256(files[path].encode()).hexdigest()}
    return {key: as_deployed(value, files, key) for key, value in facts.items()}


def load(path: Path) -> dict:
    """A JSON case with every ``"base"`` in it resolved (tests/test_operations.py says how), and
    each digest ``AS_DEPLOYED`` in a file's own readings made from what the deploy writes for
    that file's site and settings (its base's, with its own laid over them): a case that changes
    a setting finds the base's files as they were."""
    case = json.loads(path.read_text())
    if AS_DEPLOYED in json.dumps(case.get("facts", {})):
        whole = resolved(case, path.parent)
        cluster = site(whole["site"], whole.get("settings"), whole.get("tables"))
        case["facts"] = {name: as_deployed(facts, deployed(cluster, name)) for name, facts in case["facts"].items()}
    return resolved(case, path.parent)


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


def with_settings(stack, **changes):
    """A node's StackSettings with the site's settings changed, past the schema's checks (a test's
    own paths, values the schema would refuse)."""
    site = dataclasses.replace(stack.cluster.settings, **changes)
    return dataclasses.replace(stack, cluster=dataclasses.replace(stack.cluster, settings=site))


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
        patched.write_text("".join(f"{json.dumps(key)} = {toml_value(value)}\n" for key, value in raw.items()))
        return load_site(patched, json.loads(settings))


def operations():
    """Every operation of the project: (its module, its name, the operation)."""
    for path in sorted((REPO / "operations").glob("*.py")):
        module = importlib.import_module(f"operations.{path.stem}")
        for name, value in vars(module).items():
            if callable(value) and hasattr(value, "_inner") and inspect.getmodule(value._inner) is module:
                yield module, name, value


def recorder(name: str, calls: list):
    """An operation that only records how it was called."""
    return lambda **arguments: calls.append((name, arguments))


def task_arguments(op, given: dict) -> dict:
    """The arguments the task that calls ``op`` (tasks/*.py) gives it on this host, ``name`` aside:
    the task runs with every operation recorded, none run. Of a task that calls it more than once,
    the call whose text and number arguments agree with ``given``."""
    module, name = op._inner.__module__, op._inner.__name__
    calls = []
    with ExitStack() as stack:
        for owner, other, _ in operations():
            stack.enter_context(mock.patch.object(owner, other, recorder(other, calls)))
        for task in sorted((REPO / "tasks").glob("*.py")):
            if re.search(rf"^from {re.escape(module)} import .*\b{name}\b", task.read_text(), re.MULTILINE):
                runpy.run_path(str(task))
    found = [{key: value for key, value in arguments.items() if key != "name"} for called, arguments in calls if called == name]
    if len(found) > 1:
        found = [arguments for arguments in found
                 if all(arguments[key] == value for key, value in given.items() if isinstance(value, (str, int)) and key in arguments)]
    (arguments,) = found
    return arguments


def fake_hosts(case: dict, state) -> dict[str, FakeHost]:
    """Every node of the case's site as a host: its inventory data, its facts (``"facts"`` by
    hostname); a node in ``"unreachable"`` does not answer, one in ``"failed"`` failed that step."""
    cluster = site(case["site"], case.get("settings"), case.get("tables"))
    strangers = set(case.get("facts", {})) - {node.hostname for node in cluster.nodes}
    assert not strangers, f"readings for {sorted(strangers)}, no node of site {case['site']}"
    hosts = {}
    for name, data in (node for group in inventory_groups(cluster).values() for node in group):
        reachable = name not in case.get("unreachable", [])
        hosts[name] = FakeHost(name, data, case.get("facts", {}).get(name, {}), state, connected=reachable)
        if not reachable:
            state.failed_hosts.add(hosts[name])
        if name in case.get("failed", {}):  # it answers, but a step of this run failed on it
            state.failed_hosts.add(hosts[name])
            failed = SimpleNamespace(is_complete=lambda: True, did_succeed=lambda: False, executed=True)
            state.ops[hosts[name]] = {case["failed"][name]: SimpleNamespace(operation_meta=failed)}
    return hosts


@contextmanager
def running(case: dict):
    """pyinfra's context on the case's ``"host"``: the case's state and every node as a host
    (``fake_hosts``), by name."""
    changes = {name: SimpleNamespace(ops_change=count) for name, count in case.get("changes", {}).items()}
    state = SimpleNamespace(
        get_meta_for_host=lambda node: changes.get(node.name, SimpleNamespace(ops_change=0)),
        is_executing=case.get("executing", False),
        failed_hosts=set(),
        config=SimpleNamespace(DIFF=case.get("diff", False), TEMP_DIR=None, DEFAULT_TEMP_DIR="/tmp"),
        print_noop_info=False,
        cwd=None,
        ops={},
        get_op_meta=lambda op_hash: SimpleNamespace(names={op_hash}),
    )
    hosts = fake_hosts(case, state)
    with ctx_state.use(state), ctx_host.use(hosts[case["host"]]), ctx_inventory.use(FakeInventory(hosts)):
        yield state, hosts


def run_operation(op, case: dict) -> tuple[list, FakeHost]:
    """Run an operation's generator on the case's ``"host"`` with the arguments its task gives it
    there, ``"args"`` laid over them; diffs on if the case says ``"diff": true``. Its commands, and
    the host with what was printed (``host.printed``), every node (``host.nodes``) and the commands
    as pyinfra objects (``host.commands``)."""
    printed = Printed()
    with ExitStack() as stack:
        logger.addHandler(printed)
        stack.callback(logger.removeHandler, printed)
        stack.callback(logger.setLevel, logger.level)
        logger.setLevel(logging.INFO)
        _, hosts = stack.enter_context(running(case))
        given = case.get("args", {})
        arguments = {**task_arguments(op, given), **given}
        raw = list(op._inner(**arguments))
        cluster = site(case["site"], case.get("settings"), case.get("tables"))
        commands = [command_text(command, lambda: rendered(cluster, case["host"])) for command in raw]
    host = hosts[case["host"]]
    host.printed, host.nodes, host.commands = printed.lines, hosts, raw
    return commands, host
