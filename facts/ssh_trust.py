"""The deploy user's SSH material, and whether it logs in to another node over the fabric."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, read_lines, split
from layout import ssh_options

KEY_NAME = "id_ed25519"


class Trust(TypedDict):
    home: str | None
    public_key: str | None
    authorized_keys: list[str]
    known_hosts: list[str]
    operstate: dict[str, str]
    unreadable: list[str]


class SshTrust(FactBase[Trust]):
    """
    ``user``'s home, its public key (None where it has none), the keys it authorizes, the hosts
    it knows (first field of each known_hosts line), and the link state of ``netdevs``.

    .. code:: python

        {"home": "/home/spark", "public_key": "ssh-ed25519 AAAA... spark@spark-head",
         "authorized_keys": ["ssh-ed25519 AAAA... spark@spark-head"], "known_hosts": ["10.0.0.2", "10.0.1.2"],
         "operstate": {"enp1s0f0np0": "up"}, "unreadable": []}
    """

    @staticmethod
    def default() -> Trust:
        return {"home": None, "public_key": None, "authorized_keys": [], "known_hosts": [], "operstate": {},
                "unreadable": []}

    def command(self, user: str, netdevs: list[str]) -> StringCommand:
        ssh = StringCommand("h=$(getent passwd", QuoteString(user), "| cut -d: -f6);")
        return StringCommand(ssh, combined({
            "home": 'echo "$h"',
            "public_key": f'cat "$h/.ssh/{KEY_NAME}.pub" 2>/dev/null',
            "authorized_keys": 'cat "$h/.ssh/authorized_keys" 2>/dev/null',
            "known_hosts": "cut -d' ' -f1 \"$h/.ssh/known_hosts\" 2>/dev/null",
            "operstate": StringCommand("for n in", *(QuoteString(n) for n in netdevs),
                                       '; do [ -n "$n" ] && echo "$n $(cat "/sys/class/net/$n/operstate" 2>/dev/null || echo absent)"; done'),
        }))

    def process(self, output: list[str]) -> Trust:
        sections = split(output)
        home = [line.strip() for line in sections.get("home", []) if line.strip()]
        keys = [line.strip() for line in sections.get("public_key", []) if line.strip()]
        operstate: dict[str, str] = {}

        def parse(line: str) -> None:
            netdev, state = line.split()
            operstate[netdev] = state

        return {
            "home": home[0] if len(home) == 1 and home[0].startswith("/") else None,
            "public_key": keys[0] if len(keys) == 1 and keys[0].startswith("ssh-") else None,
            "authorized_keys": [line.strip() for line in sections.get("authorized_keys", []) if line.strip()],
            "known_hosts": [line.strip() for line in sections.get("known_hosts", []) if line.strip() and not line.startswith("#")],
            "operstate": operstate,
            "unreadable": sections[""] + read_lines(sections.get("operstate", []), parse),
        }


class Login(TypedDict):
    ok: bool
    unreadable: list[str]


class SshLogin(FactBase[Login]):
    """
    Whether ``user`` here reaches ``address`` by SSH with its key and a known host key, asking
    nothing (BatchMode), within three seconds.

    .. code:: python

        {"ok": True, "unreadable": []}
    """

    @staticmethod
    def default() -> Login:
        return {"ok": False, "unreadable": []}

    def command(self, user: str, address: str) -> StringCommand:
        return StringCommand(
            "sudo", "-n", "-u", QuoteString(user), "ssh", *ssh_options(connect_timeout=3),
            QuoteString(address), "true", "2>/dev/null", "&&", "echo", "yes", "||", "echo", "no",
        )

    def process(self, output: list[str]) -> Login:
        values = [line.strip() for line in output if line.strip()]
        if values in (["yes"], ["no"]):
            return {"ok": values == ["yes"], "unreadable": []}
        return {"ok": False, "unreadable": values}
