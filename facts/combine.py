"""Several readings in one remote command: each section's output follows a marker line, and the
output is split back into sections for each reading's own ``process``. Slow sections (pings,
SSH logins) run in the background, at the same time as each other and as the rest."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from pyinfra.api import StringCommand

MARK = "@@section"


def combined(sections: dict[str, str | StringCommand], background: dict[str, str | StringCommand] | None = None) -> StringCommand:
    """One shell command printing every section after its marker, background ones last."""
    background = background or {}
    parts: list = []
    if background:
        parts += ["t=$(mktemp -d);"]
        for index, command in enumerate(background.values()):
            parts += ["(", command, ")", f'>"$t/{index}"', "2>&1", "&"]
    for name, command in sections.items():
        parts += ["echo", f"'{MARK} {name}';", "{", command, ";", "}", *nesting(name, command), ";"]
    if background:
        parts += ["wait;"]
        for index, (name, command) in enumerate(background.items()):
            parts += ["echo", f"'{MARK} {name}';", "cat", f'"$t/{index}"', *nesting(name, command), ";"]
        parts += ['rm -rf "$t";']
    parts += ["true"]
    return StringCommand(*parts)


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
