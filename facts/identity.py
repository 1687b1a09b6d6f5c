"""Identity that cloned factory images share by mistake: machine ids and SSH host keys."""

from __future__ import annotations

import re
from typing import TypedDict

from pyinfra.api import FactBase

from facts.combine import read_lines

MACHINE_ID = re.compile(r"^[0-9a-f]{32}$")


class Identity(TypedDict):
    etc: str | None
    dbus: str | None
    dbus_is_link: bool
    hostname: str | None
    unreadable: list[str]


class MachineIds(FactBase[Identity]):
    """
    ``/etc/machine-id`` and ``/var/lib/dbus/machine-id`` (None where absent or empty), whether
    the D-Bus one is a symlink to the first, and the hostname.

    .. code:: python

        {"etc": "1dca2c5c40df4b3088ee14223c919d1e", "dbus": "1dca2c5c40df4b3088ee14223c919d1e",
         "dbus_is_link": True, "hostname": "spark-worker", "unreadable": []}
    """

    @staticmethod
    def default() -> Identity:
        return {"etc": None, "dbus": None, "dbus_is_link": False, "hostname": None, "unreadable": []}

    def command(self) -> str:
        return (
            'echo "etc $(cat /etc/machine-id 2>/dev/null)"; '
            'echo "dbus $(cat /var/lib/dbus/machine-id 2>/dev/null)"; '
            '[ -L /var/lib/dbus/machine-id ] && echo "dbus_is_link"; '
            'echo "hostname $(uname -n)"'
        )

    def process(self, output: list[str]) -> Identity:
        ids = self.default()

        def parse(line: str) -> None:
            key, _, value = line.strip().partition(" ")
            value = value.strip()
            if key == "dbus_is_link" and not value:
                ids["dbus_is_link"] = True
            elif key in ("etc", "dbus") and (not value or MACHINE_ID.match(value)):
                ids[key] = value or None
            elif key == "hostname" and value:
                ids["hostname"] = value
            else:
                raise ValueError(line)

        ids["unreadable"] = read_lines(output, parse)
        return ids


class HostKeys(TypedDict):
    fingerprints: dict[str, str]
    unreadable: list[str]


class SshHostKeyFingerprints(FactBase[HostKeys]):
    """
    The SHA256 fingerprint of each SSH host key, by key type.

    .. code:: python

        {"fingerprints": {"ED25519": "SHA256:3b0sYvMC0gq2...", "RSA": "SHA256:Yq7XZf3..."}, "unreadable": []}
    """

    @staticmethod
    def default() -> HostKeys:
        return {"fingerprints": {}, "unreadable": []}

    def command(self) -> str:
        return ("! command -v ssh-keygen >/dev/null || "
                "for k in /etc/ssh/ssh_host_*_key.pub; do [ -f \"$k\" ] && ssh-keygen -lf \"$k\"; done; true")

    def process(self, output: list[str]) -> HostKeys:
        fingerprints: dict[str, str] = {}

        def parse(line: str) -> None:  # "256 SHA256:abc root@host (ED25519)"
            words = line.split()
            if len(words) < 3 or not words[1].startswith("SHA256:") or not re.fullmatch(r"\(\w+\)", words[-1]):
                raise ValueError(line)
            fingerprints[words[-1].strip("()")] = words[1]

        return {"fingerprints": fingerprints, "unreadable": read_lines(output, parse)}
