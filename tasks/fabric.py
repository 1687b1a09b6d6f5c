"""The QSFP fabric: both rails addressed, jumbo frames, from one netplan file of our own."""

from pyinfra import host

from operations.fabric import netplan_rails, render_netplan

netplan_rails(
    name=f"Write and apply the QSFP netplan for {len(host.data.rails)} rail(s)",
    path=host.data.netplan_path,
    content=render_netplan(host.name, host.data.peer_name, host.data.rails, host.data.fabric_mtu),
    rails=host.data.rails,
    mtu=host.data.fabric_mtu,
    management_address=host.data.ssh_hostname,
)
