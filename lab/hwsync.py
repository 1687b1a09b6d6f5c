"""Keeps a node's emulated ConnectX-7 RDMA sysfs tree in step with its netdevs, as the
mlx5 driver does: port ACTIVE/LinkUp while the netdev is up (unless a fault forces it DOWN),
a GID table whose IPv4-mapped entries exist only while the netdev has that IPv4 address, and
the port's counters, which stay at 0: the lab's traffic is TCP over the veth and none of it
would be RDMA on a Spark (the lab's CPU vLLM talks gloo over sockets), so no count of it may
pass for RoCE traffic.

Run inside the node's network namespace: python3 -m lab.hwsync NODE_DIR
NODE_DIR/ib is the tree bind-mounted at /sys/class/infiniband; NODE_DIR/faults holds
`port_down-<rdma>` files that force a port DOWN.
"""

import ipaddress
import json
import subprocess
import sys
import time
from pathlib import Path

from lab.config import RDMA_DEVICES

GID_SLOTS = 16
EMPTY_GID = ":".join(["0000"] * 8)
INTERVAL = 1.0  # seconds between two readings: each forks `ip`, and the lab's two cores are busy


def gid_text(address: ipaddress.IPv6Address) -> str:
    packed = address.packed.hex()
    return ":".join(packed[i : i + 4] for i in range(0, 32, 4))


def link_local(mac: str) -> ipaddress.IPv6Address:
    octets = [int(part, 16) for part in mac.split(":")]
    octets[0] ^= 0x02
    eui = octets[:3] + [0xFF, 0xFE] + octets[3:]
    return ipaddress.IPv6Address(bytes([0xFE, 0x80] + [0] * 6 + eui))


def gid_table(netdev: dict) -> list[tuple[str, str]]:
    """(gid, type) entries in the order mlx5 fills them: link-local, then each IPv4, then IPv6."""
    addresses = [link_local(netdev["address"])]
    for info in netdev.get("addr_info", []):
        if info["family"] == "inet":
            addresses.append(ipaddress.IPv6Address("::ffff:" + info["local"]))
    for info in netdev.get("addr_info", []):
        if info["family"] == "inet6" and not info["local"].startswith("fe80"):
            addresses.append(ipaddress.IPv6Address(info["local"]))
    return [(gid_text(a), kind) for a in addresses for kind in ("IB/RoCE v1", "RoCE v2")]


WRITTEN: dict[Path, str] = {}  # what this process last wrote: it is the tree's only writer once started


def write(path: Path, text: str) -> None:
    if WRITTEN.get(path) != text:
        path.write_text(text)
        WRITTEN[path] = text


def sync(node_dir: Path) -> None:
    links = {link["ifname"]: link for link in json.loads(subprocess.check_output(["ip", "-j", "-s", "addr"]))}
    for rdma, netdev_name in RDMA_DEVICES.items():
        port = node_dir / "ib" / rdma / "ports" / "1"
        netdev = links.get(netdev_name)
        if netdev is None or not port.exists():
            continue
        forced_down = (node_dir / "faults" / f"port_down-{rdma}").exists()
        up = netdev.get("operstate") == "UP" and not forced_down
        write(port / "state", "4: ACTIVE\n" if up else "1: DOWN\n")
        write(port / "phys_state", "5: LinkUp\n" if up else "3: Disabled\n")
        counters = port / "counters"
        counters.mkdir(exist_ok=True)
        for name in ("port_xmit_data", "port_rcv_data", "port_xmit_packets", "port_rcv_packets", "port_rcv_errors",
                     "symbol_error", "link_downed", "port_xmit_discards"):
            write(counters / name, "0\n")
        table = gid_table(netdev)
        for slot in range(GID_SLOTS):
            gid, kind = table[slot] if slot < len(table) else (EMPTY_GID, "")
            write(port / "gids" / str(slot), gid + "\n")
            write(port / "gid_attrs" / "types" / str(slot), kind + "\n" if kind else "")
            write(port / "gid_attrs" / "ndevs" / str(slot), netdev_name + "\n" if kind else "")


def main() -> None:
    node_dir = Path(sys.argv[1])
    while True:
        sync(node_dir)
        time.sleep(INTERVAL)


if __name__ == "__main__":
    main()
