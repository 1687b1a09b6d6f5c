"""Data-driven fact tests: tests/facts/<module>.<Fact>/<case>.json holds the fact's arguments,
the raw output lines a host printed and the value the fact must make of them."""

import importlib
import json
from pathlib import Path

import pytest

FIXTURES = sorted((Path(__file__).parent / "facts").glob("*/*.json"))


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_fact_reads_real_output(fixture):
    case = json.loads(fixture.read_text())
    module, name = fixture.parent.name.rsplit(".", 1)
    fact = getattr(importlib.import_module(f"facts.{module}"), name)()
    assert str(fact.command(**case.get("args", {})))
    assert fact.process(case["output"]) == case["fact"]


def test_every_fact_has_a_fixture():
    from pyinfra.api import FactBase

    covered = {path.parent.name for path in FIXTURES}
    for path in sorted((Path(__file__).parents[1] / "facts").glob("*.py")):
        module = importlib.import_module(f"facts.{path.stem}")
        for name, value in vars(module).items():
            if isinstance(value, type) and issubclass(value, FactBase) and value.__module__ == module.__name__:
                assert f"{path.stem}.{name}" in covered, f"no fixture for facts.{path.stem}.{name}"


def test_a_missing_tool_reads_as_absent_not_as_a_crash():
    from facts.fabric import DfPing, NetworkManagerDevices
    from facts.identity import SshHostKeyFingerprints

    assert DfPing().requires_command(netdev="enp1s0f0np0", address="10.0.0.2", size=8972) == "ping"
    assert DfPing.default()["error"] == "ping is not installed"
    assert NetworkManagerDevices().requires_command() == "nmcli" and NetworkManagerDevices.default() == {}
    assert SshHostKeyFingerprints().requires_command() == "ssh-keygen" and SshHostKeyFingerprints.default() == {}
