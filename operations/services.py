"""The OS's packages and systemd services the deploy runs (observability, the front door): a
package installed only when missing; a unit's drop-in put in place and systemd reloaded; its
configuration staged whole, checked, then installed; the service restarted only when something
of its own changed or it is not running, else reloaded when its configuration changed."""

from __future__ import annotations

import posixpath
from io import BytesIO

from pyinfra.api import StringCommand
from pyinfra.operations import apt

from operations.managed import file_differs, put_config
from operations.render import show_line
from operations.upload import upload


def differs(text: str, info: dict | None, mode: str = "644", owner: str = "root:root") -> bool:
    """Whether the node's file (``info``) is not ``text``, ``owner``'s, with ``mode``."""
    return file_differs(BytesIO(text.encode()), mode, info, owner)


def units_put(units: dict[str, str], files: dict) -> tuple[list, list[str]]:
    """Each unit file or drop-in of ``units`` (path: text) that differs from the node's (``files``:
    the readings by path) made so, its diff shown, and systemd told once; the commands, and the
    paths that changed."""
    changed = [path for path, text in units.items() if differs(text, files.get(path))]
    commands = [command for path in changed for command in put_config(path, BytesIO(units[path].encode()), "644", files.get(path))]
    return (commands + [StringCommand("systemctl", "daemon-reload")] if changed else []), changed


def staged(files: dict[str, str], staging: str, private: bool = False) -> list:
    """Every file of a configuration (path: text) put in ``staging`` under its own name, so that
    it is checked whole before any of it is installed (``from_staging``); ``private``: a staging
    only root may enter (the configuration holds a secret)."""
    made = ["install", "-d", "-m", "700", staging] if private else ["mkdir", "-p", staging]
    commands = [StringCommand("rm", "-rf", staging, "&&", *made)]
    for path, text in files.items():
        commands += upload(BytesIO(text.encode()), f"{staging}/{posixpath.basename(path)}")
    return commands


def from_staging(files: list[str], staging: str, directory: str, mode: str = "644", owner: str = "root:root") -> StringCommand:
    """The checked configuration installed in ``directory``, ``owner``'s, with ``mode``; the staging gone."""
    user, group = owner.split(":")
    return StringCommand("mkdir", "-p", directory, "&&", "install", "-o", user, "-g", group, "-m", mode,
                         *(f"{staging}/{posixpath.basename(path)}" for path in files), directory, "&&", "rm", "-rf", staging)


def restarted_or_reloaded(unit: str, state: dict, why: str | None, reload: str | None) -> tuple[list, bool]:
    """``running``'s commands; when they do not restart the unit and it runs, a reload saying
    ``reload`` (what changed), if given. Also whether it restarts."""
    commands = list(running(unit, state, why))
    restarts = any(command.get_raw_value().startswith("systemctl restart") for command in commands)
    if reload and not restarts and state["active"] == "active":
        show_line(f"Will reload {unit}: {reload}")
        commands.append(StringCommand("systemctl", "reload", unit))
    return commands, restarts


def installed(reading: dict, packages: list[str]):
    """The packages of ``packages`` that are missing, installed without their recommendations
    (the node exporter recommends timers of its own); the package lists refreshed only then."""
    missing = [package for package in packages if package in reading["packages"]["missing"]]
    if missing:
        show_line(f"Will install {', '.join(missing)} (the OS's packages, without recommended ones)")
        yield from apt.update._inner()
        yield from apt.packages._inner(packages=missing, no_recommends=True)


def running(unit: str, state: dict, why: str | None):
    """Enable ``unit`` (its ``state``: systemctl's active and enabled), and restart it when
    ``why`` (its configuration changed, its package is new) or when it is not active: a unit
    whose configuration is unchanged and that runs is left alone."""
    if state["enabled"] != "enabled":
        yield StringCommand("systemctl", "enable", unit)
    if why is None and state["active"] != "active":
        why = f"it is not running ({state['active']})"
    if why is not None:
        show_line(f"Will restart {unit}: {why}")
        yield StringCommand("systemctl", "reset-failed", unit, "2>/dev/null", "||", "true")
        yield StringCommand("systemctl", "restart", unit)
