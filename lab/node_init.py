"""PID 1 of an emulated Spark, started by the lab inside the node's own network, mount, UTS,
IPC and PID namespaces: mounts the node's /proc, /sys (with its cgroup hierarchies), /dev, /run
and /tmp inside its root, lays the emulated hardware over them, then supervises the node's
services as systemd would on a Spark: sshd, and dockerd (restarted whenever it exits, like
docker.service's Restart=always), and at boot the units enabled through the lab's systemctl
(lab/factory/usr/local/sbin/systemctl). When sshd ends, the node ends.

    python3 node_init.py NODE_DIR HOSTNAME CGROUP_PARENT MANAGEMENT_ADDRESS/PREFIX
"""

import os
import subprocess
import sys
import time
from pathlib import Path

USERNS_KEY = "apparmor_restrict_unprivileged_userns"
HOST_ROOT = ".sparklab-host"
DOCKERD = [
    "/usr/sbin/dockerd", "--iptables=false", "--ip6tables=false", "--bridge=none", "--storage-driver=overlay2",
    "--exec-root=/run/docker", "--pidfile=/run/docker.pid", "-H", "unix:///run/docker.sock",
]


def mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def snapshot_kernel_sysctls(target: Path) -> None:
    """A writable copy of /proc/sys/kernel plus the Ubuntu-only userns key (set to 1)."""
    source = Path("/proc/sys/kernel")
    for path in source.rglob("*"):
        relative = path.relative_to(source)
        try:
            if path.is_dir():
                (target / relative).mkdir(parents=True, exist_ok=True)
            else:
                (target / relative).write_text(path.read_text())
        except OSError:
            continue
    (target / USERNS_KEY).write_text("1\n")


def mount_cgroups(target: Path) -> None:
    """The host's cgroup hierarchies, as systemd mounts them on a Spark (dockerd needs them).
    Read from the host's PID 1: `ip netns exec` replaced /sys, and its cgroup mounts with it."""
    mount("-t", "tmpfs", "-o", "mode=755", "cgroup", str(target))
    for line in Path("/proc/1/mounts").read_text().splitlines():
        source, point, fstype, options = line.split()[:4]
        if fstype in ("cgroup", "cgroup2") and point.startswith("/sys/fs/cgroup/"):
            where = target / point.removeprefix("/sys/fs/cgroup/")
            where.mkdir(parents=True, exist_ok=True)
            kept = ",".join(o for o in options.split(",") if o not in ("rw", "relatime", "nosuid", "nodev", "noexec"))
            mount("-t", fstype, *(["-o", kept] if kept else []), source, str(where))


def prepare(node_dir: Path, hostname: str) -> Path:
    root, hw = node_dir / "root", node_dir / "hw"
    mount("--make-rprivate", "/")
    subprocess.run(["hostname", hostname], check=True)

    mount("-t", "proc", "proc", str(root / "proc"))
    mount("--bind", str(hw / "meminfo"), str(root / "proc/meminfo"))
    kernel = node_dir / "sysctl-kernel"
    mount("-t", "tmpfs", "tmpfs", str(kernel))
    snapshot_kernel_sysctls(kernel)
    mount("--bind", str(kernel), str(root / "proc/sys/kernel"))

    mount("-t", "sysfs", "sysfs", str(root / "sys"))
    mount_cgroups(root / "sys/fs/cgroup")
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir={root}/sys/class,upperdir={node_dir}/sys-class/upper,workdir={node_dir}/sys-class/work",
          str(root / "sys/class"))
    (root / "sys/class/infiniband").mkdir(exist_ok=True)
    mount("--bind", str(node_dir / "ib"), str(root / "sys/class/infiniband"))
    for speed in (hw / "speed").iterdir():
        target = root / "sys/class/net" / speed.name / "speed"
        if target.exists():
            mount("--bind", str(speed), str(target))

    dev = root / "dev"
    mount("-t", "tmpfs", "-o", "mode=755", "tmpfs", str(dev))
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8),
                               ("urandom", 1, 9), ("tty", 5, 0)):
        os.mknod(dev / name, 0o20666, os.makedev(major, minor))
        os.chmod(dev / name, 0o666)
    (dev / "pts").mkdir()
    (dev / "shm").mkdir()
    mount("-t", "devpts", "-o", "newinstance,ptmxmode=0666,mode=620", "devpts", str(dev / "pts"))
    os.symlink("pts/ptmx", dev / "ptmx")
    # Each node has its own /dev/shm: vLLM decides two ranks share a machine when they can
    # open each other's shared-memory segments there.
    mount("-t", "tmpfs", "-o", "mode=1777", "tmpfs", str(dev / "shm"))

    for path in ("run", "tmp"):
        mount("-t", "tmpfs", "-o", "mode=1777" if path == "tmp" else "mode=755", "tmpfs", str(root / path))
    (root / "run/sshd").mkdir(mode=0o755)

    # The node's disk for Docker: overlay2 does not work with its data on the node's overlay root.
    (root / "var/lib/docker").mkdir(parents=True, exist_ok=True)
    mount("--bind", str(node_dir / "docker"), str(root / "var/lib/docker"))
    # Host paths shared read-only (the CPU vLLM environment), at the same path inside the node.
    mounts = node_dir / "ro-mounts"
    for source in (mounts.read_text().split() if mounts.exists() else []):
        target = root / source.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        mount("--bind", source, str(target))
        mount("-o", "remount,bind,ro", str(target))

    # The lab reaches into the node (faults, checks) by this PID of the host's namespace.
    host_pid = next(line.split()[1] for line in Path("/proc/self/status").read_text().splitlines()
                    if line.startswith("NSpid:"))
    (node_dir / "init.pid").write_text(host_pid)
    return root


def boot_settings() -> None:
    """As DGX OS at boot: /etc/sysctl.d applied (systemd-sysctl), every interface up, then
    netplan's configuration applied (networkd's job on a Spark; the lab's netplan shim here)."""
    for conf in sorted(Path("/etc/sysctl.d").glob("*.conf")):
        subprocess.run(["sysctl", "-q", "-p", str(conf)], check=False)
    for netdev in os.listdir("/sys/class/net"):
        if not netdev.startswith("unplugged"):  # the lab's stand-in for an empty cable end
            subprocess.run(["ip", "link", "set", netdev, "up"], check=False)
    if any(Path("/etc/netplan").glob("*.yaml")):
        subprocess.run(["/usr/sbin/netplan", "apply"], check=False)
    # The units enabled through the lab's systemctl (the deploy's Prometheus, node exporter and
    # collector), once the rails have their addresses, as systemd starts multi-user.target's.
    enabled = Path("/var/lib/sparklab-units/enabled")
    for unit in sorted(enabled.iterdir()) if enabled.is_dir() else []:
        subprocess.run(["/usr/local/sbin/systemctl", "start", unit.name], check=False)


def supervise(cgroup_parent: str, docker_log) -> None:
    """Reap every orphan; restart dockerd when it exits; end the node when sshd exits."""
    def dockerd() -> int:
        return subprocess.Popen([*DOCKERD, f"--cgroup-parent=/{cgroup_parent}"], stdout=docker_log, stderr=docker_log).pid

    sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e"]).pid
    docker = dockerd()
    while True:
        pid, _ = os.wait()
        if pid == sshd:
            sys.exit(0)
        if pid == docker:
            time.sleep(1)
            docker = dockerd()


def main() -> None:
    node_dir, hostname, cgroup_parent, management = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    root = prepare(node_dir, hostname)
    docker_log = open(node_dir / "dockerd.log", "a")  # outside the node: it outlives the node
    # The node's root becomes its mount namespace's root (a chroot is not enough: runc joins
    # the namespace for `docker exec` and would land in the host's root), the host's goes away.
    (root / HOST_ROOT).mkdir(exist_ok=True)
    os.chdir(root)
    subprocess.run(["pivot_root", ".", HOST_ROOT], check=True)
    os.chroot(".")
    os.chdir("/")
    subprocess.run(["umount", "--lazy", f"/{HOST_ROOT}"], check=True)
    os.rmdir(f"/{HOST_ROOT}")
    boot_settings()
    subprocess.run(["ip", "addr", "replace", management, "dev", "mgmt0"], check=False)
    supervise(cgroup_parent, docker_log)


if __name__ == "__main__":
    main()
