"""Operations that prepare a Spark's OS for RDMA and the serving containers. Each reads one fact
(one round trip) to decide, and changes only what differs."""

from __future__ import annotations

from pathlib import Path

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha256
from pyinfra.operations import apt, files

from facts.host_prep import FileDigests, PackageStatus, SysctlValue, UserGroups


@operation()
def tools_installed(packages: list[str]):
    """
    Install the Debian packages that are missing; refresh the package lists only then.

    + packages: package names

    **Example:**

    .. code:: python

        tools_installed(packages=["rsync", "iperf3"])
    """
    missing = host.get_fact(PackageStatus, packages=packages)["missing"]
    if not missing:
        host.noop(f"installed: {', '.join(packages)}")
        return
    yield from apt.update._inner()
    yield from apt.packages._inner(packages=missing)


@operation()
def user_in_group(user: str, group: str):
    """
    Add ``user`` to ``group`` (a supplementary group), keeping its other groups.

    + user: an existing user
    + group: an existing group

    **Example:**

    .. code:: python

        user_in_group(user="spark", group="docker")
    """
    account = host.get_fact(UserGroups, user=user)
    if group in account["groups"]:
        host.noop(f"{user} is in group {group}")
        return
    yield StringCommand("usermod", "-aG", QuoteString(group), QuoteString(user))


def _differs(src: str, dest: str, mode: str, current: dict) -> bool:
    info = current.get(dest)
    return (info is None or info["kind"] != "file" or info["sha256"] != get_file_sha256(src)
            or info["mode"] != mode or info["owner"] != "root:root")


@operation()
def config_files(entries: list[tuple[str, str, str]]):
    """
    Put local configuration files on the node (root-owned), reading every destination in one
    round trip; only those that differ are uploaded, each with its diff.

    + entries: (local source, remote destination, mode) of each file

    **Example:**

    .. code:: python

        config_files(entries=[("files/host_prep/99-rdma.conf", "/etc/security/limits.d/99-rdma.conf", "644")])
    """
    current = host.get_fact(FileDigests, paths=[dest for _, dest, _ in entries])["files"]
    changed = [(src, dest, mode) for src, dest, mode in entries if _differs(src, dest, mode, current)]
    if not changed:
        host.noop(f"up to date: {', '.join(Path(dest).name for _, dest, _ in entries)}")
        return
    for src, dest, mode in changed:
        yield from files.put._inner(src=src, dest=dest, user="root", group="root", mode=mode, create_remote_dir=True)


@operation()
def systemd_manager_setting(src: str, path: str):
    """
    Write a systemd manager drop-in (``/etc/systemd/system.conf.d/``) and re-execute systemd
    when it changed and systemd is PID 1, so new services get the setting.

    + src: the local drop-in file
    + path: where it goes on the node

    **Example:**

    .. code:: python

        systemd_manager_setting(
            src="files/host_prep/90-rdma-memlock.conf",
            path="/etc/systemd/system.conf.d/90-rdma-memlock.conf",
        )
    """
    current = host.get_fact(FileDigests, paths=[path])["files"]
    if not _differs(src, path, "644", current):
        host.noop(f"{path} is up to date")
        return
    yield from files.put._inner(src=src, dest=path, user="root", group="root", mode="644", create_remote_dir=True)
    yield 'if [ "$(cat /proc/1/comm)" = systemd ]; then systemctl daemon-reexec; fi'


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
    current = host.get_fact(SysctlValue, key=key)["value"]
    if current is None:
        host.noop(f"this kernel has no {key}: nothing to set live")
    elif current == value:
        host.noop(f"{key} is {value}")
    else:
        yield StringCommand("sysctl", "-w", QuoteString(f"{key}={value}"))
