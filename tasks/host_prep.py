"""Host preparation: tools, docker group, unlimited memlock for RDMA, AppArmor userns."""

from pyinfra import host

from checks.node import USERNS_KEY
from operations.host_prep import host_settings, tools_installed, user_in_group

cluster = host.data.cluster
settings = cluster.settings

tools_installed(
    name="Install the fabric and host tools",
    packages=settings.host_packages,
)

user_in_group(
    name=f"Add {cluster.deploy_user} to the docker group (root-equivalent; applies at the next login)",
    user=cluster.deploy_user,
    group="docker",
)

host_settings(
    name="Lift the memlock limit for logins and services (RDMA); allow unprivileged user namespaces (AppArmor)",
    entries=[
        ("files/host_prep/99-rdma.conf", settings.memlock_limits_path, "644", "memlock_limits_path"),
        ("files/host_prep/90-rdma-memlock.conf", settings.memlock_systemd_path, "644", "memlock_systemd_path"),
        ("files/host_prep/60-apparmor-userns.conf", settings.userns_sysctl_path, "644", "userns_sysctl_path"),
    ],
    systemd_dropin=settings.memlock_systemd_path,
    sysctl_key=USERNS_KEY,
    sysctl_value=0,
)
