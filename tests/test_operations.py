"""Data-driven operation tests, as pyinfra tests its own: tests/operations/<module>.<operation>/
<case>.json holds the arguments, the host (and peer) with the facts the operation reads, and the
commands it must yield, or the no-op description, or the error it must raise; with "diff": true,
also the lines the diff prints ("printed")."""

import importlib
import inspect
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
