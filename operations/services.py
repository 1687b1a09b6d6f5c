"""The OS's packages and systemd services the deploy runs (observability, the front door): a
package installed only when missing, a service restarted only when something of its own changed
or it is not running."""

from __future__ import annotations

from pyinfra.api import StringCommand
from pyinfra.operations import apt

from operations.render import show_line


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
