"""Several readings of one node in one round trip: the facts the steps of a run read there,
each in a subshell of its own (no variable of one reaches another, nothing of its stderr read),
all at the same time."""

from __future__ import annotations

import importlib
from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.combine import combined, part, split


class Readings(TypedDict):
    readings: list[Any]
    unreadable: list[str]


def fact_named(name: str) -> type[FactBase] | None:
    """The fact class of facts/ named "module.Class"; None for any other name."""
    module, _, cls = name.partition(".")
    if not (module.isidentifier() and cls.isidentifier()):
        return None
    try:
        found = getattr(importlib.import_module(f"facts.{module}"), cls, None)
    except ImportError:
        return None
    return found if isinstance(found, type) and issubclass(found, FactBase) else None


class NodeState(FactBase[Readings]):
    """
    ``readings`` names each reading as ["module.Class" of facts/, its arguments]; the reading of
    each, in that order, is what that fact read alone makes of the same output (its stdout, a
    last line ended): its ``default()`` where it printed nothing, None where its section is missing
    (the list ends with the last section found).

    .. code:: python

        {"readings": [{"installed": ["rsync"], "missing": [], "unreadable": []}, {...MachineIds...}],
         "unreadable": []}
    """

    @staticmethod
    def default() -> Readings:
        return {"readings": [], "unreadable": []}

    def command(self, readings: list) -> StringCommand:
        facts = [(name, fact_named(name), arguments) for name, arguments in readings]
        if unknown := [name for name, fact, _ in facts if fact is None]:
            raise ValueError(f"not a fact of facts/: {', '.join(unknown)}")
        return combined({}, {
            f"{index} {name}": StringCommand("(", fact().command(**arguments), ")", "2>/dev/null")
            for index, (name, fact, arguments) in enumerate(facts)
        })

    def process(self, output: list[str]) -> Readings:
        sections = split(output)
        found = {int(words[0]): (key, fact) for key in sections
                 if len(words := key.split(" ")) == 2 and words[0].isdecimal() and words[1].count(".") == 1  # not a nested one
                 and (fact := fact_named(words[1])) is not None}
        readings: list[Any] = [None] * (max(found) + 1 if found else 0)
        for index, (key, fact) in found.items():
            lines = part(sections, key)
            readings[index] = fact().process(lines) if lines else fact.default()
        return {"readings": readings, "unreadable": sections[""]}
