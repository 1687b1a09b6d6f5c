"""The QSFP fabric: every rail addressed, jumbo frames, from one netplan file of our own."""

from pyinfra import host

from operations.fabric import netplan_rails

netplan_rails(
    name=f"Write and apply the QSFP netplan for {len(host.data.rails)} rail(s)",
    path=host.data.netplan_path,
    rails=host.data.rails,
    mtu=host.data.fabric_mtu,
    hostname=host.name,
    others=[node.hostname for node in host.data.cluster.others(host.name)],
)
