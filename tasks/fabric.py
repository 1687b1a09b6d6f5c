"""The QSFP fabric: both rails addressed, jumbo frames, from one netplan file of our own."""

from pyinfra import host

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from operations.fabric import netplan_rails

TEMPLATES = Environment(loader=FileSystemLoader("templates"), undefined=StrictUndefined, keep_trailing_newline=True)

netplan_rails(
    name=f"Write and apply the QSFP netplan for {len(host.data.rails)} rail(s)",
    path=host.data.netplan_path,
    content=TEMPLATES.get_template("fabric/netplan.yaml.j2").render(
        hostname=host.name, peer=host.data.peer_name, rails=host.data.rails, mtu=host.data.fabric_mtu,
    ),
    rails=host.data.rails,
    mtu=host.data.fabric_mtu,
    management_address=host.data.ssh_hostname,
)
