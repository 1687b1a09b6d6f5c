"""Several readings in one remote command: each section's output follows a marker line, and the
output is split back into sections for each reading's own ``process``. Slow sections (pings,
SSH logins) run in the background, at the same time as each other and as the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from pyinfra.api import FactBase, StringCommand

MARK = "@@section"


def combined(sections: dict[str, str | StringCommand], background: dict[str, str | StringCommand] | None = None) -> StringCommand:
    """One shell command printing every section after its marker, background ones last. Each
    background section writes its marker and output to a file of its own; one awk prints them
    all once every one has ended, each last line ended, its nested sections renamed (``MERGE``)."""
    background = background or {}
    parts: list = []
    if background:
        parts += ["t=$(mktemp -d);"]
        for index, (name, command) in enumerate(background.items()):
            parts += ["(", "echo", f"'{MARK} {name}';", command, ")", f'>"$t/{index}"', "2>&1", "&"]
    for name, command in sections.items():
        parts += ["echo", f"'{MARK} {name}';", "{", command, ";", "}", *nesting(name, command), ";"]
    if background:
        parts += ["wait;", "awk", MERGE, *(f'"$t/{index}"' for index in range(len(background))), ";", 'rm -rf "$t";']
    parts += ["true"]
    return StringCommand(*parts)


# Each background file in turn: its first line is its marker; a marker further down is of a section
# nested in it, renamed "name.section" (as ``nesting`` renames a quick one's).
MERGE = (f"'FNR == 1 {{ p = substr($0, {len(MARK) + 2}) }} FNR > 1 && index($0, \"{MARK} \") == 1 "
         f"{{ $0 = \"{MARK} \" p \".\" substr($0, {len(MARK) + 2}) }} 1'")


def nesting(name: str, command: str | StringCommand) -> list[str]:
    """For a section that is itself combined: a filter renaming its sections "name.section"."""
    text = command if isinstance(command, str) else command.get_raw_value()
    return ["|", "sed", f"'s/^{MARK} /{MARK} {name}./'"] if MARK in text else []


def split(output: Iterable[str]) -> dict[str, list[str]]:
    """Section name -> its lines; lines before the first marker go under ""."""
    sections: dict[str, list[str]] = {"": []}
    current = ""
    for line in output:
        if line.startswith(MARK + " "):
            current = line[len(MARK) + 1:].strip()
            sections.setdefault(current, [])
        else:
            sections[current].append(line)
    return sections


def part(sections: dict[str, list[str]], name: str) -> list[str]:
    """The output of section ``name`` as its own reading saw it, nested sections marked again."""
    lines = list(sections.get(name, []))
    for key, inner in sections.items():
        if key.startswith(name + "."):
            lines += [f"{MARK} {key[len(name) + 1:]}", *inner]
    return lines


def read_lines(output: Iterable[str], parse: Callable[[str], None]) -> list[str]:
    """Feed each line to ``parse``; the lines it could not read (it raised on them)."""
    unreadable = []
    for line in output:
        try:
            parse(line)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            unreadable.append(line)
    return unreadable


@dataclass(frozen=True)
class Section:
    """One section of a reading: its command from the fact's arguments (None: not on this node; a
    dict: sections of their own, by name), its value from the node's output (the sections by name,
    and its own name), its value where nothing was read, and whether it runs in the background, a
    process of its own beside the others."""

    command: Callable[[dict], StringCommand | dict[str, StringCommand] | None]
    value: Callable[[dict[str, list[str]], str], object]
    default: Callable[[], object] = lambda: None
    background: bool = False


def of(fact: type[FactBase], arguments: Callable[[dict], tuple] = lambda _: (), background: bool = False,
       nested: bool = False) -> Section:
    """The section of another fact of facts/, read as that fact reads its output (``nested``: its
    own sections marked again)."""
    return Section(lambda given: fact().command(*arguments(given)),
                   lambda sections, name: fact().process(part(sections, name) if nested else sections.get(name, [])),
                   fact.default, background)


def table_command(table: dict[str, Section], given: dict, numbered: dict[str, str] | None = None) -> StringCommand:
    """One command of every section of ``table`` for the fact's arguments ``given``, in the table's
    order, the background ones last: a section's list of commands (one per target) runs as
    sections "PREFIX 0", "PREFIX 1", ... (``numbered`` names PREFIX), a dict as the sections it names."""
    quick: dict = {}
    background: dict = {}
    for name, section in table.items():
        command = section.command(given)
        if command is None:
            continue
        if isinstance(command, list):
            parts = {f"{(numbered or {})[name]} {index}": each for index, each in enumerate(command)}
        else:
            parts = command if isinstance(command, dict) else {name: command}
        (background if section.background else quick).update(parts)
    return combined(quick, background)
