"""Resource limits as a new login of the deploy user gets them (through PAM)."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand


class Memlock(TypedDict):
    limit: str | None
    unreadable: list[str]


class LoginMemlock(FactBase[Memlock]):
    """
    ``ulimit -l`` of a fresh login of ``user`` (sudo -i goes through pam_limits, as an OpenSSH
    login does): "unlimited" or a size in KiB; None if it could not be read. Sessions opened
    before a limits change keep the old value, and Tailscale SSH bypasses pam_limits altogether.

    .. code:: python

        {"limit": "unlimited", "unreadable": []}
    """

    @staticmethod
    def default() -> Memlock:
        return {"limit": None, "unreadable": []}

    def command(self, user: str) -> StringCommand:
        return StringCommand("sudo", "-n", "-i", "-u", QuoteString(user), "sh", "-c", "'ulimit -l'", "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> Memlock:
        values = [line.strip() for line in output if line.strip()]
        if values and (values[-1] == "unlimited" or values[-1].isdecimal()):
            return {"limit": values[-1], "unreadable": []}
        return {"limit": None, "unreadable": values}
