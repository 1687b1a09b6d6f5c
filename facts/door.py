"""The front door as a reading, in one round trip: its package, the files the deploy writes for
it (the unit's drop-in, haproxy.cfg and its Lua), and its service's state."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, read_lines, split
from facts.host_prep import FileDigests, Files, Packages, PackageStatus
from facts.units import Service, units_command, units_read
from layout import DOOR


def door_paths() -> list[str]:
    """The files the deploy writes for the front door."""
    return [DOOR["dropin"], *(f"{DOOR['dir']}/{name}" for name in DOOR["files"])]


class Keys(TypedDict):
    clients: dict[str, bool]  # each client's key file on the head -> whether the door's map has that key
    admitted: list[str]  # the names the door's map lets in
    deploy: bool  # whether the map lets the deploy's own key in as "deploy"
    backend: bool  # whether the door hands vLLM the deploy's key


class Door(TypedDict):
    packages: Packages
    files: Files
    service: Service
    keys: Keys
    unreadable: list[str]


def keys_command(clients: str, deploy_key: str) -> StringCommand:
    """The keys as names and yes-or-no answers, compared on the head: no key ever leaves it."""
    found, backend = QuoteString(DOOR["clients_map"]), QuoteString(DOOR["backend_map"])
    return StringCommand(
        "for f in", StringCommand(QuoteString(clients), "/*.key", _separator=""), "; do", '[ -f "$f" ] || continue;',
        'n=$(basename "$f" .key);', "if [ -f", found, "] && [ \"$(awk -v n=\"$n\" '$2==n{print $1}'", found,
        ')" = "$(cat "$f")" ]; then echo "client $n current"; else echo "client $n stale"; fi; done;',
        "[ -f", found, "] && cut -d' ' -f2", found, "| sed 's/^/admitted /';",
        "[ -f", found, "] && [ \"$(awk '$2==\"deploy\"{print $1}'", found, ')" = "$(cat', QuoteString(deploy_key), '2>/dev/null)" ]',
        "&& echo deploy current;",
        "[ -f", backend, "] && [ \"$(cut -d' ' -f2", backend, ')" = "$(cat', QuoteString(deploy_key), '2>/dev/null)" ]',
        "&& echo backend current; true")


def keys_reading(lines: list[str]) -> tuple[Keys, list[str]]:
    keys: Keys = {"clients": {}, "admitted": [], "deploy": False, "backend": False}

    def parse(line: str) -> None:
        words = line.split()
        if len(words) == 3 and words[0] == "client" and words[2] in ("current", "stale"):
            keys["clients"][words[1]] = words[2] == "current"
        elif len(words) == 2 and words[0] == "admitted":
            keys["admitted"].append(words[1])
        elif words in (["deploy", "current"], ["backend", "current"]):
            keys[words[0]] = True
        else:
            raise ValueError(line)

    return keys, read_lines([line for line in lines if line.strip()], parse)


class DoorState(FactBase[Door]):
    """
    On the head: whether dpkg has HAProxy (PackageStatus), the files the deploy writes for it
    (FileDigests), its service's state as systemctl says it, and its keys: each client's key file
    in ``clients`` and whether the door's map has it, the names the map lets in, and whether the
    deploy's own key (``deploy_key``) is the one it takes as "deploy" and hands vLLM.

    .. code:: python

        {"packages": {"installed": ["haproxy"], "missing": [], "unreadable": []},
         "files": {"files": {"/etc/haproxy/dual-spark/haproxy.cfg": {"kind": "file", "mode": "644", ...}}, "unreadable": []},
         "service": {"active": "active", "enabled": "enabled"},
         "keys": {"clients": {"laptop": True}, "admitted": ["deploy", "laptop"], "deploy": True, "backend": True}, "unreadable": []}
    """

    @staticmethod
    def default() -> Door:
        return {"packages": PackageStatus.default(), "files": FileDigests.default(), "service": {"active": "unknown", "enabled": "unknown"},
                "keys": {"clients": {}, "admitted": [], "deploy": False, "backend": False}, "unreadable": []}

    def command(self, clients: str, deploy_key: str) -> str:
        return combined({"packages": PackageStatus().command([DOOR["package"]]), "files": FileDigests().command(door_paths()),
                         "service": units_command([DOOR["unit"]]), "keys": keys_command(clients, deploy_key)}).get_raw_value()

    def process(self, output: list[str]) -> Door:
        sections = split(output)
        units, unreadable = units_read(sections.get("service", []))
        keys, bad = keys_reading(sections.get("keys", []))
        return {"packages": PackageStatus().process(sections.get("packages", [])), "files": FileDigests().process(sections.get("files", [])),
                "service": units.get(DOOR["unit"], {"active": "unknown", "enabled": "unknown"}), "keys": keys,
                "unreadable": sections[""] + unreadable + bad}
