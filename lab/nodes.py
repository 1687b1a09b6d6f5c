"""A node's life: its root file system (an overlay on the factory image), booting it (PID 1 is
node_init.py), waiting for its sshd, stopping it, and removing every trace of it."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from lab import hardware, network
from lab.config import DEPLOY_USER, HERE, Node
from lab.processes import kill_pid_file, pid_alive, run


def create(node: Node, factory: Path, control_key: Path, shared_ro: list[str]) -> None:
    """A fresh node from the factory image: its own upper layer, Docker disk and hardware."""
    for sub in ("upper", "work", "root", "docker", "sys-class/upper", "sys-class/work", "sysctl-kernel"):
        (node.dir / sub).mkdir(parents=True, exist_ok=True)
    run("mount", "-t", "overlay", "overlay", "-o",
        f"lowerdir={factory},upperdir={node.dir}/upper,workdir={node.dir}/work", str(node.root))
    ssh_dir = node.root / "home" / DEPLOY_USER / ".ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text(Path(f"{control_key}.pub").read_text())
    run("chroot", str(node.root), "chown", "-R", f"{DEPLOY_USER}:{DEPLOY_USER}", f"/home/{DEPLOY_USER}/.ssh")
    (node.root / "etc/hostname").write_text(f"{node.hostname}\n")
    (node.root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {node.hostname}\n")
    (node.dir / "ro-mounts").write_text("\n".join(shared_ro) + "\n")
    hardware.create(node)
    network.namespace_up(node)


def running(node: Node) -> bool:
    return pid_alive(node.dir / "node.pid")


def boot(node: Node) -> None:
    """Boot (or boot again after a stop or crash) a node and wait for its sshd."""
    if running(node):
        return
    (node.dir / "init.pid").unlink(missing_ok=True)
    process = subprocess.Popen(
        ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--uts", "--ipc", "--pid", "--fork",
         sys.executable, str(HERE / "node_init.py"), str(node.dir), node.hostname, node.cgroup_parent,
         f"{node.address}/24"],
        stdout=open(node.dir / "node.log", "a"), stderr=subprocess.STDOUT, start_new_session=True,
    )
    (node.dir / "node.pid").write_text(str(process.pid))
    wait_for_ssh(node)


def stop(node: Node) -> None:
    """Power the node off: every process in it dies at once, as in a crash, and its network
    interfaces lose their carrier and addresses (the next boot applies netplan again)."""
    kill_pid_file(node.dir / "node.pid")
    remove_cgroups(node)
    links = run("ip", "-n", node.netns, "-o", "link", "show", check=False, capture_output=True).stdout
    for line in links.splitlines():
        netdev = line.split(":")[1].strip().split("@")[0]
        if netdev != "lo":
            run("ip", "-n", node.netns, "link", "set", netdev, "down", check=False)
            run("ip", "-n", node.netns, "addr", "flush", "dev", netdev, check=False)


def remove(node: Node) -> None:
    stop(node)
    kill_pid_file(node.dir / "hwsync.pid")
    network.namespace_down(node)
    if node.root.is_mount():
        run("umount", "--lazy", str(node.root))
    shutil.rmtree(node.dir, ignore_errors=True)


def remove_cgroups(node: Node, timeout: float = 10) -> None:
    """The node's containers leave their cgroups behind in the host's hierarchies when it dies;
    each can go once the kernel has reaped its last process."""
    deadline = time.monotonic() + timeout
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        parent = hierarchy / node.cgroup_parent
        if not parent.is_dir():
            continue
        for group in [*sorted((p for p in parent.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True), parent]:
            while True:
                try:
                    group.rmdir()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)


def wait_for_ssh(node: Node, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((node.address, 22), timeout=1) as connection:
                if connection.recv(4).startswith(b"SSH"):
                    return
        except OSError:
            time.sleep(0.2)
    log = (node.dir / "node.log").read_text() if (node.dir / "node.log").exists() else ""
    raise RuntimeError(f"lab node {node.hostname} has no sshd after {timeout}s:\n{log[-3000:]}")
