"""Faults the tests inject into a running lab, each the lab's form of something that happens to
real Sparks. `python -m lab up` starts from the factory state, so none outlives the lab."""

from __future__ import annotations

import re
import time

from lab import hardware, hwsync, network, nodes
from lab.config import Node
from lab.processes import in_node


def slow_link(node: Node, netdev: str, mbps: int) -> None:
    """A damaged or slower DAC negotiates down."""
    hardware.set_link_speed(node, netdev, mbps)


def switch_port_autonegotiated(node: Node, netdev: str, mbps: int = 100000) -> None:
    """The node's switch port left at auto-negotiation: the link comes up at 100G, and
    `ethtool` (sysfs speed) on the Spark reads 100000 Mb/s. ``mbps=200000`` is the port forced
    to 200G again."""
    hardware.set_link_speed(node, netdev, mbps)


def set_mtu(node: Node, netdev: str, mtu: int) -> None:
    network.set_mtu(node, netdev, mtu)


def link(node: Node, netdev: str, up: bool) -> None:
    """One rail's link going down (or up again), as when a CX-7 port loses its carrier."""
    network.set_link(node, netdev, up)


def port_down(node: Node, rdma: str, down: bool) -> None:
    fault = hardware.port_down_fault(node, rdma)
    fault.touch() if down else fault.unlink(missing_ok=True)
    time.sleep(hwsync.INTERVAL + 1)  # hwsync.py applies it


def available_memory(node: Node, gib: float) -> None:
    hardware.set_available_memory(node, gib)


def crash(node: Node) -> None:
    """The node dies at once (kernel panic, power cut); `nodes.boot` starts it again."""
    nodes.stop(node)


def kill(node: Node, pattern: str, signal: str = "KILL") -> bool:
    """Kill the node's processes whose command line matches ``pattern``; whether any matched."""
    return in_node(node.dir, "pkill", f"-{signal}", "-f", pattern, check=False).returncode == 0


VLLM_PROCESSES = "vllm serve|VLLM::"  # launch.sh's exec'd `vllm serve` and what it forks, each titled VLLM::NAME


def freeze(node: Node) -> None:
    """Every vLLM process of the node stopped (SIGSTOP), its watchdog left running: a rank that
    lives and holds its sockets but computes nothing, as a hung GPU leaves it. Stopped again
    until none runs: one forked while the first signals went out would carry on."""
    for _ in range(20):
        in_node(node.dir, "pkill", "-STOP", "-f", VLLM_PROCESSES)
        states = in_node(node.dir, "ps", "-eo", "stat=,args=", capture_output=True).stdout.splitlines()
        if all(line.split()[0][0] in "TZ" for line in states if re.search(VLLM_PROCESSES, line)):
            return
        time.sleep(0.1)
    raise AssertionError(f"{node.hostname}: a vLLM process still runs after SIGSTOP")


def restart_docker(node: Node) -> None:
    """`systemctl restart docker`: dockerd stops (its containers with it) and starts again."""
    in_node(node.dir, "sh", "-c", "kill -TERM $(cat /run/docker.pid)")


def small_disk(node: Node, path: str, size: str) -> None:
    """A nearly full disk under ``path`` on the node (a tmpfs of ``size``, e.g. "16m"), its root
    root's and mode 755 as a new ext4 file system's is (a tmpfs's own 1777 the deploy refuses)."""
    in_node(node.dir, "mkdir", "-p", path)
    in_node(node.dir, "mount", "-t", "tmpfs", "-o", f"size={size},mode=755", "tmpfs", path)


def free_disk(node: Node, path: str) -> None:
    in_node(node.dir, "umount", path, check=False)
