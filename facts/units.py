"""systemd units as a reading: each unit's active state and unit-file state, from one `systemctl
show` of them all, for the readings of the services the deploy runs (observability, the front door)."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import QuoteString, StringCommand

PROPERTIES = "Id,ActiveState,UnitFileState"


class Service(TypedDict):
    active: str  # ActiveState (as is-active says): "active", "inactive", "failed", "activating", ...; "unknown": systemctl said nothing
    enabled: str  # UnitFileState (as is-enabled says): "enabled", "disabled", "static", ...; "unknown": none (no such unit)


def units_command(units: list[str]) -> StringCommand:
    """The units asked for on one line, then systemctl's blocks of them (a blank line between two)."""
    quoted = [QuoteString(unit) for unit in units]
    return StringCommand("echo", "units", *quoted, ";", "systemctl", "show", f"--property={PROPERTIES}", "--", *quoted, "2>/dev/null")


def units_read(lines: list[str]) -> tuple[dict[str, Service], list[str]]:
    """Each unit asked for, and the lines that could not be read. A unit systemctl said nothing
    of (no systemd) reads "unknown" for both."""
    asked = next((line.split()[1:] for line in lines if line.startswith("units ")), [])
    units: dict[str, Service] = {unit: {"active": "unknown", "enabled": "unknown"} for unit in asked}
    unreadable: list[str] = []
    block: dict[str, str] = {}
    for line in [*(line.rstrip("\n") for line in lines if not line.startswith("units ")), ""]:
        key, equals, value = line.strip().partition("=")
        if equals and key in PROPERTIES.split(","):
            block[key] = value
            continue
        if line.strip():
            unreadable.append(line)
            continue
        unit = block.get("Id", "").removesuffix(".service")
        if unit in units:
            units[unit] = {"active": block.get("ActiveState") or "unknown", "enabled": block.get("UnitFileState") or "unknown"}
        elif block:
            unreadable += [f"{key}={value}" for key, value in block.items()]
        block = {}
    return units, unreadable
