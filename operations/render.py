"""Templates rendered on the control machine, and the diff shown before a rendered file changes."""

from __future__ import annotations

import shlex
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pyinfra import host, logger, state
from pyinfra.operations.util.files import generate_color_diff

TEMPLATES = Environment(
    loader=FileSystemLoader(Path(__file__).resolve().parents[1] / "templates"),
    undefined=StrictUndefined,
    keep_trailing_newline=True,
)
TEMPLATES.filters["shell_quote"] = shlex.quote


def shell_lines(args: list[str]) -> list[str]:
    """A command's arguments quoted for the shell, a flag and its value to a line."""
    lines: list[str] = []
    for arg in args:
        if lines and not arg.startswith("--") and lines[-1].startswith("--") and " " not in lines[-1]:
            lines[-1] += " " + shlex.quote(arg)
        else:
            lines.append(shlex.quote(arg))
    return lines


TEMPLATES.filters["shell_lines"] = shell_lines


def listed(names: list[str]) -> str:
    """Names as prose: ``a``, ``a and b``, ``a, b and c``."""
    return " and ".join(filter(None, [", ".join(names[:-1]), names[-1]]))


TEMPLATES.filters["listed"] = listed


def render(template: str, **values) -> str:
    return TEMPLATES.get_template(template).render(**values)


def show_line(message: str) -> None:
    """One line of the diff (a change told rather than shown), when diffs are on."""
    if state.config.DIFF:
        host.log(message, logger.info)


def show_diff(path: str, current: list[str] | None, desired: str) -> None:
    """The unified diff from the node's lines to the desired text, when diffs are on."""
    if not state.config.DIFF:
        return
    host.log(f"Will {'modify' if current is not None else 'create'} {path}", logger.info)
    for line in generate_color_diff([line + "\n" for line in current or []], [line + "\n" for line in desired.splitlines()]):
        logger.info("  %s", line)
