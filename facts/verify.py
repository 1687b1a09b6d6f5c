"""Everything verification reads from one node, in one round trip: the fabric, limits,
identity, the deploy user, Docker and memory; pings and SSH logins to the peer run at the same
time as the rest."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, StringCommand

from facts.combine import combined, part, split
from facts.fabric import DfPing, Links, NetLinks, Ping, Rdma, RdmaDevices
from facts.gpu import GpuMemory, Memory
from facts.host_prep import Account, SysctlReading, SysctlValue, UserGroups
from facts.identity import HostKeys, Identity, MachineIds, SshHostKeyFingerprints
from facts.limits import LoginMemlock, Memlock
from facts.runtime import Image, ImageState, Model, ModelState
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
    ssh_to_peer: list[Login]
    image: Image
    model: Model
    unreadable: list[str]


class Readiness(FactBase[Readings]):
    """
    The readings behind one node's rows of the readiness table. ``pings`` are
    "netdev address" pairs, pinged with ``size``-byte don't-fragment probes; ``ssh_to`` the
    peer addresses ``user`` must reach without a password; ``runtime`` the arguments of
    ImageState (tag, marker) and ModelState (script, model_dir, manifest, state).

    .. code:: python

        {"links": {...NetLinks...}, "rdma": {...RdmaDevices...}, "pings": [{...DfPing...}],
         "memlock": {"limit": "unlimited", ...}, "userns": {"value": 0, ...}, "identity": {...MachineIds...},
         "host_keys": {...}, "user": {"exists": True, "uid": 1000, "groups": ["docker"], ...},
         "docker": "/usr/bin/docker", "memory": {...GpuMemory...}, "ssh_to_peer": [{"ok": True, ...}],
         "image": {...ImageState...}, "model": {...ModelState...}, "unreadable": []}
    """

    @staticmethod
    def default() -> Readings:
        return {"links": NetLinks.default(), "rdma": RdmaDevices.default(), "pings": [], "memlock": LoginMemlock.default(),
                "userns": SysctlValue.default(), "identity": MachineIds.default(), "host_keys": SshHostKeyFingerprints.default(),
                "user": UserGroups.default(), "docker": None, "memory": GpuMemory.default(), "ssh_to_peer": [],
                "image": ImageState.default(), "model": ModelState.default(), "unreadable": []}

    def command(self, user: str, pings: list[str], size: int, ssh_to: list[str], userns_key: str, runtime: dict) -> StringCommand:
        background = {f"ping {i}": DfPing().command(*pair.split(), size=size) for i, pair in enumerate(pings)}
        background |= {f"ssh {i}": SshLogin().command(user, address) for i, address in enumerate(ssh_to)}
        return combined({
            "links": NetLinks().command(),
            "rdma": RdmaDevices().command(),
            "memlock": LoginMemlock().command(user),
            "userns": SysctlValue().command(userns_key),
            "identity": MachineIds().command(),
            "host_keys": SshHostKeyFingerprints().command(),
            "user": UserGroups().command(user),
            "docker": StringCommand("command", "-v", "docker", "||", "true"),
            "memory": GpuMemory().command(),
            "image": ImageState().command(runtime["tag"], runtime["marker"]),
            "model": ModelState().command(runtime["script"], runtime["model_dir"], runtime["manifest"], runtime["state"],
                                          user, "/dev/null"),
        }, background)

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
            "ssh_to_peer": [SshLogin().process(lines) for lines in numbered("ssh")],
            "image": ImageState().process(part(sections, "image")),
            "model": ModelState().process(part(sections, "model")),
            "unreadable": sections[""],
        }


def ping_targets(rails: list[dict], peer_rails: list[dict]) -> list[str]:
    """The "netdev address" pairs for Readiness: each rail to the peer's end of it."""
    return [f"{rail['netdev']} {peer['address']}" for rail, peer in zip(rails, peer_rails)]

