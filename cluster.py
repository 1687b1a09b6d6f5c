"""The site as typed values, parsed once from the validated site file (site_config.py) and handed
to tasks, operations, checks, clients and bench: the cluster's nodes in rank order with their
rails, the effective settings, the model, the images and the profiles, with the active profile
and its image resolved. Nothing here reads a file or a host."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path

from site_schema import SETTINGS


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


HEAL_FACTOR = 1.5  # a heal is expected within this many times the head's last measured start, plus heal_margin_seconds


# The effective settings: their defaults < the site's [settings] < --data, one field per setting of
# site_schema.SETTINGS (its kind, default, bounds and meaning are there), each checked before it is here.
Settings = make_dataclass("Settings", [(name, key.kind) for name, key in SETTINGS.items()], frozen=True)
Settings.__module__ = __name__


@dataclass(frozen=True)
class Model:
    """The weights every profile serves: a hub repository at a pinned revision, or a directory on
    the head (``path``); and how vLLM reads and names them."""

    served_name: str
    tokenizer_mode: str
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    tool_call_parser: str = ""  # "": none
    reasoning_parser: str = ""

    @property
    def source(self) -> dict:
        """Where the weights come from, as the manifest records it: a hub revision or a path."""
        return {"path": self.path} if self.path else {"repo": self.repo, "revision": self.revision}


@dataclass(frozen=True)
class Image:
    """A runtime image: pulled by digest (``ref``) or built from a directory here (``build``),
    known on every node by ``tag``."""

    tag: str
    kv_cache_dtypes: list[str]
    python: str
    vllm: str
    env: dict[str, str]
    ref: str | None = None
    build: str | None = None


@dataclass(frozen=True)
class Profile:
    """A serving profile (group_data/serving.toml's, or the site's [profile.NAME])."""

    image: str
    kv_cache_dtype: str
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    gpu_memory_utilization: float
    speculative_tokens: int
    thinking: bool
    prefix_caching: bool
    flashinfer_autotune: bool
    privileged: bool
    agent_compact_tokens: int
    env: dict[str, str]
    speculative_schedule: list[list[int]] | None = None  # [batch_start, batch_end, k], from 1 to max_num_seqs
    adaptive_verification: bool | None = None
    tensor_parallel: int | None = None  # None: every node
    pipeline_parallel: int | None = None  # None: 1
    weight_prefetch: bool = False  # vLLM reads the weights' files ahead into the page cache (docs/serving.md)


@dataclass(frozen=True)
class Canary:
    """A canary (group_data/serving.toml's, or the site's [canary.NAME]): a prompt completed
    greedily after every change, its answer checked (files/dual_spark/canary.py)."""

    prompt: str
    max_tokens: int | None = None
    long: bool = False  # its length is canary_long_tokens
    ignore_eos: bool = False
    checks: tuple[str, ...] = ("answer", "text", "loop", "greedy")  # none for a perplexity canary
    perplexity: bool = False  # the prompt is a text the model's perplexity is measured over
    watch: bool = False  # asked again while the head serves, its answer compared with the recorded one (files/dual_spark/answers.py)
    tool: dict | None = None  # a function offered: the answer must call it (asked as a chat, tool_choice auto)
    extra_body: dict | None = None  # fields laid under the request's own


@dataclass(frozen=True)
class Cluster:
    """``nodes`` in rank order (the head first); the effective ``settings``; what is served: the
    ``model``, the ``images`` and the ``profiles`` by name; the ``clients`` the site names."""

    path: Path
    deploy_user: str
    ssh_key: str | None
    ssh_port: int
    known_hosts: str | None
    nodes: tuple[Node, ...]
    settings: Settings
    model: Model
    images: dict[str, Image]
    profiles: dict[str, Profile]
    clients: tuple[str, ...] = ()  # [client.NAME]: each has a key of its own at the front door
    canaries: dict[str, Canary] = field(default_factory=dict)

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
        return self.settings.topology

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
        return self.settings.profile

    @property
    def profile(self) -> Profile:
        return self.profiles[self.profile_name]

    @property
    def image_name(self) -> str:
        return self.profile.image

    @property
    def image(self) -> Image:
        return self.images[self.image_name]

    @property
    def pipeline_parallel(self) -> int:
        return parallel(self.profile.tensor_parallel, self.profile.pipeline_parallel, self.size)[1]

    @property
    def tensor_parallel(self) -> int:
        return parallel(self.profile.tensor_parallel, self.profile.pipeline_parallel, self.size)[0]


def parallel(tensor: int | None, pipeline: int | None, nodes: int) -> tuple[int, int]:
    """(tensor parallel, pipeline parallel) on ``nodes`` nodes of a profile's (None where it sets
    none): every node in tensor parallel and no pipeline unless the profile says otherwise."""
    pipeline = pipeline or 1
    return tensor or max(nodes // pipeline, 1), pipeline
