"""The site file of the lab: what a user of these two nodes would write. It names the f0 netdevs
whichever port the cable is in (--cable f1 is the user's cable in the other port)."""

from __future__ import annotations

from pathlib import Path

from lab.config import CABLE_LAYOUTS, DEPLOY_USER, LAB_DIR, NODES, rdma_of


def render() -> str:
    lines = [
        "# The lab's site file, written by `python -m lab up`.",
        "[ssh]",
        f'user = "{DEPLOY_USER}"',
        f'key = "{LAB_DIR / "id_ed25519"}"',
        f'known_hosts = "{LAB_DIR / "known_hosts"}"',
        "",
    ]
    for role, octet in (("head", 1), ("worker", 2)):
        node = NODES[role]
        lines += ["[[node]]", f'role = "{role}"', f'hostname = "{node.hostname}"', f'ssh_host = "{node.address}"', ""]
        for index, netdev in enumerate(CABLE_LAYOUTS["f0"][0]):
            lines += ["[[node.rail]]", f'netdev = "{netdev}"', f'rdma = "{rdma_of(netdev)}"',
                      f'address = "10.0.{index}.{octet}/24"', ""]
    return "\n".join(lines)


def write() -> Path:
    site = LAB_DIR / "site.toml"
    site.write_text(render())
    return site
