"""Data-driven operation tests, as pyinfra tests its own: tests/operations/<module>.<operation>/
<case>.json holds what its case is about and what the operation must do: the commands it yields,
or with none its no-op description (``"noop"``), or the error it raises (``"exception"``);
``"printed"``: the lines pyinfra's logger prints (the repository written ``<repo>``).

- ``"site"``: a file of tests/sites/, parsed as the inventory parses a site; ``"settings"`` are
  given as --data, ``"tables"`` laid over the file's own ([model], [profile.NAME], [[node]]...).
- ``"host"``: the node the operation runs on, with the arguments its task (tasks/*.py) gives it
  there; ``"args"`` gives only what no site holds (``"role"`` picks one of a task's calls).
- ``"facts"``: what each node reads, by hostname, fact, then pyinfra's rendering of the fact's
  arguments; ``"unreachable"``: the nodes that do not answer; ``"failed"``: a node's failed step;
  ``"executing"``: the changes run (not change detection); ``"diff"``: diffs are shown. A reading's
``"sha256": "as deployed"`` is the digest of what the deploy writes at that path now.

A case need not repeat another: any object in it may name a ``"base"`` (a JSON file, relative to
the case's folder) and stands for that file with the rest of the object merged in: key by key into
objects, by index (``"3"``) into lists, ``"*"`` into every value of an object (a fact's reading
whatever its arguments); any other value replaces. A name starting with ``_`` is no case: a
folder's ``_<site>.json`` holds the readings most of its cases share, ``_readings/`` a reading
several share, ``_serving/`` what both serving folders share."""

import hashlib
import importlib
import json
import posixpath
import re
import shutil
from pathlib import Path

import pytest
from pyinfra.api import FileUploadCommand, OperationError

from operations.upload import UPLOAD_DIR
from tests.fake_host import AS_DEPLOYED, as_deployed, command_text, deployed, load, operations, run_operation, site
from tests.write_fixtures import write_case

HERE = Path(__file__).parent
FIXTURES = sorted((HERE / "operations").glob("[!_]*/[!_]*.json"))


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_operation(fixture):
    case = load(fixture)
    module, name = fixture.parent.name.rsplit(".", 1)
    op = getattr(importlib.import_module(f"operations.{module}"), name)
    if "exception" in case:
        with pytest.raises(OperationError) as error:
            run_operation(op, case)
        assert str(error.value) == case["exception"]
        return
    commands, host = run_operation(op, case)
    assert commands == case["commands"]
    if "printed" in case:
        assert host.printed == case["printed"]
    if not commands:
        assert host.noop_description == case["noop"]
    uploads_land_first_in_the_private_directory(host.commands, case_user(case))


def uploads_land_first_in_the_private_directory(commands: list, user: str) -> None:
    """Whatever an operation uploads lands first in operations/upload.py's directory, made the
    deploy user's alone just before: never under a name another local user could create first, as
    pyinfra's own hash of the destination under /tmp is."""
    for before, command in zip([None, *commands], commands):
        if isinstance(command, FileUploadCommand):
            assert posixpath.dirname(command.remote_temp_filename) == UPLOAD_DIR
            assert command_text(before).endswith(f"install -d -m 700 -o {user} {UPLOAD_DIR}")


def case_user(case: dict) -> str:
    return site(case["site"], case.get("settings"), case.get("tables")).deploy_user


def test_every_operation_has_fixtures():
    covered = {path.parent.name for path in FIXTURES}
    for module, name, _ in operations():
        assert f"{module.__name__.split('.')[-1]}.{name}" in covered, f"no fixture for {module.__name__}.{name}"


def test_a_case_is_its_base_with_the_rest_merged_in(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "reading.json").write_text(json.dumps({"pings": [{"received": 3}, {"received": 3}], "mtu": 9000}))
    (tmp_path / "base.json").write_text(json.dumps({
        "host": "a", "facts": {"a": {"Fact": {"x=1": {"base": "parts/reading.json"}, "x=2": {"base": "parts/reading.json"}}}},
        "commands": ["one"]}))
    (tmp_path / "case.json").write_text(json.dumps({
        "base": "base.json", "commands": [],
        "facts": {"a": {"Fact": {"*": {"pings": {"1": {"received": 0}}}, "x=3": {"base": "parts/reading.json", "mtu": 1500}}}}}))
    case = load(tmp_path / "case.json")
    assert case["commands"] == [] and case["host"] == "a"
    facts = case["facts"]["a"]["Fact"]
    assert facts["x=1"] == facts["x=2"] == {"pings": [{"received": 3}, {"received": 0}], "mtu": 9000}
    assert facts["x=3"] == {"pings": [{"received": 3}, {"received": 3}], "mtu": 1500}
    assert "base" not in json.dumps(load(tmp_path / "base.json"))


def test_the_cases_upload_files():
    """The check of uploads in test_operation is not idle: many cases upload."""
    uploads = sum(command[0] == "upload" for fixture in FIXTURES for command in load(fixture).get("commands", [])
                  if isinstance(command, list))
    assert uploads > 20


def test_the_writer_puts_back_what_the_code_does_and_nothing_else(tmp_path):
    """tests/write_fixtures.py on a copy of the cases: a case whose expected commands were spoiled
    gets the code's back; its readings and comment stay as written, and a case that was right is
    not touched, byte for byte."""
    copy = tmp_path / "operations"
    shutil.copytree(HERE / "operations", copy)
    spoiled, untouched = copy / "fabric.netplan_rails/changed.json", copy / "fabric.netplan_rails/new_file.json"
    case = json.loads(spoiled.read_text())
    right = case["commands"]
    spoiled.write_text(json.dumps({**case, "commands": ["rm -rf /"]}))
    before = untouched.read_bytes()
    assert write_case(spoiled) and not write_case(untouched)
    assert json.loads(spoiled.read_text()) == {**case, "commands": right} and untouched.read_bytes() == before


def test_a_digest_as_deployed_is_the_digest_of_what_the_deploy_writes_there_now():
    """A reading "as the deploy writes it" stays one when a template changes: its digest is made from
    the rendering, and one that names a file the deploy does not write fails."""
    cluster = site("pair")
    files = deployed(cluster, "spark-head")
    reading = {"files": {"/etc/prometheus/dual-spark/alerts.yml": {"mode": "644", "sha256": AS_DEPLOYED}}}
    digest = as_deployed(reading, files)["files"]["/etc/prometheus/dual-spark/alerts.yml"]["sha256"]
    assert digest == hashlib.sha256(files["/etc/prometheus/dual-spark/alerts.yml"].encode()).hexdigest()
    assert "/etc/haproxy/dual-spark/haproxy.cfg" in files and "/etc/haproxy/dual-spark/haproxy.cfg" not in deployed(cluster, "spark-worker")
    with pytest.raises(AssertionError, match="writes no such file"):
        as_deployed({"/etc/elsewhere": {"sha256": AS_DEPLOYED}}, files)


def test_the_readings_of_the_deploys_own_files_say_so_rather_than_copy_a_digest():
    """No reading holds a literal digest equal to what the deploy writes at that path now: such a
    reading is AS_DEPLOYED, or it would stop meaning "up to date" at the next template change."""
    copied = []
    for path in sorted((HERE / "operations").glob("*/*.json")):
        own = json.loads(path.read_text())
        if "site" not in (case := load(path)) or not own.get("facts"):
            continue
        cluster = site(case["site"], case.get("settings"), case.get("tables"))
        for host, facts in own["facts"].items():
            files = {name: hashlib.sha256(text.encode()).hexdigest() for name, text in deployed(cluster, host).items()}
            copied += [f"{path.relative_to(HERE)}: {name}" for name, digest in re.findall(r'"(/[^"]+)": \{[^{}]*?"sha256": "([0-9a-f]{64})"',
                                                                                          json.dumps(facts)) if files.get(name) == digest]
    assert not copied, copied
