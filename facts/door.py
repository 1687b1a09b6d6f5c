"""The front door as a reading, in one round trip: its package, the files the deploy writes for
it (the unit's drop-in, haproxy.cfg and hold.lua), and its service's state."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase

from facts.combine import combined, split
from facts.host_prep import FileDigests, Files, Packages, PackageStatus
from facts.units import Service, units_command, units_read
from layout import DOOR


def door_paths() -> list[str]:
    """The files the deploy writes for the front door."""
    return [DOOR["dropin"], *(f"{DOOR['dir']}/{name}" for name in DOOR["files"])]


class Door(TypedDict):
    packages: Packages
    files: Files
    service: Service
    unreadable: list[str]


class DoorState(FactBase[Door]):
    """
    On the head: whether dpkg has HAProxy (PackageStatus), the files the deploy writes for it
    (FileDigests), and its service's state as systemctl says it.

    .. code:: python

        {"packages": {"installed": ["haproxy"], "missing": [], "unreadable": []},
         "files": {"files": {"/etc/haproxy/dual-spark/haproxy.cfg": {"kind": "file", "mode": "644", ...}}, "unreadable": []},
         "service": {"active": "active", "enabled": "enabled"}, "unreadable": []}
    """

    @staticmethod
    def default() -> Door:
        return {"packages": PackageStatus.default(), "files": FileDigests.default(), "service": {"active": "unknown", "enabled": "unknown"},
                "unreadable": []}

    def command(self) -> str:
        return combined({"packages": PackageStatus().command([DOOR["package"]]), "files": FileDigests().command(door_paths()),
                         "service": units_command([DOOR["unit"]])}).get_raw_value()

    def process(self, output: list[str]) -> Door:
        sections = split(output)
        units, unreadable = units_read(sections.get("service", []))
        return {"packages": PackageStatus().process(sections.get("packages", [])), "files": FileDigests().process(sections.get("files", [])),
                "service": units.get(DOOR["unit"], {"active": "unknown", "enabled": "unknown"}), "unreadable": sections[""] + unreadable}
