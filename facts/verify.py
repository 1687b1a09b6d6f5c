"""Everything verification reads from one node, in one round trip: the fabric, limits,
identity, the deploy user, Docker, memory, the runtime artifacts and the serving stack; pings
to the other nodes, SSH logins to them and the API's one-token probe run at the same time as the rest."""

from __future__ import annotations

import json
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from cluster import Cluster
from facts.combine import combined, part, split
from facts.fabric import DfPing, Links, NetLinks, Ping, Rdma, RdmaDevices
from facts.gpu import GpuMemory, Memory
from facts.host_prep import Account, SysctlReading, SysctlValue, UserGroups
from facts.identity import HostKeys, Identity, MachineIds, SshHostKeyFingerprints
from facts.limits import LoginMemlock, Memlock
from facts.runtime import Image, ImageState, Model, ModelState
from facts.serving import Serving, ServingState, stack_sections
from facts.ssh_trust import Login, SshLogin


class Readings(TypedDict):
    links: Links
    rdma: Rdma
    pings: list[Ping]
    memlock: Memlock
    userns: SysctlReading
    identity: Identity
    host_keys: HostKeys
    user: Account
    docker: str | None
    memory: Memory
    ssh_to: list[Login]
    image: Image
    model: Model
    serving: Serving
    api: dict | None
    listening: list[str]
    unreadable: list[str]


class Readiness(FactBase[Readings]):
    """
    The readings behind one node's rows of the readiness table. ``pings`` are
    "netdev address" pairs, pinged with ``size``-byte don't-fragment probes; ``ssh_to`` the
    addresses of other nodes ``user`` must reach without a password; ``runtime`` the arguments of
    ImageState (tag, marker) and ModelState (programs, model_dir, manifest, state); ``serving`` the
    stack directory and key file, and on the head the API's host and port (the one-token probe of
    the programs' `health` runs at the same time as the rest).

    .. code:: python

        {"links": {...NetLinks...}, "rdma": {...RdmaDevices...}, "pings": [{...DfPing...}],
         "memlock": {"limit": "unlimited", ...}, "userns": {"value": 0, ...}, "identity": {...MachineIds...},
         "host_keys": {...}, "user": {"exists": True, "uid": 1000, "groups": ["docker"], ...},
         "docker": "/usr/bin/docker", "memory": {...GpuMemory...}, "ssh_to": [{"ok": True, ...}],
         "image": {...ImageState...}, "model": {...ModelState...}, "serving": {...ServingState...},
         "api": {"ok": True, "model": "tiny", "max_model_len": 512, ...}, "listening": ["127.0.0.1"], "unreadable": []}
    """

    @staticmethod
    def default() -> Readings:
        return {"links": NetLinks.default(), "rdma": RdmaDevices.default(), "pings": [], "memlock": LoginMemlock.default(),
                "userns": SysctlValue.default(), "identity": MachineIds.default(), "host_keys": SshHostKeyFingerprints.default(),
                "user": UserGroups.default(), "docker": None, "memory": GpuMemory.default(), "ssh_to": [],
                "image": ImageState.default(), "model": ModelState.default(), "serving": ServingState.default(), "api": None,
                "listening": [], "unreadable": []}

    def command(self, user: str, pings: list[str], size: int, ssh_to: list[str], userns_key: str, runtime: dict,
                serving: dict) -> StringCommand:
        background = {f"ping {i}": DfPing().command(*pair.split(), size=size) for i, pair in enumerate(pings)}
        background |= {f"ssh {i}": SshLogin().command(user, address) for i, address in enumerate(ssh_to)}
        if "api_port" in serving:
            background["api"] = StringCommand(
                "python3", QuoteString(runtime["programs"]), "health", "--url", QuoteString(f"http://{serving['api_host']}:{serving['api_port']}"),
                "--key-file", QuoteString(serving["key_file"]), "--timeout", "20", "2>/dev/null")
        slow = {  # each a process of its own that takes tens of milliseconds: all at the same time
            "memlock": LoginMemlock().command(user),
            "host_keys": SshHostKeyFingerprints().command(),
            "memory": GpuMemory().command(),
            "image": ImageState().command(runtime["tag"], runtime["marker"]),
            "model": ModelState().command(runtime["programs"], runtime["model_dir"], runtime["manifest"], runtime["state"], user),
            "serving": combined(stack_sections(serving["stack_dir"], serving["key_file"], runtime["manifest"])),
        }
        return combined({
            "links": NetLinks().command(),
            "rdma": RdmaDevices().command(),
            "userns": SysctlValue().command(userns_key),
            "identity": MachineIds().command(),
            "user": UserGroups().command(user),
            "docker": StringCommand("command", "-v", "docker", "||", "true"),
            **({"listening": StringCommand("ss", "-Hltn", QuoteString(f"sport = :{serving['api_port']}"), "2>/dev/null")}
               if "api_port" in serving else {}),
        }, {**background, **slow})

    def process(self, output: list[str]) -> Readings:
        sections = split(output)

        def numbered(prefix: str) -> list[list[str]]:
            found = sorted((int(name.split()[1]), lines) for name, lines in sections.items()
                           if name.startswith(prefix + " ") and name.split()[1].isdigit())
            return [lines for _, lines in found]

        docker = [line.strip() for line in sections.get("docker", []) if line.strip().startswith("/")]
        return {
            "links": NetLinks().process(sections.get("links", [])),
            "rdma": RdmaDevices().process(sections.get("rdma", [])),
            "pings": [DfPing().process(lines) for lines in numbered("ping")],
            "memlock": LoginMemlock().process(sections.get("memlock", [])),
            "userns": SysctlValue().process(sections.get("userns", [])),
            "identity": MachineIds().process(sections.get("identity", [])),
            "host_keys": SshHostKeyFingerprints().process(sections.get("host_keys", [])),
            "user": UserGroups().process(sections.get("user", [])),
            "docker": docker[0] if docker else None,
            "memory": GpuMemory().process(sections.get("memory", [])),
            "ssh_to": [SshLogin().process(lines) for lines in numbered("ssh")],
            "image": ImageState().process(part(sections, "image")),
            "model": ModelState().process(part(sections, "model")),
            "serving": ServingState().process(part(sections, "serving")),
            "api": api_reading(sections.get("api")),
            "listening": sorted({line.split()[3].rsplit(":", 1)[0] for line in sections.get("listening", []) if len(line.split()) >= 4}),
            "unreadable": sections[""],
        }


def api_reading(lines: list[str] | None) -> dict | None:
    """The health probe's JSON line; None where no probe ran (a worker)."""
    if lines is None:
        return None
    try:
        return json.loads([line for line in lines if line.strip()][-1])
    except (ValueError, IndexError):
        return {"ok": False, "model": None, "max_model_len": None, "error": "the health probe printed nothing readable", "unreadable": lines}


def ping_targets(cluster: Cluster, name: str) -> list[tuple[int, str, str, str]]:
    """What ``name`` pings: every other node on every rail, as (rail index, netdev, other node,
    its address), rail by rail and the others in rank order."""
    return [(index, rail.netdev, other.hostname, str(other.rails[index].address.ip))
            for index, rail in enumerate(cluster.node(name).rails) for other in cluster.others(name)]


def ssh_targets(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    """Where ``name``'s deploy user must log in without a password, as (node, address) on every rail."""
    return [(target.hostname, address) for target in cluster.logins_from(cluster.node(name)) for address in target.fabric_addresses]
