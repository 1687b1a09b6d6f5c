"""Rules for the rails: link, RoCE port and GID, jumbo-frame reachability of every other node;
where the cable is; a switch port left at 100G."""

from __future__ import annotations

import re

from checks import FAIL, PASS, Check
from cluster import Cluster
from facts.fabric import RdmaDevice, roce_v2_gid_index
from facts.verify import ping_targets

SWITCH_AUTONEG_MBPS = 100000  # what a Spark reads from a switch port left at auto-negotiation


def rail_checks(name: str, cluster: Cluster, readings: dict) -> list[Check]:
    """Link and RoCE port of each rail of one node, and jumbo-frame reachability of every other
    node on it."""
    checks = []
    links, rdma = readings["links"]["links"], readings["rdma"]["devices"]
    rails = cluster.node(name).rail_data
    configured = {rail["netdev"] for rail in rails}
    targets = ping_targets(cluster, name)
    pings = readings["pings"] + [None] * (len(targets) - len(readings["pings"]))
    for index, rail in enumerate(rails):
        netdev, label = rail["netdev"], f"rail {index} {rail['netdev']}"
        link = links.get(netdev)
        if link is None:
            checks.append(Check(name, f"{label} link", FAIL, "no such netdev",
                                "set the rail's netdev in site.toml to a CX-7 interface (ip -br link)"))
            continue
        checks.append(link_check(name, label, cluster, rail, link, rdma, configured))
        checks.append(roce_check(name, index, netdev, rail, rdma))
        checks += [ping_check(name, index, cluster, other, address, ping, link)
                   for (rail_index, _, other, address), ping in zip(targets, pings) if rail_index == index]
    return checks


def link_check(name: str, label: str, cluster: Cluster, rail: dict, link: dict, rdma: dict, configured: set[str]) -> Check:
    problems, fixes = [], []
    netdev = rail["netdev"]
    if link["operstate"] != "up":
        problems.append(f"link {link['operstate']}")
        elsewhere = active_ports_elsewhere(rdma, configured, netdev)
        if elsewhere:
            fixes.append("the cable is in the other QSFP port: " + ", ".join(
                f"{dev} ({'/'.join(rdma[dev]['netdevs'])}) is ACTIVE" for dev in elsewhere)
                + "; name it for this rail in site.toml (netdev, rdma), or move the cable")
        else:
            fixes.append("check the QSFP cable; plug it before boot or `echo 1 > /sys/bus/pci/rescan`")
    elif link["speed_mbps"] != cluster.settings.expected_link_speed_mbps:
        problems.append(f"{link['speed_mbps']} Mb/s, expected {cluster.settings.expected_link_speed_mbps}")
        if link["speed_mbps"] == SWITCH_AUTONEG_MBPS and cluster.topology == "switch":
            fixes.append("force 200G, auto-negotiation off on the switch port (and MTU 9000 on the switch)")
        else:
            fixes.append("reseat or replace the QSFP cable (a damaged or slower DAC negotiates down)")
    mtu = cluster.settings.fabric_mtu
    if link["mtu"] != mtu:
        problems.append(f"MTU {link['mtu']}, expected {mtu}")
        fixes.append(f"run the deploy again (it re-applies the netplan file); `ip link show {netdev}` must show mtu {mtu}")
    if rail["cidr"] not in link["ipv4"]:
        problems.append(f"address {rail['cidr']} missing (has {', '.join(link['ipv4']) or 'none'})")
        fixes.append(f"run the deploy again and check `netplan get` on {name}")
    return Check(name, f"{label} link", FAIL if problems else PASS,
                 "; ".join(problems) or f"up, {link['speed_mbps']} Mb/s, MTU {link['mtu']}, {rail['cidr']}", "; ".join(fixes))


def roce_check(name: str, index: int, netdev: str, rail: dict, rdma: dict) -> Check:
    item = f"rail {index} {rail['rdma']} RoCE"
    port = rdma.get(rail["rdma"], {}).get("ports", {}).get("1")
    gid_index = roce_v2_gid_index(rdma, rail["rdma"], rail["address"])
    if port is None:
        present = ", ".join(sorted(rdma)) or "none"
        return Check(name, item, FAIL, f"no such RDMA device (present: {present})",
                     "set the rail's rdma in site.toml (ls /sys/class/infiniband)")
    if port["state"] != "ACTIVE":
        return Check(name, item, FAIL, f"port {port['state']} ({port['phys_state']})",
                     f"check the cable and `ibv_devinfo -d {rail['rdma']}`; the port must be PORT_ACTIVE")
    if gid_index is None:
        return Check(name, item, FAIL, f"no RoCE v2 GID for {rail['address']}",
                     f"the GID appears once {rail['address']} is on {netdev}: fix the link row first")
    if rail["gid_index"] not in ("auto", gid_index):
        return Check(name, item, FAIL, f"RoCE v2 GID of {rail['address']} is index {gid_index}, site.toml pins {rail['gid_index']}",
                     f"set gid_index = {gid_index} (or \"auto\") for this rail")
    return Check(name, item, PASS, f"ACTIVE, {port['rate']}, RoCE v2 GID index {gid_index}")


def ping_check(name: str, index: int, cluster: Cluster, other: str, address: str, ping: dict | None, link: dict) -> Check:
    size = cluster.settings.fabric_mtu - 28
    item = f"rail {index} jumbo ping to {other}"
    if ping and ping["received"]:
        return Check(name, item, PASS, f"{size}-byte DF ping to {address} passes")
    error = (ping or {}).get("error") or "no reply"
    switch = " and on the switch" if cluster.topology == "switch" else ""
    fix = (f"set MTU {cluster.settings.fabric_mtu} on rail {index} of {name} and {other}{switch} (`ip link show` on each node)"
           if link["operstate"] == "up" else "the rail has no link: see its link row")
    return Check(name, item, FAIL, f"{size}-byte DF ping to {address} fails ({error})", fix)


def active_ports_elsewhere(rdma: dict[str, RdmaDevice], configured: set[str], netdev: str) -> list[str]:
    """RDMA devices with an ACTIVE port whose netdevs the site file does not name: where the
    cable really is. Those on the same CX-7 controller as ``netdev`` come alone when present."""
    active = [
        device for device, info in sorted(rdma.items())
        if info["ports"].get("1", {}).get("state") == "ACTIVE" and not configured & set(info["netdevs"])
    ]
    controller = controller_of(netdev)
    same = [device for device in active if any(controller_of(n) == controller for n in rdma[device]["netdevs"])]
    return same or active


def controller_of(netdev: str) -> str:
    """The PCI part of a CX-7 netdev name: enp1s0f1np1 -> enp1s0."""
    return re.sub(r"f\d+(np\d+)?$", "", netdev)
