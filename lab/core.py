"""The lab as a whole: bring both nodes up from the factory state, and take everything down."""

from __future__ import annotations

import shutil

from lab import hardware, image, network, nodes, site
from lab.config import HEAD, LAB_DIR, LAB_MODEL, NODES, Node
from lab.processes import run


class Lab:
    """Two emulated Sparks joined by a QSFP cable in the ``cable`` port layout ("f0" or "f1")."""

    def __init__(self, cable: str = "f0"):
        self.cable = cable

    def up(self):
        """Both nodes fresh from the factory image (whatever state the lab was in), booted;
        returns the lab's site file."""
        self.down()
        factory = image.factory_image()
        LAB_DIR.mkdir(parents=True, exist_ok=True)
        key = LAB_DIR / "id_ed25519"
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparklab-control", "-f", str(key))
        (LAB_DIR / "cable").write_text(self.cable)
        shared = image.vllm_paths()
        network.bridge_up()
        for node in NODES.values():
            nodes.create(node, factory, key, shared)
        # The user's weights, already on the head's disk (the deploy copies them into place).
        shutil.copytree(image.tiny_model(), HEAD.root / LAB_MODEL.lstrip("/"), ignore=shutil.ignore_patterns(".complete"))
        network.cable(self.cable)
        for node in NODES.values():
            nodes.boot(node)
            hardware.start_sync(node)
        return site.write(image.runtime_build_context(), image.vllm_paths())

    def down(self) -> None:
        """Remove namespaces, mounts, processes, links, cgroups and files (idempotent)."""
        for node in NODES.values():
            nodes.remove(node)
        network.bridge_down()
        shutil.rmtree(LAB_DIR, ignore_errors=True)

    @staticmethod
    def status() -> dict[str, str]:
        cable = (LAB_DIR / "cable").read_text() if (LAB_DIR / "cable").exists() else None
        return {node.hostname: ("up" if nodes.running(node) else "down") + (f", cable in {cable}" if cable else "")
                for node in NODES.values()}

    @staticmethod
    def boot(node: Node) -> None:
        nodes.boot(node)
