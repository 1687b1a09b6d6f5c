"""Identity that cloned factory images share by mistake: machine ids and SSH host keys."""

from __future__ import annotations

from pyinfra.api import FactBase


class MachineIds(FactBase[dict]):
    """
    ``/etc/machine-id`` and ``/var/lib/dbus/machine-id`` (None where absent), and whether
    the D-Bus one is a symlink to the first.

    .. code:: python

        {"etc": "1dca2c5c40df4b3088ee14223c919d1e", "dbus": "1dca2c5c40df4b3088ee14223c919d1e", "dbus_is_link": True}
    """

    default = dict

    def command(self) -> str:
        return (
            'echo "etc $(cat /etc/machine-id 2>/dev/null)"; '
            'echo "dbus $(cat /var/lib/dbus/machine-id 2>/dev/null)"; '
            '[ -L /var/lib/dbus/machine-id ] && echo "dbus_is_link" || true'
        )

    def process(self, output: list[str]) -> dict:
        ids = {"etc": None, "dbus": None, "dbus_is_link": False}
        for line in output:
            key, _, value = line.partition(" ")
            if key == "dbus_is_link":
                ids["dbus_is_link"] = True
            elif key in ids:
                ids[key] = value.strip() or None
        return ids


class SshHostKeyFingerprints(FactBase[dict]):
    """
    The SHA256 fingerprint of each SSH host key, by key type.

    .. code:: python

        {"ED25519": "SHA256:3b0sYvMC0gq2...", "RSA": "SHA256:Yq7XZf3..."}
    """

    default = dict

    def requires_command(self) -> str:
        return "ssh-keygen"

    def command(self) -> str:
        return "for k in /etc/ssh/ssh_host_*_key.pub; do [ -f \"$k\" ] && ssh-keygen -lf \"$k\"; done; true"

    def process(self, output: list[str]) -> dict:
        # "256 SHA256:abc root@host (ED25519)"
        return {line.split()[-1].strip("()"): line.split()[1] for line in output if line.count(" ") >= 3}
