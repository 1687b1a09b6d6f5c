"""Data-driven operation tests, as pyinfra tests its own: tests/operations/<module>.<operation>/
<case>.json holds the arguments, the host and the other nodes ("peer", "others") with the facts
the operation reads, the "cluster" they form, and the commands it must yield, or the no-op
description, or the error it must raise; with "diff": true, also the lines the diff prints
("printed").

A case need not repeat another: any object in it may name a ``"base"`` (a JSON file, relative to
the case's folder; shared parts that are no case of their own live in a subfolder) and stands for
that file with the rest of the object merged in. Merging goes key by key into objects, by index
(``"3"``) into lists, and ``"*"`` into every value of an object (e.g. a fact's reading whatever
its arguments); any other value replaces. So a change of shape is one edit in the base."""

import importlib
import inspect
import json
from pathlib import Path

import pytest
from pyinfra.api import OperationError

from tests.fake_host import load, run_operation

HERE = Path(__file__).parent
FIXTURES = sorted((HERE / "operations").glob("*/*.json"))


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


def test_every_operation_has_fixtures():
    covered = {path.parent.name for path in FIXTURES}
    for path in sorted((HERE.parent / "operations").glob("*.py")):
        module = importlib.import_module(f"operations.{path.stem}")
        for name, value in vars(module).items():
            if callable(value) and hasattr(value, "_inner") and inspect.getmodule(value._inner) is module:
                assert f"{path.stem}.{name}" in covered, f"no fixture for operations.{path.stem}.{name}"


def test_a_case_is_its_base_with_the_rest_merged_in(tmp_path):
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "reading.json").write_text(json.dumps({"pings": [{"received": 3}, {"received": 3}], "mtu": 9000}))
    (tmp_path / "base.json").write_text(json.dumps({
        "host": {"name": "a", "facts": {"Fact": {"x=1": {"base": "parts/reading.json"}, "x=2": {"base": "parts/reading.json"}}}},
        "commands": ["one"]}))
    (tmp_path / "case.json").write_text(json.dumps({
        "base": "base.json", "commands": [],
        "host": {"facts": {"Fact": {"*": {"pings": {"1": {"received": 0}}}, "x=3": {"base": "parts/reading.json", "mtu": 1500}}}}}))
    case = load(tmp_path / "case.json")
    assert case["commands"] == [] and case["host"]["name"] == "a"
    facts = case["host"]["facts"]["Fact"]
    assert facts["x=1"] == facts["x=2"] == {"pings": [{"received": 3}, {"received": 0}], "mtu": 9000}
    assert facts["x=3"] == {"pings": [{"received": 3}, {"received": 3}], "mtu": 1500}
    assert "base" not in json.dumps(load(tmp_path / "base.json"))
