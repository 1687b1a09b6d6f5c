"""systemd units as a reading: each unit's `systemctl is-active` and `is-enabled`, for the
readings of the services the deploy runs (observability, the front door)."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import QuoteString, StringCommand

from facts.combine import read_lines


class Service(TypedDict):
    active: str  # systemctl is-active: "active", "inactive", "failed", "activating", ...; "unknown": it said nothing
    enabled: str  # systemctl is-enabled: "enabled", "disabled", ...; "unknown": it said nothing (no such unit)


def units_command(units: list[str]) -> StringCommand:
    return StringCommand(
        "for u in", *(QuoteString(unit) for unit in units), "; do",
        'echo "unit $u|$(systemctl is-active "$u" 2>/dev/null | head -n 1)|$(systemctl is-enabled "$u" 2>/dev/null | head -n 1)";',
        "done")


def units_read(lines: list[str]) -> tuple[dict[str, Service], list[str]]:
    """Each unit's state, and the lines that could not be read."""
    units: dict[str, Service] = {}

    def parse(line: str) -> None:
        unit, active, enabled = line.strip().split("|")
        if not unit.startswith("unit ") or " " in unit[5:] or not unit[5:]:
            raise ValueError(line)
        units[unit[5:]] = {"active": active.strip() or "unknown", "enabled": enabled.strip() or "unknown"}

    return units, read_lines([line for line in lines if line.strip()], parse)
