"""Defaults for both Sparks. A site overrides them in `site.toml` under [settings],
a single run with `pyinfra ... --data key=value`."""

# Every operation runs as root through sudo; the deploy user itself is a normal user.
_sudo = True

# Serving
profile = "adaptive"
api_host = "127.0.0.1"
api_port = 8888

# QSFP fabric
fabric_mtu = 9000
netplan_path = "/etc/netplan/40-dual-spark.yaml"
expected_link_speed_mbps = 200000

# Host preparation
host_packages = [
    "rsync",
    "iperf3",
    "perftest",
    "rdma-core",
    "ibverbs-utils",
    "infiniband-diags",
    "python3-venv",
]
memlock_limits_path = "/etc/security/limits.d/99-rdma.conf"
memlock_systemd_path = "/etc/systemd/system.conf.d/90-rdma-memlock.conf"
userns_sysctl_path = "/etc/sysctl.d/60-apparmor-userns.conf"
reboot_worker = False

# Verification
memory_floor_gib = 95
