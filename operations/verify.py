"""Readiness: read both Sparks back and say plainly what is wrong and how to fix it."""

from __future__ import annotations

import re
from dataclasses import dataclass

import click
from pyinfra import host, inventory
from pyinfra.api import QuoteString, StringCommand, operation
from pyinfra.facts.server import Sysctl, Users, Which

from facts.fabric import DfPing, NetLinks, RdmaDevices, roce_v2_gid_index
from facts.gpu import GpuMemory
from facts.identity import MachineIds, SshHostKeyFingerprints
from facts.limits import LoginMemlock
from facts.ssh_trust import SshLogin
from operations.host_prep import USERNS_KEY

PASS, FAIL, WARN = "PASS", "FAIL", "WARN"


@dataclass(frozen=True)
class Check:
    node: str
    item: str
    status: str
    detail: str
    fix: str = ""


def gather(node) -> dict:
    """Every reading the checks need from one node (``node`` is a pyinfra Host)."""
    data = node.data
    return {
        "links": node.get_fact(NetLinks),
        "rdma": node.get_fact(RdmaDevices),
        "pings": [
            node.get_fact(DfPing, netdev=rail["netdev"], address=peer["address"], size=data.fabric_mtu - 28)
            for rail, peer in zip(data.rails, data.peer_rails)
        ],
        "memlock": node.get_fact(LoginMemlock, user=data.deploy_user),
        "userns": node.get_fact(Sysctl, keys=[USERNS_KEY]).get(USERNS_KEY),
        "machine_id": node.get_fact(MachineIds).get("etc"),
        "host_keys": node.get_fact(SshHostKeyFingerprints),
        "user": node.get_fact(Users).get(data.deploy_user),
        "docker": node.get_fact(Which, command="docker"),
        "memory": node.get_fact(GpuMemory),
        "ssh_to_peer": [
            node.get_fact(SshLogin, user=data.deploy_user, address=peer["address"]) for peer in data.peer_rails
        ] if data.role == "head" else [],
    }


def rail_checks(name: str, data, facts: dict) -> list[Check]:
    """Link, RoCE port and jumbo-frame reachability of each rail of one node."""
    checks = []
    links, rdma = facts["links"], facts["rdma"]
    configured = {rail["netdev"] for rail in data.rails}
    for index, (rail, peer, ping) in enumerate(zip(data.rails, data.peer_rails, facts["pings"])):
        netdev, label = rail["netdev"], f"rail {index} {rail['netdev']}"
        link = links.get(netdev)
        if link is None:
            checks.append(Check(name, f"{label} link", FAIL, "no such netdev",
                                "set the rail's netdev in site.toml to a CX-7 interface (ip -br link)"))
            continue
        problems, fixes = [], []
        if link["operstate"] != "up":
            problems.append(f"link {link['operstate']}")
            elsewhere = active_ports_elsewhere(rdma, configured, netdev)
            if elsewhere:
                fixes.append("the cable is in the other QSFP port: " + ", ".join(
                    f"{dev} ({'/'.join(rdma[dev]['netdevs'])}) is ACTIVE" for dev in elsewhere)
                    + "; name it for this rail in site.toml (netdev, rdma), or move the cable")
            else:
                fixes.append("check the QSFP cable; plug it before boot or `echo 1 > /sys/bus/pci/rescan`")
        if link["speed_mbps"] != data.expected_link_speed_mbps and link["operstate"] == "up":
            problems.append(f"{link['speed_mbps']} Mb/s, expected {data.expected_link_speed_mbps}")
            fixes.append("reseat or replace the QSFP cable (a damaged or slower DAC negotiates down)")
        if link["mtu"] != data.fabric_mtu:
            problems.append(f"MTU {link['mtu']}, expected {data.fabric_mtu}")
            fixes.append(f"run the deploy again (it re-applies the netplan file); `ip link show {netdev}` must show mtu {data.fabric_mtu}")
        if rail["cidr"] not in link["ipv4"]:
            problems.append(f"address {rail['cidr']} missing (has {', '.join(link['ipv4']) or 'none'})")
            fixes.append(f"run the deploy again and check `netplan get` on {name}")
        checks.append(Check(name, f"{label} link", FAIL if problems else PASS,
                            "; ".join(problems) or f"up, {link['speed_mbps']} Mb/s, MTU {link['mtu']}, {rail['cidr']}",
                            "; ".join(fixes)))

        port = rdma.get(rail["rdma"], {}).get("ports", {}).get("1")
        gid_index = roce_v2_gid_index(rdma, rail["rdma"], rail["address"])
        if port is None:
            present = ", ".join(sorted(rdma)) or "none"
            checks.append(Check(name, f"rail {index} {rail['rdma']} RoCE", FAIL, f"no such RDMA device (present: {present})",
                                "set the rail's rdma in site.toml (ls /sys/class/infiniband)"))
        elif port["state"] != "ACTIVE":
            checks.append(Check(name, f"rail {index} {rail['rdma']} RoCE", FAIL, f"port {port['state']} ({port['phys_state']})",
                                f"check the cable and `ibv_devinfo -d {rail['rdma']}`; the port must be PORT_ACTIVE"))
        elif gid_index is None:
            checks.append(Check(name, f"rail {index} {rail['rdma']} RoCE", FAIL, f"no RoCE v2 GID for {rail['address']}",
                                f"the GID appears once {rail['address']} is on {netdev}: fix the link row first"))
        elif rail["gid_index"] not in ("auto", gid_index):
            checks.append(Check(name, f"rail {index} {rail['rdma']} RoCE", FAIL,
                                f"RoCE v2 GID of {rail['address']} is index {gid_index}, site.toml pins {rail['gid_index']}",
                                f"set gid_index = {gid_index} (or \"auto\") for this rail"))
        else:
            checks.append(Check(name, f"rail {index} {rail['rdma']} RoCE", PASS,
                                f"ACTIVE, {port['rate']}, RoCE v2 GID index {gid_index}"))

        size = data.fabric_mtu - 28
        if ping.get("received"):
            checks.append(Check(name, f"rail {index} jumbo ping", PASS, f"{size}-byte DF ping to {peer['address']} passes"))
        else:
            fix = (f"set MTU {data.fabric_mtu} on both ends of rail {index} (`ip link show` on each node)"
                   if link["operstate"] == "up" else "the rail has no link: see its link row")
            checks.append(Check(name, f"rail {index} jumbo ping", FAIL,
                                f"{size}-byte DF ping to {peer['address']} fails ({ping.get('error') or 'no reply'})", fix))
    return checks


def active_ports_elsewhere(rdma: dict, configured: set[str], netdev: str) -> list[str]:
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


def node_checks(name: str, data, facts: dict, peer_name: str, peer_facts: dict) -> list[Check]:
    """Everything that must hold on one node for two-node serving, rails first."""
    checks = rail_checks(name, data, facts)
    if facts["memlock"] == "unlimited":
        checks.append(Check(name, "memlock (fresh login)", PASS, "unlimited"))
    else:
        checks.append(Check(name, "memlock (fresh login)", FAIL, f"{facts['memlock']} KiB",
                            "run the deploy again, then log in anew over OpenSSH (Tailscale SSH skips pam_limits)"))
    if facts["userns"] is None:
        checks.append(Check(name, "userns sysctl", PASS, "kernel has no AppArmor userns key"))
    elif facts["userns"] == 0:
        checks.append(Check(name, "userns sysctl", PASS, f"{USERNS_KEY} = 0"))
    else:
        checks.append(Check(name, "userns sysctl", FAIL, f"{USERNS_KEY} = {facts['userns']}",
                            f"run the deploy again, or `sudo sysctl -w {USERNS_KEY}=0`"))
    if facts["machine_id"] and facts["machine_id"] != peer_facts["machine_id"]:
        checks.append(Check(name, "machine id", PASS, f"{facts['machine_id']}, distinct from {peer_name}"))
    else:
        checks.append(Check(name, "machine id", FAIL, f"{facts['machine_id']} is also {peer_name}'s",
                            "run the deploy (it gives the worker a new id), then reboot the worker"))
    shared = sorted(kind for kind, print_ in facts["host_keys"].items() if peer_facts["host_keys"].get(kind) == print_)
    if shared:
        checks.append(Check(name, "SSH host keys", WARN, f"{', '.join(shared)} shared with {peer_name} (cloned image)",
                            "on the worker: sudo rm /etc/ssh/ssh_host_* && sudo dpkg-reconfigure openssh-server"))
    else:
        checks.append(Check(name, "SSH host keys", PASS, f"distinct from {peer_name}"))
    user, peer_user = facts["user"], peer_facts["user"]
    if user and peer_user and user["uid"] == peer_user["uid"]:
        checks.append(Check(name, "deploy user", PASS, f"{data.deploy_user} uid {user['uid']} on both nodes"))
    else:
        checks.append(Check(name, "deploy user", FAIL, f"{data.deploy_user}: here {user and user['uid']}, {peer_name} {peer_user and peer_user['uid']}",
                            "create the same user with the same uid on both nodes"))
    if not facts["docker"]:
        checks.append(Check(name, "docker", FAIL, "docker not found", "install Docker (DGX OS ships it) and run again"))
    elif user and "docker" not in user.get("groups", []):
        checks.append(Check(name, "docker", FAIL, f"{data.deploy_user} is not in the docker group", "run the deploy again"))
    else:
        checks.append(Check(name, "docker", PASS, f"{facts['docker']}, {data.deploy_user} in group docker"))
    memory = facts["memory"]
    source = f"{memory['source']}" + (f", {', '.join(memory['gpus'])}" if memory["gpus"] else ", no nvidia-smi")
    detail = f"{memory['available_gib']} GiB available of {memory['total_gib']} ({source})"
    if memory["available_gib"] >= data.memory_floor_gib:
        checks.append(Check(name, "GPU memory", PASS, detail))
    else:
        checks.append(Check(name, "GPU memory", FAIL, f"{detail}, floor {data.memory_floor_gib}",
                            "stop what holds the memory (nvidia-smi, free -g) or lower memory_floor_gib"))
    for peer, reachable in zip(data.peer_rails, facts["ssh_to_peer"]):
        checks.append(Check(name, f"SSH to {peer_name} at {peer['address']}", PASS if reachable else FAIL,
                            "passwordless" if reachable else "login refused or asks for input",
                            "" if reachable else "run the deploy again (tasks/ssh_trust.py sets the key and known_hosts)"))
    return checks


def render_table(checks: list[Check]) -> str:
    widths = [max(len(getattr(c, f)) for c in checks) for f in ("node", "item", "status")]
    lines = []
    for check in checks:
        row = f"{check.node:<{widths[0]}}  {check.item:<{widths[1]}}  {check.status:<{widths[2]}}  {check.detail}"
        lines.append(click.style(row, fg={PASS: "green", FAIL: "red", WARN: "yellow"}[check.status]))
        if check.fix:
            lines.append(" " * (widths[0] + widths[1] + widths[2] + 6) + f"fix: {check.fix}")
    failed = sum(c.status == FAIL for c in checks)
    lines.append(f"readiness: {len(checks) - failed} of {len(checks)} checks pass" + (f", {failed} FAIL" if failed else ""))
    return "\n".join(lines)


@operation()
def readiness(node_names: list[str]):
    """
    Read every node back and print one readiness table; fail on any FAIL. Runs when the
    deploy executes (after every change before it); change detection and --dry skip it.

    + node_names: the inventory names of both nodes

    **Example:**

    .. code:: python

        readiness(node_names=["spark-head", "spark-worker"])
    """
    if not host.state.is_executing:
        host.noop("reads both nodes back once the changes before it have run")
        return
    nodes = [inventory.get_host(name) for name in node_names]
    facts = {node.name: gather(node) for node in nodes}
    checks = []
    for node, peer in zip(nodes, nodes[::-1]):
        checks += node_checks(node.name, node.data, facts[node.name], peer.name, facts[peer.name])
    click.echo(render_table(checks))
    failures = [c for c in checks if c.status == FAIL]
    if failures:
        summary = "; ".join(f"{c.node}: {c.item}: {c.detail}" for c in failures)
        yield StringCommand("echo", QuoteString(f"readiness FAILED: {summary}"), ">&2;", "exit", "1")
    else:
        host.noop("both nodes are ready")
