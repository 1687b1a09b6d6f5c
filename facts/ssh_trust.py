"""Whether the deploy user can log in to the peer over the fabric without a password."""

from __future__ import annotations

from pyinfra.api import FactBase, QuoteString, StringCommand


class SshLogin(FactBase[bool]):
    """
    True when ``user`` here reaches ``address`` by SSH with its key and a known host key,
    asking nothing (BatchMode).

    .. code:: python

        True
    """

    def command(self, user: str, address: str) -> StringCommand:
        return StringCommand(
            "sudo", "-n", "-u", QuoteString(user), "ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            QuoteString(address), "true", "2>/dev/null", "&&", "echo", "yes", "||", "echo", "no",
        )

    def process(self, output: list[str]) -> bool:
        return output[-1:] == ["yes"]
