"""The lab: two emulated DGX Sparks on this machine, for end-to-end runs over real SSH.

Each node is a Debian root filesystem (debootstrap once, cached; an overlay per node) in its
own network, mount, UTS and PID namespaces, with sshd as PID 1. Like cloned factory images,
both start with the same /etc/machine-id and the same SSH host keys. A bridge carries the
management LAN (198.51.100.0/24); two veth pairs named as on a Spark are the QSFP cable.
Emulated from real outputs: link speed in sysfs, the CX-7 RDMA sysfs tree (hwsync.py), a GB10
nvidia-smi, unified-memory /proc/meminfo, the Ubuntu userns sysctl key, `netplan apply`, and
an unlimited memlock, which this machine's kernel withholds (shim/memlock_shim.c). The nodes'
apt source is an offline mirror of the packages debootstrap fetched; iperf3 is left out of the
image so that a fresh converge installs it.

    python3 tests/lab/lab.py up [--cable f0|f1]   # idempotent; writes $SPARKLAB_DIR/site.toml
    python3 tests/lab/lab.py down                 # removes namespaces, mounts, processes, links
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import click

HERE = Path(__file__).resolve().parent
LAB_DIR = Path(os.environ.get("SPARKLAB_DIR", "/var/tmp/sparklab"))
CACHE_DIR = Path(os.environ.get("SPARKLAB_CACHE", "/var/cache/sparklab"))
SUITE = "trixie"
PACKAGES = [
    "openssh-server", "python3", "sudo", "rsync", "iproute2", "netplan.io", "systemd", "kmod",
    "procps", "iputils-ping", "iperf3", "perftest", "rdma-core", "ibverbs-utils",
    "infiniband-diags", "python3-venv", "docker.io", "docker-cli",
]
# Left out of the factory image (then served by its offline mirror) so that a fresh converge installs it.
NOT_IN_FACTORY_IMAGE = ["iperf3"]
OFFLINE_MIRROR = "/var/lib/sparklab-mirror"
DEPLOY_USER = "spark"
BRIDGE, BRIDGE_ADDRESS = "sparklab0", "198.51.100.1/24"
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
GIB_KB = 1024 * 1024
MEMLOCK_SHIM = HERE / "shim/memlock_shim.c"


@dataclass(frozen=True)
class Node:
    role: str
    hostname: str
    address: str

    @property
    def netns(self) -> str:
        return f"sparklab-{self.role}"

    @property
    def dir(self) -> Path:
        return LAB_DIR / self.role

    @property
    def root(self) -> Path:
        return self.dir / "root"


NODES = {
    "head": Node("head", "spark-head", "198.51.100.11"),
    "worker": Node("worker", "spark-worker", "198.51.100.12"),
}


def run(*args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, text=True, **kwargs)


def quiet(*args: str) -> None:
    subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = line.replace("URIs:", "deb").split()
            for word in words:
                if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                    return word
    return "http://deb.debian.org/debian"


def base_image() -> Path:
    """The cached factory image: debootstrap plus the lab's emulated GB10 tools."""
    factory_files = sorted(p for p in (HERE / "factory").rglob("*") if p.is_file())
    digest = hashlib.sha256(" ".join([SUITE, *PACKAGES, *NOT_IN_FACTORY_IMAGE, DEPLOY_USER]).encode())
    for path in [*factory_files, MEMLOCK_SHIM]:
        digest.update(path.read_bytes())
    base = CACHE_DIR / f"base-{digest.hexdigest()[:12]}"
    if (base / ".complete").exists():
        return base
    building = base.with_suffix(".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(building),
        debian_mirror(), stdout=subprocess.DEVNULL)
    chroot = ("chroot", str(building))
    offline_mirror(building)
    run(*chroot, "dpkg", "--purge", *NOT_IN_FACTORY_IMAGE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run(*chroot, "dpkg-divert", "--local", "--rename", "--add", "/usr/sbin/netplan", stdout=subprocess.DEVNULL)
    for path in factory_files:
        target = building / path.relative_to(HERE / "factory")
        shutil.copy2(path, target)
    shim = building / "usr/local/lib/sparklab/memlock_shim.so"
    shim.parent.mkdir(parents=True)
    run("gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(MEMLOCK_SHIM), "-ldl")
    (building / "etc/ld.so.preload").write_text("/usr/local/lib/sparklab/memlock_shim.so\n")
    run(*chroot, "useradd", "--create-home", "--shell", "/bin/bash", DEPLOY_USER)
    (building / "etc/sudoers.d/deploy").write_text(f"{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n")
    (building / "etc/ssh/sshd_config.d/lab.conf").write_text("UseDNS no\nPasswordAuthentication no\n")
    (building / "etc/netplan").mkdir(exist_ok=True)
    (building / ".complete").touch()
    building.rename(base)
    return base


def offline_mirror(root: Path) -> None:
    """The nodes have no internet: their apt source becomes a local flat repository of the
    packages debootstrap fetched, so the deploy's `apt-get update` and install run for real."""
    repo = root / OFFLINE_MIRROR.lstrip("/")
    repo.mkdir(parents=True)
    stanzas = []
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        shutil.copy2(deb, repo / deb.name)
        control = run("chroot", str(root), "dpkg-deb", "-f", f"{OFFLINE_MIRROR}/{deb.name}", capture_output=True).stdout
        data = deb.read_bytes()
        stanzas.append(control.strip() + f"\nFilename: ./{deb.name}\nSize: {len(data)}\nSHA256: {hashlib.sha256(data).hexdigest()}\n")
    packages = "\n".join(stanzas).encode()
    (repo / "Packages").write_bytes(packages)
    (repo / "Release").write_text(f"Origin: sparklab\nLabel: sparklab\nSHA256:\n {hashlib.sha256(packages).hexdigest()} {len(packages)} Packages\n")
    (root / "etc/apt/sources.list").write_text(f"deb [trusted=yes] file:{OFFLINE_MIRROR} ./\n")
    shutil.rmtree(root / "var/lib/apt/lists")
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)


def control_key() -> Path:
    key = LAB_DIR / "id_ed25519"
    if not key.exists():
        LAB_DIR.mkdir(parents=True, exist_ok=True)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "sparklab-control", "-f", str(key))
    return key


def pid_alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
        return True
    except (OSError, ValueError):
        return False


def kill_pid_file(pid_file: Path) -> None:
    if pid_alive(pid_file):
        os.killpg(int(pid_file.read_text()), signal.SIGKILL)
    pid_file.unlink(missing_ok=True)


def meminfo(total_gib: float, available_gib: float) -> str:
    """A GB10-like /proc/meminfo: the GPU's memory is the host's."""
    total, available = int(total_gib * GIB_KB), int(available_gib * GIB_KB)
    return (
        f"MemTotal:       {total} kB\nMemFree:        {available - 2 * GIB_KB} kB\n"
        f"MemAvailable:   {available} kB\nBuffers:          262144 kB\nCached:         {2 * GIB_KB} kB\n"
        "SwapCached:            0 kB\nSwapTotal:             0 kB\nSwapFree:              0 kB\n"
    )


class Lab:
    """Bring the two nodes up and down, and inject the faults the tests need."""

    def __init__(self, cable: str = "f0"):
        self.cable = cable

    # -- life cycle ---------------------------------------------------------------------

    def up(self) -> Path:
        layout = LAB_DIR / "cable"
        if layout.exists() and layout.read_text() != self.cable and any(map(self.node_running, NODES.values())):
            raise click.ClickException(f"the lab is up with the cable in {layout.read_text()}: bring it down first")
        base = base_image()
        key = control_key()
        layout.write_text(self.cable)
        self._bridge()
        for node in NODES.values():
            if not self.node_running(node):
                self._create_node(node, base, key)
        self._cable()
        for node in NODES.values():
            self.start_node(node)
            self._start_hwsync(node)
        for node in NODES.values():
            self._wait_for_ssh(node)
        return self.write_site()

    def down(self) -> None:
        for node in NODES.values():
            kill_pid_file(node.dir / "node.pid")
            self._remove_node(node)
        quiet("ip", "link", "del", BRIDGE)
        shutil.rmtree(LAB_DIR, ignore_errors=True)

    def node_running(self, node: Node) -> bool:
        return pid_alive(node.dir / "node.pid")

    def start_node(self, node: Node) -> None:
        """Boot (or reboot after a crash) a node: its sshd becomes PID 1 again."""
        if self.node_running(node):
            return
        process = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, "unshare", "--mount", "--uts", "--pid", "--fork",
             sys.executable, str(HERE / "node_init.py"), str(node.dir), node.hostname],
            stdout=open(node.dir / "node.log", "a"), stderr=subprocess.STDOUT, start_new_session=True,
        )
        (node.dir / "node.pid").write_text(str(process.pid))
        self._wait_for_ssh(node)

    def kill_sshd(self, node: Node) -> None:
        """Kill the node's sshd (its PID 1), as a crash would."""
        kill_pid_file(node.dir / "node.pid")

    # -- faults -------------------------------------------------------------------------

    def set_link_speed(self, node: Node, netdev: str, mbps: int) -> None:
        (node.dir / "hw/speed" / netdev).write_text(f"{mbps}\n")

    def set_mtu(self, node: Node, netdev: str, mtu: int) -> None:
        run("ip", "-n", node.netns, "link", "set", "dev", netdev, "mtu", str(mtu))

    def set_port_down(self, node: Node, rdma: str, down: bool) -> None:
        fault = node.dir / "faults" / f"port_down-{rdma}"
        fault.touch() if down else fault.unlink(missing_ok=True)
        time.sleep(1)

    def set_available_memory(self, node: Node, gib: float) -> None:
        (node.dir / "hw/meminfo").write_text(meminfo(121.6, gib))

    # -- pieces -------------------------------------------------------------------------

    def write_site(self) -> Path:
        """The site file a user of these two nodes would write: it names the f0 netdevs
        whichever port the cable is in (--cable f1 is the user's cable in the other port)."""
        cabled = CABLE_LAYOUTS["f0"][0]
        rails = []
        for role, octet in (("head", 1), ("worker", 2)):
            node = NODES[role]
            rails.append(
                f'[[node]]\nrole = "{role}"\nhostname = "{node.hostname}"\nssh_host = "{node.address}"\n\n'
                + "".join(
                    f'[[node.rail]]\nnetdev = "{netdev}"\nrdma = "{rdma_of(netdev)}"\naddress = "10.0.{i}.{octet}/24"\n\n'
                    for i, netdev in enumerate(cabled)
                )
            )
        site = LAB_DIR / "site.toml"
        site.write_text(
            "# The lab's site file, written by tests/lab/lab.py.\n"
            f'[ssh]\nuser = "{DEPLOY_USER}"\nkey = "{LAB_DIR / "id_ed25519"}"\n'
            f'known_hosts = "{LAB_DIR / "known_hosts"}"\n\n' + "".join(rails)
        )
        return site

    def _bridge(self) -> None:
        if run("ip", "link", "show", BRIDGE, check=False, capture_output=True).returncode != 0:
            run("ip", "link", "add", BRIDGE, "type", "bridge")
            run("ip", "addr", "add", BRIDGE_ADDRESS, "dev", BRIDGE)
        run("ip", "link", "set", BRIDGE, "up")

    def _create_node(self, node: Node, base: Path, key: Path) -> None:
        self._remove_node(node)
        for sub in ("upper", "work", "root", "hw/speed", "ib", "faults", "sys-class/upper",
                    "sys-class/work", "sysctl-kernel"):
            (node.dir / sub).mkdir(parents=True, exist_ok=True)
        run("mount", "-t", "overlay", "overlay", "-o",
            f"lowerdir={base},upperdir={node.dir}/upper,workdir={node.dir}/work", str(node.root))
        ssh_dir = node.root / "home" / DEPLOY_USER / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        (ssh_dir / "authorized_keys").write_text(Path(f"{key}.pub").read_text())
        run("chroot", str(node.root), "chown", "-R", f"{DEPLOY_USER}:{DEPLOY_USER}", f"/home/{DEPLOY_USER}/.ssh")
        (node.root / "etc/hostname").write_text(f"{node.hostname}\n")
        (node.root / "etc/hosts").write_text(f"127.0.0.1 localhost\n127.0.1.1 {node.hostname}\n")
        (node.dir / "hw/meminfo").write_text(meminfo(121.6, 117.4))
        self._rdma_tree(node)
        run("ip", "netns", "add", node.netns)
        run("ip", "-n", node.netns, "link", "set", "lo", "up")
        # As on Ubuntu (systemd's 50-default.conf): unprivileged ICMP echo sockets, so ping needs no capability.
        run("ip", "netns", "exec", node.netns, "sysctl", "-q", "-w", "net.ipv4.ping_group_range=0 2147483647")
        run("ip", "link", "add", f"sl-{node.role}", "type", "veth", "peer", "name", "mgmt0", "netns", node.netns)
        run("ip", "link", "set", f"sl-{node.role}", "master", BRIDGE, "up")
        run("ip", "-n", node.netns, "addr", "add", f"{node.address}/24", "dev", "mgmt0")
        run("ip", "-n", node.netns, "link", "set", "mgmt0", "up")

    def _remove_node(self, node: Node) -> None:
        kill_pid_file(node.dir / "hwsync.pid")
        quiet("ip", "netns", "del", node.netns)
        quiet("ip", "link", "del", f"sl-{node.role}")
        if node.root.is_mount():
            run("umount", "--lazy", str(node.root))
        shutil.rmtree(node.dir, ignore_errors=True)

    def _rdma_tree(self, node: Node) -> None:
        for rdma, netdev in RDMA_DEVICES.items():
            device = node.dir / "ib" / rdma
            port = device / "ports/1"
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
                (port / sub).mkdir(parents=True, exist_ok=True)
            (device / "device/net" / netdev).mkdir(parents=True, exist_ok=True)
            (device / "node_type").write_text("1: CA\n")
            (port / "state").write_text("1: DOWN\n")
            (port / "phys_state").write_text("3: Disabled\n")
            (port / "rate").write_text("200 Gb/sec (4X HDR)\n")
            (port / "link_layer").write_text("Ethernet\n")

    def _cable(self) -> None:
        """The QSFP cable: veth pairs between the nodes on the cabled port, idle netdevs on the other."""
        head, worker = NODES["head"], NODES["worker"]
        cabled, loose = CABLE_LAYOUTS[self.cable]
        for netdev in cabled:
            if run("ip", "-n", head.netns, "link", "show", netdev, check=False, capture_output=True).returncode:
                run("ip", "link", "add", netdev, "netns", head.netns, "type", "veth",
                    "peer", "name", netdev, "netns", worker.netns)
            for node in (head, worker):
                self.set_link_speed(node, netdev, 200000)
        for index, netdev in enumerate(loose):
            for node in (head, worker):
                if run("ip", "-n", node.netns, "link", "show", netdev, check=False, capture_output=True).returncode:
                    # A port with no cable: its far end is a veth that never comes up.
                    run("ip", "-n", node.netns, "link", "add", netdev, "type", "veth", "peer", "name", f"unplugged{index}")
        # DGX OS brings every CX-7 port up; only the cabled ones get a carrier.
        for node in (head, worker):
            for netdev in cabled + loose:
                run("ip", "-n", node.netns, "link", "set", netdev, "up")

    def _start_hwsync(self, node: Node) -> None:
        if pid_alive(node.dir / "hwsync.pid"):
            return
        process = subprocess.Popen(
            ["ip", "netns", "exec", node.netns, sys.executable, str(HERE / "hwsync.py"), str(node.dir)],
            stdout=subprocess.DEVNULL, stderr=open(node.dir / "hwsync.log", "a"), start_new_session=True,
        )
        (node.dir / "hwsync.pid").write_text(str(process.pid))

    def _wait_for_ssh(self, node: Node, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((node.address, 22), timeout=1) as connection:
                    if connection.recv(4).startswith(b"SSH"):
                        return
            except OSError:
                time.sleep(0.2)
        log = (node.dir / "node.log").read_text() if (node.dir / "node.log").exists() else ""
        raise RuntimeError(f"lab node {node.hostname} has no sshd after {timeout}s:\n{log}")


def rdma_of(netdev: str) -> str:
    return next(rdma for rdma, name in RDMA_DEVICES.items() if name == netdev)


@click.group()
def cli() -> None:
    """Two emulated DGX Sparks in network namespaces (needs root)."""


@cli.command()
@click.option("--cable", type=click.Choice(sorted(CABLE_LAYOUTS)), default="f0", show_default=True,
              help="Which QSFP port the cable is in: f0 or f1 netdevs come up.")
def up(cable: str) -> None:
    """Bring both nodes up (idempotent) and print the site file to use."""
    click.echo(Lab(cable).up())


@cli.command()
def down() -> None:
    """Remove both nodes and everything they used (idempotent)."""
    Lab().down()


if __name__ == "__main__":
    cli()
