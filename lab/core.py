"""The lab as a whole: bring its nodes up from the factory state, and take everything down."""

from __future__ import annotations

import json
import shutil

from lab import hardware, image, network, nodes, site
from lab.config import CABLE_LAYOUTS, HEAD, LAB_DIR, LAB_MODEL, SHAPE_FILE, TOPOLOGIES, Node, lab_nodes
from lab.processes import run


class Lab:
    """``nodes`` emulated Sparks: two joined by a QSFP cable ("direct"), or two or more through a
    switch ("switch"); the cable in the ``cable`` port layout ("f0" or "f1") of each."""

    def __init__(self, cable: str = "f0", nodes: int = 2, topology: str = "direct"):
        if topology not in TOPOLOGIES:
            raise ValueError(f"topology {topology!r}: use one of {', '.join(TOPOLOGIES)}")
        if nodes < 2 or (topology == "direct" and nodes != 2):
            raise ValueError(f"{nodes} nodes: a direct topology has exactly 2 (one cable); a switch takes 2 or more")
        self.cable, self.topology = cable, topology
        self.nodes: list[Node] = lab_nodes(nodes)

    def up(self):
        """Every node fresh from the factory image (whatever state the lab was in), booted;
        returns the lab's site file."""
        self.down()
        factory = image.factory_image()
        LAB_DIR.mkdir(parents=True, exist_ok=True)
        SHAPE_FILE.write_text(json.dumps({"nodes": len(self.nodes), "topology": self.topology, "cable": self.cable}))
        key = LAB_DIR / "id_ed25519"
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparklab-control", "-f", str(key))
        shared = image.vllm_paths()
        network.bridge_up()
        for node in self.nodes:
            nodes.create(node, factory, key, shared)
        # The user's weights, already on the head's disk (the deploy copies them into place, as the
        # deploy user: readable by every user, as a model directory is; safetensors writes 0600).
        model = HEAD.root / LAB_MODEL.lstrip("/")
        shutil.copytree(image.tiny_model(), model, ignore=shutil.ignore_patterns(".complete"))
        for path in [model, *model.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        (network.cable if self.topology == "direct" else network.switch)(self.cable, self.nodes)
        for node in self.nodes:
            nodes.boot(node)
            hardware.start_sync(node)
        return site.write(image.runtime_build_context(), image.vllm_paths(), self.nodes, self.topology, image.older_runtime_context())

    def down(self) -> None:
        """Remove namespaces, mounts, processes, links, cgroups and files of whatever lab is up
        (idempotent)."""
        for node in Lab.current().nodes:
            nodes.remove(node)
        network.switch_down(len(CABLE_LAYOUTS["f0"][0]))
        network.bridge_down()
        shutil.rmtree(LAB_DIR, ignore_errors=True)

    @staticmethod
    def current() -> Lab:
        """The lab that is up (its shape as `up` stored it), or the default pair."""
        shape = json.loads(SHAPE_FILE.read_text()) if SHAPE_FILE.exists() else {}
        return Lab(**shape)

    @staticmethod
    def status() -> dict[str, str]:
        lab = Lab.current()
        shape = f", {lab.topology}, cable in {lab.cable}" if SHAPE_FILE.exists() else ""
        return {node.hostname: ("up" if nodes.running(node) else "down") + shape for node in lab.nodes}

    @staticmethod
    def boot(node: Node) -> None:
        nodes.boot(node)
