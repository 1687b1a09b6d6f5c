"""PID 1 of an emulated Spark, run by lab.py inside the node's own network, mount, UTS and
PID namespaces: mounts the node's /proc, /sys, /dev, /run and /tmp inside its root, lays the
emulated hardware over them, sets the hostname and becomes the node's sshd.
Killing that sshd ends the node.

    python3 node_init.py NODE_DIR HOSTNAME
"""

import os
import subprocess
import sys
from pathlib import Path

USERNS_KEY = "apparmor_restrict_unprivileged_userns"


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


def main() -> None:
    node_dir, hostname = Path(sys.argv[1]), sys.argv[2]
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
    mount("-t", "tmpfs", "tmpfs", str(dev / "shm"))
    (dev / "infiniband").mkdir()

    for path in ("run", "tmp"):
        mount("-t", "tmpfs", "-o", "mode=1777" if path == "tmp" else "mode=755", "tmpfs", str(root / path))
    (root / "run/sshd").mkdir(mode=0o755)

    os.chroot(root)
    os.chdir("/")
    os.execv("/usr/sbin/sshd", ["/usr/sbin/sshd", "-D", "-e"])


if __name__ == "__main__":
    main()
