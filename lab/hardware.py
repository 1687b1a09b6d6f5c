"""The emulated GB10 and ConnectX-7 parts of a node, from the real formats: link speed in
sysfs, the RDMA sysfs tree (kept in step with the netdevs by hwsync.py), unified-memory
/proc/meminfo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lab.config import HERE, RDMA_DEVICES, Node
from lab.processes import pid_alive

GIB_KB = 1024 * 1024
TOTAL_GIB, AVAILABLE_GIB = 121.6, 117.4


def meminfo(total_gib: float, available_gib: float) -> str:
    """A GB10-like /proc/meminfo: the GPU's memory is the host's."""
    total, available = int(total_gib * GIB_KB), int(available_gib * GIB_KB)
    return (
        f"MemTotal:       {total} kB\nMemFree:        {available - 2 * GIB_KB} kB\n"
        f"MemAvailable:   {available} kB\nBuffers:          262144 kB\nCached:         {2 * GIB_KB} kB\n"
        "SwapCached:            0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
    )


def set_available_memory(node: Node, gib: float) -> None:
    (node.dir / "hw/meminfo").write_text(meminfo(TOTAL_GIB, gib))


def set_link_speed(node: Node, netdev: str, mbps: int) -> None:
    (node.dir / "hw/speed" / netdev).write_text(f"{mbps}\n")


def create(node: Node) -> None:
    """The node's hardware files, before it boots: memory and a CX-7 RDMA tree with ports DOWN."""
    for sub in ("hw/speed", "ib", "faults"):
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    set_available_memory(node, AVAILABLE_GIB)
    for rdma, netdev in RDMA_DEVICES.items():
        device = node.dir / "ib" / rdma
        port = device / "ports/1"
        for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
            (port / sub).mkdir(parents=True, exist_ok=True)
        (device / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
        (device / "node_type").write_text("1: CA\n")
        (port / "state").write_text("1: DOWN\n")
        (port / "phys_state").write_text("3: Disabled\n")
        (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
        (port / "link_layer").write_text("Ethernet\n")


def start_sync(node: Node) -> None:
    """hwsync.py in the node's network namespace, as the mlx5 driver keeps sysfs in step."""
    pid_file = node.dir / "hwsync.pid"
    if pid_alive(pid_file):
        return
    process = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, sys.executable, "-m", "lab.hwsync", str(node.dir)],
        cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=open(node.dir / "hwsync.log", "a"), start_new_session=True,
    )
    pid_file.write_text(str(process.pid))


def port_down_fault(node: Node, rdma: str) -> Path:
    return node.dir / "faults" / f"port_down-{rdma}"
