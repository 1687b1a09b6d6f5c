"""The lab's networks: a bridge for the management LAN, a network namespace per node, and the
fabric: the QSFP cable between two nodes as veth pairs named as on a Spark, or a switch (a
bridge per rail, one L2 domain each) with every node's cabled port on it."""

from __future__ import annotations

from lab import hardware
from lab.config import BRIDGE, BRIDGE_ADDRESS, CABLE_LAYOUTS, PORT_SPEED_MBPS, RAIL_BRIDGE, SWITCH_MTU, Node
from lab.processes import quiet, run


def bridge_up() -> None:
    if run("ip", "link", "show", BRIDGE, check=False, capture_output=True).returncode != 0:
        run("ip", "link", "add", BRIDGE, "type", "bridge")
        run("ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE)
    run("ip", "link", "set", BRIDGE, "up")


def bridge_down() -> None:
    quiet("ip", "link", "del", BRIDGE)


def namespace_up(node: Node) -> None:
    """The node's network namespace with its management interface on the bridge."""
    run("ip", "netns", "add", node.netns)
    run("ip", "-n", node.netns, "link", "set", "lo", "up")
    # As on Ubuntu (systemd's 50-default.conf): unprivileged ICMP echo sockets, so ping needs no capability.
    run("ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647")
    run("ip", "link", "add", f"sl-{node.name}", "type", "veth", "peer", "name", "mgmt0", "netns", node.netns)
    run("ip", "link", "set", f"sl-{node.name}", "master", BRIDGE, "up")


def namespace_down(node: Node) -> None:
    quiet("ip", "netns", "del", node.netns)
    quiet("ip", "link", "del", f"sl-{node.name}")


def cable(layout: str, nodes: list[Node]) -> None:
    """The QSFP cable: veth pairs between the two nodes on the cabled port, idle netdevs on the other.
    DGX OS brings every CX-7 port up; only the cabled ones get a carrier."""
    cabled, _ = CABLE_LAYOUTS[layout]
    head, worker = nodes
    for netdev in cabled:
        run("ip", "link", "add", netdev, "netns", head.netns, "type", "veth", "peer", "name", netdev, "netns", worker.netns)
        for node in nodes:
            hardware.set_link_speed(node, netdev, PORT_SPEED_MBPS)
    _loose_and_up(layout, nodes)


def switch(layout: str, nodes: list[Node]) -> None:
    """The switch: a bridge per rail (its ports at MTU 9000, as the switch must be set), each
    node's cabled netdev a veth into its rail's bridge, the port's speed 200G in sysfs."""
    cabled, _ = CABLE_LAYOUTS[layout]
    for rail, netdev in enumerate(cabled):
        bridge = RAIL_BRIDGE.format(rail)
        run("ip", "link", "add", bridge, "mtu", str(SWITCH_MTU), "type", "bridge")
        run("ip", "link", "set", bridge, "up")
        for node in nodes:
            port = switch_port(rail, node)
            run("ip", "link", "add", port, "mtu", str(SWITCH_MTU), "type", "veth", "peer", "name", netdev, "netns", node.netns)
            run("ip", "link", "set", port, "master", bridge, "up")
            hardware.set_link_speed(node, netdev, PORT_SPEED_MBPS)
    _loose_and_up(layout, nodes)


def switch_port(rail: int, node: Node) -> str:
    """The host's end of a node's veth into the rail's bridge: the switch port it is cabled to."""
    return f"slr{rail}-{node.name}"


def switch_down(rails: int) -> None:
    """The rail bridges go; the nodes' ports went with their namespaces."""
    for rail in range(rails):
        quiet("ip", "link", "del", RAIL_BRIDGE.format(rail))


def _loose_and_up(layout: str, nodes: list[Node]) -> None:
    cabled, loose = CABLE_LAYOUTS[layout]
    for index, netdev in enumerate(loose):
        for node in nodes:
            run("ip", "-n", node.netns, "link", "add", netdev, "type", "veth", "peer", "name", f"unplugged{index}")
    for node in nodes:
        for netdev in cabled + loose:
            run("ip", "-n", node.netns, "link", "set", netdev, "up")


def set_mtu(node: Node, netdev: str, mtu: int) -> None:
    run("ip", "-n", node.netns, "link", "set", "dev", netdev, "mtu", str(mtu))


def set_link(node: Node, netdev: str, up: bool) -> None:
    run("ip", "-n", node.netns, "link", "set", "dev", netdev, "up" if up else "down")
