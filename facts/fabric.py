"""Readings of the QSFP fabric: netdev links, RDMA devices, jumbo-frame reachability, who
manages the rails, and the address a node is reached on."""

from __future__ import annotations

import ipaddress
import re
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, read_lines, split

EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SYSFS_PORT_FILE = re.compile(r".*/infiniband/([^/]+)/ports/([^/]+)/(.+)$")


class Link(TypedDict):
    operstate: str | None
    speed_mbps: int | None
    mtu: int | None
    ipv4: list[str]
    ipv6: list[str]


class Links(TypedDict):
    links: dict[str, Link]
    unreadable: list[str]


def _link() -> Link:
    return {"operstate": None, "speed_mbps": None, "mtu": None, "ipv4": [], "ipv6": []}


class NetLinks(FactBase[Links]):
    """
    Every netdev's state from sysfs and its addresses from ``ip``. ``speed_mbps`` is None
    where the kernel has no speed (a link that is down).

    .. code:: python

        {"links": {"enp1s0f0np0": {"operstate": "up", "speed_mbps": 200000, "mtu": 9000,
                                   "ipv4": ["10.0.0.1/24"], "ipv6": ["fe80::5a1e:3bff:fe00:1/64"]}},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Links:
        return {"links": {}, "unreadable": []}

    def command(self) -> str:
        # The shell's own read, not a process per file: a link that is down has no speed (EINVAL).
        return (
            "for d in /sys/class/net/*; do o=; s=; m=; read -r o < $d/operstate; read -r s < $d/speed; read -r m < $d/mtu; "
            'echo "link ${d##*/} $o ${s:--} $m"; done 2>/dev/null; ip -o addr show 2>/dev/null || true'
        )

    def process(self, output: list[str]) -> Links:
        links: dict[str, Link] = {}

        def parse(line: str) -> None:
            words = line.split()
            if words[0] == "link":
                _, name, operstate, speed, mtu = words
                speed_mbps = int(speed) if speed.lstrip("-").isdecimal() and int(speed) > 0 else None
                links.setdefault(name, _link()).update(operstate=operstate, speed_mbps=speed_mbps, mtu=int(mtu))
            elif words[2] in ("inet", "inet6"):
                ipaddress.ip_interface(words[3])
                name = words[1].rstrip(":").split("@")[0]
                links.setdefault(name, _link())["ipv4" if words[2] == "inet" else "ipv6"].append(words[3])
            else:
                raise ValueError(line)

        unreadable = read_lines(output, parse)
        return {"links": links, "unreadable": unreadable}


class Gid(TypedDict):
    index: int
    gid: str
    type: str | None
    netdev: str | None
    ipv4: str | None


class Port(TypedDict):
    state: str | None
    phys_state: str | None
    rate: str | None
    link_layer: str | None
    gids: list[Gid]


class RdmaDevice(TypedDict):
    netdevs: list[str]
    ports: dict[str, Port]


class Rdma(TypedDict):
    devices: dict[str, RdmaDevice]
    unreadable: list[str]


class RdmaDevices(FactBase[Rdma]):
    """
    The RDMA devices of ``/sys/class/infiniband``: the netdevs behind each, and per port the
    state, physical state, rate, link layer and the populated GID table with entry types.

    .. code:: python

        {"devices": {"rocep1s0f0": {"netdevs": ["enp1s0f0np0"], "ports": {"1": {
            "state": "ACTIVE", "phys_state": "LinkUp", "rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet",
            "gids": [{"index": 3, "gid": "0000:...:ffff:0a00:0001", "type": "RoCE v2",
                      "netdev": "enp1s0f0np0", "ipv4": "10.0.0.1"}]}}}},
         "unreadable": []}
    """

    @staticmethod
    def default() -> Rdma:
        return {"devices": {}, "unreadable": []}

    def command(self) -> str:
        return (
            "for d in /sys/class/infiniband/*; do [ -d \"$d\" ] || continue; "
            'echo "device ${d##*/} $(ls $d/device/net 2>/dev/null | tr "\\n" " ")"; '
            "for p in $d/ports/*; do "
            'echo "port ${d##*/} ${p##*/}"; '
            "grep -H . $p/state $p/phys_state $p/rate $p/link_layer 2>/dev/null; "
            "grep -H . $p/gids/* $p/gid_attrs/types/* $p/gid_attrs/ndevs/* 2>/dev/null; "
            "done; done"
        )

    def process(self, output: list[str]) -> Rdma:
        devices: dict[str, RdmaDevice] = {}
        entries: dict[tuple[str, str], dict[int, dict]] = {}

        def port_of(device: str, number: str) -> Port:
            port = devices.setdefault(device, {"netdevs": [], "ports": {}})["ports"].setdefault(
                number, {"state": None, "phys_state": None, "rate": None, "link_layer": None, "gids": []})
            entries.setdefault((device, number), {})
            return port

        def parse(line: str) -> None:
            words = line.split()
            if words[0] == "device" and len(words) >= 2:
                devices.setdefault(words[1], {"netdevs": [], "ports": {}})["netdevs"] = words[2:]
            elif words[0] == "port":
                _, device, number = words
                port_of(device, number)
            else:
                path, _, value = line.partition(":")
                device, number, rest = SYSFS_PORT_FILE.match(path).groups()
                value = value.strip()
                port = port_of(device, number)
                if rest in ("state", "phys_state"):  # "4: ACTIVE" -> "ACTIVE"
                    port[rest] = value.split(": ", 1)[-1]
                elif rest in ("rate", "link_layer"):
                    port[rest] = value
                else:  # gids/<i>, gid_attrs/types/<i>, gid_attrs/ndevs/<i>
                    table, index = rest.rsplit("/", 1)
                    key = {"gids": "gid", "gid_attrs/types": "type", "gid_attrs/ndevs": "netdev"}[table]
                    if key == "gid":
                        ipaddress.IPv6Address(value)
                    entries[(device, number)].setdefault(int(index), {})[key] = value

        unreadable = read_lines(output, parse)
        for (device, number), table in entries.items():
            devices[device]["ports"][number]["gids"] = [
                {"index": index, "gid": entry["gid"], "type": entry.get("type"),
                 "netdev": entry.get("netdev"), "ipv4": gid_ipv4(entry["gid"])}
                for index, entry in sorted(table.items())
                if entry.get("gid", EMPTY_GID) != EMPTY_GID
            ]
        return {"devices": devices, "unreadable": unreadable}


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    return str(mapped) if mapped else None


def roce_v2_gid_index(devices: dict[str, RdmaDevice], rdma: str, ipv4: str) -> int | None:
    """The GID index NCCL needs: the RoCE v2 entry of that IPv4 address on port 1."""
    for entry in devices.get(rdma, {}).get("ports", {}).get("1", {}).get("gids", []):
        if entry["type"] == "RoCE v2" and entry["ipv4"] == ipv4:
            return entry["index"]
    return None


class Ping(TypedDict):
    sent: int
    received: int
    error: str | None
    unreadable: list[str]


PING_SUMMARY = re.compile(r"(\d+) packets transmitted, (\d+) (?:packets )?received")


class DfPing(FactBase[Ping]):
    """
    A don't-fragment ping of ``size`` payload bytes out of ``netdev``: with size = MTU - 28
    it passes only if every hop carries the full MTU. Three probes 50 ms apart, two seconds
    at most.

    .. code:: python

        {"sent": 3, "received": 3, "error": None, "unreadable": []}
    """

    @staticmethod
    def default() -> Ping:
        return {"sent": 0, "received": 0, "error": "no output from ping", "unreadable": []}

    def command(self, netdev: str, address: str, size: int) -> StringCommand:
        return StringCommand(
            "ping", "-n", "-M", "do", "-c", "3", "-i", "0.05", "-W", "1", "-w", "2", "-s", str(int(size)),
            "-I", QuoteString(netdev), QuoteString(address), "2>&1", "||", "true",
        )

    def process(self, output: list[str]) -> Ping:
        for line in output:
            match = PING_SUMMARY.search(line)
            if match:
                errors = [text.strip() for text in output if "message too long" in text.lower() or "frag needed" in text.lower()]
                return {"sent": int(match.group(1)), "received": int(match.group(2)),
                        "error": errors[0] if errors else None, "unreadable": []}
        text = " ".join(line.strip() for line in output).strip()
        if text.startswith("ping: ") or "not found" in text:
            return {"sent": 0, "received": 0, "error": text[:200], "unreadable": []}
        return {"sent": 0, "received": 0, "error": "unreadable ping output", "unreadable": list(output)}


class NmDevices(TypedDict):
    states: dict[str, str]
    unreadable: list[str]


class NetworkManagerDevices(FactBase[NmDevices]):
    """
    NetworkManager's state per netdev; empty where NetworkManager is not installed.

    .. code:: python

        {"states": {"enp1s0f0np0": "connected", "enP7s7": "unmanaged"}, "unreadable": []}
    """

    @staticmethod
    def default() -> NmDevices:
        return {"states": {}, "unreadable": []}

    def command(self) -> str:
        return "! command -v nmcli >/dev/null || nmcli -t -f DEVICE,STATE device 2>/dev/null || true"

    def process(self, output: list[str]) -> NmDevices:
        states: dict[str, str] = {}

        def parse(line: str) -> None:
            device, state = line.split(":", 1)
            if not device or not state:
                raise ValueError(line)
            states[device] = state

        return {"states": states, "unreadable": read_lines(output, parse)}


class Reached(TypedDict):
    address: str | None
    unreadable: list[str]


class ManagementAddress(FactBase[Reached]):
    """
    The address this node is reached on over SSH (the server end of ``$SSH_CONNECTION``),
    found in the environment of the login shell above this command (sudo drops it).
    Whatever carries it is the management LAN, whatever the site file calls the node.

    .. code:: python

        {"address": "192.168.1.10", "unreadable": []}
    """

    @staticmethod
    def default() -> Reached:
        return {"address": None, "unreadable": []}

    def command(self) -> str:
        return (
            "p=$$; while [ \"$p\" -gt 1 ] 2>/dev/null; do "
            "c=$(tr '\\0' '\\n' < /proc/$p/environ 2>/dev/null | sed -n 's/^SSH_CONNECTION=//p'); "
            "if [ -n \"$c\" ]; then echo \"ssh $c\"; break; fi; "
            "p=$(sed -n 's/^PPid:[[:space:]]*//p' /proc/$p/status 2>/dev/null); done; true"
        )

    def process(self, output: list[str]) -> Reached:
        found: list[str] = []

        def parse(line: str) -> None:
            _, _, _, server, _ = line.split()
            found.append(str(ipaddress.ip_address(server)))

        unreadable = read_lines(output, parse)
        return {"address": found[0] if found else None, "unreadable": unreadable}


class NetplanFile(TypedDict):
    lines: list[str] | None
    mode: str | None


class Fabric(TypedDict):
    links: Links
    network_manager: NmDevices
    netplan: NetplanFile
    reached_on: Reached
    unreadable: list[str]


class FabricState(FactBase[Fabric]):
    """
    Everything the netplan operation reads, in one round trip: the links, NetworkManager's
    devices, our netplan file (its lines and mode, None where absent) and the management address.

    .. code:: python

        {"links": {...NetLinks...}, "network_manager": {...}, "reached_on": {"address": "192.168.1.10", ...},
         "netplan": {"lines": ["network:", "..."], "mode": "600"}, "unreadable": []}
    """

    @staticmethod
    def default() -> Fabric:
        return {"links": NetLinks.default(), "network_manager": NetworkManagerDevices.default(),
                "netplan": {"lines": None, "mode": None}, "reached_on": ManagementAddress.default(), "unreadable": []}

    def command(self, path: str) -> StringCommand:
        return combined({
            "links": NetLinks().command(),
            "network_manager": NetworkManagerDevices().command(),
            "reached_on": ManagementAddress().command(),
            "netplan_mode": StringCommand("stat", "-c", "%a", QuoteString(path), "2>/dev/null", "||", "true"),
            "netplan": StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "true"),
        })

    def process(self, output: list[str]) -> Fabric:
        sections = split(output)
        mode = sections.get("netplan_mode", [])
        return {
            "links": NetLinks().process(sections.get("links", [])),
            "network_manager": NetworkManagerDevices().process(sections.get("network_manager", [])),
            "reached_on": ManagementAddress().process(sections.get("reached_on", [])),
            "netplan": {"lines": sections.get("netplan", []) if mode else None, "mode": mode[0].strip() if mode else None},
            "unreadable": sections[""],
        }
