"""Resource limits as a new login of the deploy user gets them (through PAM)."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand


class LoginMemlock(FactBase[str]):
    """
    ``ulimit -l`` of a fresh login of ``user`` (sudo -i goes through pam_limits, as an
    OpenSSH login does): ``"unlimited"`` or a size in KiB. Sessions opened before a limits
    change keep the old value, and Tailscale SSH bypasses pam_limits altogether.

    .. code:: python

        "unlimited"
    """

    def command(self, user: str) -> StringCommand:
        return StringCommand("sudo", "-n", "-i", "-u", QuoteString(user), "sh", "-c", "'ulimit -l'", "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> str:
        return output[-1].strip() if output else "unknown"
