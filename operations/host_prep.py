"""Operations that prepare a Spark's OS for RDMA and the serving containers."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation
from pyinfra.facts.deb import DebPackages
from pyinfra.facts.files import Directory
from pyinfra.facts.server import Sysctl
from pyinfra.operations import apt, files

# Ubuntu's AppArmor switch for unprivileged user namespaces (Codex CLI's bubblewrap sandbox).
USERNS_KEY = "kernel.apparmor_restrict_unprivileged_userns"


@operation()
def tools_installed(packages: list[str]):
    """
    Install the Debian packages that are missing; refresh the package lists only then.

    + packages: package names

    **Example:**

    .. code:: python

        tools_installed(packages=["rsync", "iperf3"])
    """
    installed = host.get_fact(DebPackages)
    missing = [package for package in packages if package not in installed]
    if not missing:
        host.noop(f"installed: {', '.join(packages)}")
        return
    yield from apt.update._inner()
    yield from apt.packages._inner(packages=missing)


@operation()
def systemd_manager_setting(src: str, path: str):
    """
    Write a systemd manager drop-in (``/etc/systemd/system.conf.d/``) and re-execute
    systemd when it changed and systemd is running, so new services get the setting.

    + src: the local drop-in file
    + path: where it goes on the node

    **Example:**

    .. code:: python

        systemd_manager_setting(
            src="files/host_prep/90-rdma-memlock.conf",
            path="/etc/systemd/system.conf.d/90-rdma-memlock.conf",
        )
    """
    changes = list(files.put._inner(src=src, dest=path, mode="644", create_remote_dir=True))
    yield from changes
    if changes and host.get_fact(Directory, path="/run/systemd/system"):
        yield "systemctl daemon-reexec"


@operation()
def live_sysctl(key: str, value: int):
    """
    Set a kernel parameter now, where this kernel has it; a kernel without the key (the
    AppArmor userns key is Ubuntu's) is left alone.

    + key: the sysctl name
    + value: the value it should read

    **Example:**

    .. code:: python

        live_sysctl(key="kernel.apparmor_restrict_unprivileged_userns", value=0)
    """
    current = host.get_fact(Sysctl, keys=[key]).get(key)
    if current is None:
        host.noop(f"this kernel has no {key}: nothing to set live")
    elif current == value:
        host.noop(f"{key} is {value}")
    else:
        yield StringCommand("sysctl", "-w", f"{key}={value}")
