"""Readings of the QSFP fabric: netdev links, RDMA devices, jumbo-frame reachability."""

from __future__ import annotations

import ipaddress
import re

from pyinfra.api import FactBase, QuoteString, StringCommand

EMPTY_GID = "0000:0000:0000:0000:0000:0000:0000:0000"
SYSFS_PORT_FILE = re.compile(r".*/infiniband/([^/]+)/ports/([^/]+)/(.+)$")


class NetLinks(FactBase[dict]):
    """
    Every netdev's state from sysfs and its addresses from ``ip``. ``speed_mbps`` is None
    where the kernel has no speed (a link that is down).

    .. code:: python

        {
            "enp1s0f0np0": {
                "operstate": "up", "speed_mbps": 200000, "mtu": 9000,
                "ipv4": ["10.0.0.1/24"], "ipv6": ["fe80::5a1e:3bff:fe00:1/64"],
            },
        }
    """

    default = dict

    def command(self) -> str:
        return (
            "for d in /sys/class/net/*; do "
            'echo "link ${d##*/} $(cat $d/operstate 2>/dev/null) $(cat $d/speed 2>/dev/null || echo -) '
            '$(cat $d/mtu 2>/dev/null)"; done; ip -o addr show 2>/dev/null || true'
        )

    def process(self, output: list[str]) -> dict:
        links: dict[str, dict] = {}
        for line in output:
            words = line.split()
            if words[0] == "link" and len(words) == 5:
                _, name, operstate, speed, mtu = words
                speed_mbps = int(speed) if speed.lstrip("-").isdigit() and int(speed) > 0 else None
                links[name] = {"operstate": operstate, "speed_mbps": speed_mbps, "mtu": int(mtu), "ipv4": [], "ipv6": []}
            elif len(words) > 3 and words[2] in ("inet", "inet6"):
                name = words[1].split("@")[0]
                family = "ipv4" if words[2] == "inet" else "ipv6"
                links.setdefault(name, {"operstate": None, "speed_mbps": None, "mtu": None, "ipv4": [], "ipv6": []})
                links[name][family].append(words[3])
        return links


class RdmaDevices(FactBase[dict]):
    """
    The RDMA devices of ``/sys/class/infiniband``: the netdevs behind each, and per port the
    state, physical state, rate, link layer and the populated GID table with entry types.

    .. code:: python

        {
            "rocep1s0f0": {
                "netdevs": ["enp1s0f0np0"],
                "ports": {
                    "1": {
                        "state": "ACTIVE", "phys_state": "LinkUp", "rate": "200 Gb/sec (4X HDR)",
                        "link_layer": "Ethernet",
                        "gids": [
                            {"index": 3, "gid": "0000:...:ffff:0a00:0001", "type": "RoCE v2",
                             "netdev": "enp1s0f0np0", "ipv4": "10.0.0.1"},
                        ],
                    },
                },
            },
        }
    """

    default = dict

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

    def process(self, output: list[str]) -> dict:
        devices: dict[str, dict] = {}
        gid_entries: dict[tuple[str, str], dict[int, dict]] = {}
        for line in output:
            words = line.split()
            if words[0] == "device":
                devices[words[1]] = {"netdevs": words[2:], "ports": {}}
            elif words[0] == "port":
                _, device, number = words
                devices[device]["ports"][number] = {"state": None, "phys_state": None, "rate": None, "link_layer": None}
                gid_entries[(device, number)] = {}
            else:
                path, _, value = line.partition(":")
                device, number, rest = SYSFS_PORT_FILE.match(path).groups()
                value = value.strip()
                if "/" not in rest:  # ports/1/state, phys_state, rate, link_layer
                    # "4: ACTIVE" -> "ACTIVE"; rate and link layer are kept as written
                    port = devices[device]["ports"][number]
                    port[rest] = value.split(": ", 1)[-1] if rest in ("state", "phys_state") else value
                else:  # ports/1/gids/<i>, ports/1/gid_attrs/types/<i>, ports/1/gid_attrs/ndevs/<i>
                    table, index = rest.rsplit("/", 1)
                    key = {"gids": "gid", "gid_attrs/types": "type", "gid_attrs/ndevs": "netdev"}[table]
                    gid_entries[(device, number)].setdefault(int(index), {})[key] = value
        for (device, number), entries in gid_entries.items():
            devices[device]["ports"][number]["gids"] = [
                {"index": index, "gid": entry["gid"], "type": entry.get("type"),
                 "netdev": entry.get("netdev"), "ipv4": gid_ipv4(entry["gid"])}
                for index, entry in sorted(entries.items())
                if entry.get("gid", EMPTY_GID) != EMPTY_GID
            ]
        return devices


def gid_ipv4(gid: str) -> str | None:
    """The IPv4 address of an IPv4-mapped GID (``::ffff:a.b.c.d``), else None."""
    mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    return str(mapped) if mapped else None


def roce_v2_gid_index(devices: dict, rdma: str, ipv4: str) -> int | None:
    """The GID index NCCL needs: the RoCE v2 entry of that IPv4 address on port 1."""
    for entry in devices.get(rdma, {}).get("ports", {}).get("1", {}).get("gids", []):
        if entry["type"] == "RoCE v2" and entry["ipv4"] == ipv4:
            return entry["index"]
    return None


class DfPing(FactBase[dict]):
    """
    A don't-fragment ping of ``size`` payload bytes out of ``netdev``: with size = MTU - 28
    it passes only if every hop carries the full MTU.

    .. code:: python

        {"sent": 3, "received": 3, "error": None}
    """

    @staticmethod
    def default() -> dict:
        return {"sent": 0, "received": 0, "error": "ping is not installed"}

    def requires_command(self, netdev: str, address: str, size: int) -> str:
        return "ping"

    def command(self, netdev: str, address: str, size: int) -> StringCommand:
        return StringCommand(
            "ping", "-M", "do", "-c", "3", "-i", "0.2", "-W", "1", "-s", str(int(size)),
            "-I", QuoteString(netdev), QuoteString(address), "2>&1", "||", "true",
        )

    def process(self, output: list[str]) -> dict:
        for line in output:
            match = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received", line)
            if match:
                errors = [l for l in output if "message too long" in l.lower() or "frag needed" in l.lower()]
                return {"sent": int(match.group(1)), "received": int(match.group(2)),
                        "error": errors[0].strip() if errors else None}
        return {"sent": 0, "received": 0, "error": " ".join(output).strip() or "no output from ping"}


class NetworkManagerDevices(FactBase[dict]):
    """
    NetworkManager's state per netdev, where NetworkManager is installed.

    .. code:: python

        {"enp1s0f0np0": "connected", "enP7s7": "unmanaged"}
    """

    default = dict

    def requires_command(self) -> str:
        return "nmcli"

    def command(self) -> str:
        return "nmcli -t -f DEVICE,STATE device 2>/dev/null || true"

    def process(self, output: list[str]) -> dict:
        return dict(line.split(":", 1) for line in output if ":" in line)
