"""The cluster as one typed object, built once from the validated site file (site_config.py) and
handed to tasks, operations, clients and bench: the nodes in rank order with their rails, the
topology, the effective settings and what is served, with the active profile and its image
resolved. Nothing here reads a file or a host."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Rail:
    netdev: str
    rdma: str
    address: ipaddress.IPv4Interface
    gid_index: str | int = "auto"

    def as_data(self) -> dict:
        return {
            "netdev": self.netdev,
            "rdma": self.rdma,
            "address": str(self.address.ip),
            "cidr": str(self.address),
            "gid_index": self.gid_index,
        }


@dataclass(frozen=True)
class Node:
    rank: int
    hostname: str
    ssh_host: str
    rails: tuple[Rail, ...]

    @property
    def role(self) -> str:
        return "head" if self.rank == 0 else "worker"

    @property
    def rail_data(self) -> list[dict]:
        return [rail.as_data() for rail in self.rails]

    @property
    def fabric_addresses(self) -> list[str]:
        return [str(rail.address.ip) for rail in self.rails]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` in rank order (the head first); ``settings`` the effective ones (group_data/all.py
    < the site's [settings] < --data); ``serving`` the model, images and profiles."""

    path: Path
    deploy_user: str
    ssh_key: str | None
    ssh_port: int
    known_hosts: str | None
    nodes: tuple[Node, ...]
    settings: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)
    site_settings: dict = field(default_factory=dict)

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def workers(self) -> tuple[Node, ...]:
        return self.nodes[1:]

    @property
    def size(self) -> int:
        return len(self.nodes)

    @property
    def topology(self) -> str:
        return self.settings["topology"]

    def node(self, hostname: str) -> Node:
        return next(node for node in self.nodes if node.hostname == hostname)

    def others(self, hostname: str) -> tuple[Node, ...]:
        """Every node but this one, in rank order."""
        return tuple(node for node in self.nodes if node.hostname != hostname)

    def upstream(self, node: Node) -> Node | None:
        """The node that sends this one the runtime image and the model: the one before it in a
        chain through the ranks, so that no link carries them twice."""
        return self.nodes[node.rank - 1] if node.rank else None

    def downstream(self, node: Node) -> Node | None:
        return self.nodes[node.rank + 1] if node.rank + 1 < self.size else None

    def logins_from(self, node: Node) -> tuple[Node, ...]:
        """The nodes ``node``'s deploy user logs in to over the fabric without a password: every
        worker from the head (the image smoke test, the serving checks), the next node of the
        chain from a worker."""
        if node.rank == 0:
            return self.workers
        return (downstream,) if (downstream := self.downstream(node)) else ()

    def logins_to(self, node: Node) -> tuple[Node, ...]:
        """The nodes that log in to ``node`` over the fabric, the head first."""
        return tuple(other for other in self.nodes if node in self.logins_from(other))

    @property
    def master_addr(self) -> str:
        return str(self.head.rails[0].address.ip)

    @property
    def profile_name(self) -> str:
        return self.settings["profile"]

    @property
    def profile(self) -> dict:
        return self.serving["profiles"][self.profile_name]

    @property
    def image_name(self) -> str:
        return self.profile["image"]

    @property
    def image(self) -> dict:
        return self.serving["images"][self.image_name]

    @property
    def model(self) -> dict:
        return self.serving["model"]

    @property
    def pipeline_parallel(self) -> int:
        return parallel(self.profile, self.size)[1]

    @property
    def tensor_parallel(self) -> int:
        return parallel(self.profile, self.size)[0]


def parallel(profile: dict, nodes: int) -> tuple[int, int]:
    """(tensor parallel, pipeline parallel) of a profile on ``nodes`` nodes: every node in tensor
    parallel and no pipeline unless the profile says otherwise."""
    pipeline = profile.get("pipeline_parallel", 1)
    return profile.get("tensor_parallel", max(nodes // pipeline, 1)), pipeline
