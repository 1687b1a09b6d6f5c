"""Operations that prepare a Spark's OS for RDMA and the serving containers. Each reads one fact
(one round trip) to decide, and changes only what differs."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.operations import apt

from checks.node import USERNS_KEY
from cluster import Cluster
from facts.host_prep import HostSettings, PackageStatus, UserGroups
from operations.managed import file_differs, put_changed
from operations.readings import Reading, plans, read


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    settings = cluster.settings
    return [(PackageStatus, {"packages": settings.host_packages}), (UserGroups, {"user": cluster.deploy_user}),
            (HostSettings, {"paths": [settings.memlock_limits_path, settings.memlock_systemd_path, settings.userns_sysctl_path],
                            "key": USERNS_KEY})]


@operation()
def tools_installed(packages: list[str]):
    """
    Install the Debian packages that are missing; refresh the package lists only then.

    + packages: package names

    **Example:**

    .. code:: python

        tools_installed(packages=["rsync", "iperf3"])
    """
    missing = read(host, PackageStatus, packages=packages)["missing"]
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
    account = read(host, UserGroups, user=user)
    if group in account["groups"]:
        host.noop(f"{user} is in group {group}")
        return
    yield StringCommand("usermod", "-aG", QuoteString(group), QuoteString(user))


@operation()
def host_settings(entries: list[tuple[str, str, str, str]], systemd_dropin: str, sysctl_key: str, sysctl_value: int):
    """
    The OS settings two-node serving needs, in one round trip: root-owned configuration files
    (managed.put_config for those that differ, with their diffs; one the deploy did not write is
    refused), systemd re-executed when its
    manager drop-in changed and systemd is PID 1, and a kernel parameter set live where this
    kernel has it (the AppArmor userns key is Ubuntu's).

    + entries: (local source, remote destination, mode, the site setting naming it) of each file
    + systemd_dropin: which destination is a systemd manager drop-in
    + sysctl_key, sysctl_value: the parameter to set now

    **Example:**

    .. code:: python

        host_settings(entries=[("files/host_prep/99-rdma.conf", "/etc/security/limits.d/99-rdma.conf", "644", "memlock_limits_path")],
                      systemd_dropin="/etc/systemd/system.conf.d/90-rdma-memlock.conf",
                      sysctl_key="kernel.apparmor_restrict_unprivileged_userns", sysctl_value=0)
    """
    current = read(host, HostSettings, paths=[dest for _, dest, _, _ in entries], key=sysctl_key)
    files_now = current["files"]["files"]
    changes = list(put_changed(entries, files_now))
    source = next(src for src, dest, _, _ in entries if dest == systemd_dropin)
    if file_differs(source, "644", files_now.get(systemd_dropin)):
        changes.append('if [ "$(cat /proc/1/comm)" = systemd ]; then systemctl daemon-reexec; fi')
    live = current["sysctl"]["value"]
    if live is not None and live != sysctl_value:
        changes.append(StringCommand("sysctl", "-w", QuoteString(f"{sysctl_key}={sysctl_value}")))
    if not changes:
        host.noop("files up to date" + (f", {sysctl_key} = {sysctl_value}" if live is not None else f"; this kernel has no {sysctl_key}"))
    yield from changes
