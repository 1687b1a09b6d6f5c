"""Host preparation: tools, docker group, unlimited memlock for RDMA, AppArmor userns."""

from pyinfra import host
from pyinfra.operations import files, server

from operations.host_prep import USERNS_KEY, live_sysctl, systemd_manager_setting, tools_installed

tools_installed(
    name="Install the fabric and host tools",
    packages=host.data.host_packages,
)

server.user(
    name=f"Add {host.data.deploy_user} to the docker group (root-equivalent; applies at the next login)",
    user=host.data.deploy_user,
    groups=["docker"],
    append=True,
)

files.put(
    name="Lift the memlock limit for logins (RDMA memory registration)",
    src="files/host_prep/99-rdma.conf",
    dest=host.data.memlock_limits_path,
    mode="644",
)

systemd_manager_setting(
    name="Lift the memlock limit for systemd services",
    src="files/host_prep/90-rdma-memlock.conf",
    path=host.data.memlock_systemd_path,
)

files.put(
    name="Persist the AppArmor unprivileged-userns setting",
    src="files/host_prep/60-apparmor-userns.conf",
    dest=host.data.userns_sysctl_path,
    mode="644",
)

live_sysctl(
    name="Apply the AppArmor unprivileged-userns setting now",
    key=USERNS_KEY,
    value=0,
)
