"""The QSFP fabric: every rail addressed, jumbo frames, from one netplan file of our own."""

from pyinfra import host

from operations.fabric import netplan_rails

cluster = host.data.cluster
rails = cluster.node(host.name).rail_data

netplan_rails(
    name=f"Write and apply the QSFP netplan for {len(rails)} rail(s)",
    path=cluster.settings.netplan_path,
    rails=rails,
    mtu=cluster.settings.fabric_mtu,
    hostname=host.name,
    others=[node.hostname for node in cluster.others(host.name)],
)
