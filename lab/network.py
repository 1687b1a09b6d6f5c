"""The lab's networks: a bridge for the management LAN, a network namespace per node, and the
QSFP cable as veth pairs named as on a Spark."""

from __future__ import annotations

from lab import hardware
from lab.config import BRIDGE, BRIDGE_ADDRESS, CABLE_LAYOUTS, HEAD, WORKER, Node
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
    run("ip", "link", "add", f"sl-{node.role}", "type", "veth", "peer", "name", "mgmt0", "netns", node.netns)
    run("ip", "link", "set", f"sl-{node.role}", "master", BRIDGE, "up")


def namespace_down(node: Node) -> None:
    quiet("ip", "netns", "del", node.netns)
    quiet("ip", "link", "del", f"sl-{node.role}")


def cable(layout: str) -> None:
    """The QSFP cable: veth pairs between the nodes on the cabled port, idle netdevs on the other.
    DGX OS brings every CX-7 port up; only the cabled ones get a carrier."""
    cabled, loose = CABLE_LAYOUTS[layout]
    for netdev in cabled:
        run("ip", "link", "add", netdev, "netns", HEAD.netns, "type", "veth", "peer", "name", netdev, "netns", WORKER.netns)
        for node in (HEAD, WORKER):
            hardware.set_link_speed(node, netdev, 200000)
    for index, netdev in enumerate(loose):
        for node in (HEAD, WORKER):
            run("ip", "-n", node.netns, "link", "add", netdev, "type", "veth", "peer", "name", f"unplugged{index}")
    for node in (HEAD, WORKER):
        for netdev in cabled + loose:
            run("ip", "-n", node.netns, "link", "set", netdev, "up")


def set_mtu(node: Node, netdev: str, mtu: int) -> None:
    run("ip", "-n", node.netns, "link", "set", "dev", netdev, "mtu", str(mtu))


def set_link(node: Node, netdev: str, up: bool) -> None:
    run("ip", "-n", node.netns, "link", "set", "dev", netdev, "up" if up else "down")
