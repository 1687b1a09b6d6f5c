"""The lab's images, built once and cached: the factory image of an emulated Spark (a Debian
root file system with the emulated GB10 tools and an offline apt mirror), and the build context
of the lab's runtime container image (a small Debian root file system that runs the cached CPU
vLLM, which the nodes share read-only), and of an older one (the same, its vLLM read as one
without dynamic speculation)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

from lab.config import CACHE_DIR, DEPLOY_USER, HERE, SUITE, VLLM_PYTHON

PACKAGES = [
    "openssh-server", "python3", "sudo", "rsync", "iproute2", "netplan.io", "systemd", "kmod",
    "procps", "iputils-ping", "iperf3", "perftest", "rdma-core", "ibverbs-utils",
    "infiniband-diags", "python3-venv", "docker.io", "docker-cli", "docker-compose",
    "prometheus", "prometheus-node-exporter", "prometheus-alertmanager", "haproxy",
]
# Left out of the factory image (then served by its offline mirror) so that a fresh converge installs
# them: iperf3 (a host package), Prometheus, Alertmanager and the node exporter (observability),
# HAProxy (the front door).
NOT_IN_FACTORY_IMAGE = ["iperf3", "prometheus", "prometheus-node-exporter", "prometheus-alertmanager", "haproxy"]
OFFLINE_MIRROR = "/var/lib/sparklab-mirror"
MEMLOCK_SHIM = HERE / "shim/memlock_shim.c"
OLDER_VLLM = HERE / "older_vllm.py"
RUNTIME_PACKAGES = ["python3", "libnuma1"]
# Part of the cache keys: bump when the build steps below change.
BUILD_REVISION = 2


def run(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=True, text=True, **kwargs)


def debian_mirror() -> str:
    """The Debian mirror this machine's apt already uses."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*")]:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            for word in line.replace("URIs:", "deb").split():
                if word.startswith("http") and word.rstrip("/").endswith("/debian"):
                    return word
    return "http://deb.debian.org/debian"


def _cached(name: str, key: list, build) -> Path:
    """CACHE_DIR/<name>-<digest of key>, built by ``build(path)`` once, atomically."""
    digest = hashlib.sha256()
    for part in key:
        digest.update(part.read_bytes() if isinstance(part, Path) else str(part).encode())
    done = CACHE_DIR / f"{name}-{digest.hexdigest()[:12]}"
    if (done / ".complete").exists():
        return done
    building = done.with_suffix(".building")
    shutil.rmtree(building, ignore_errors=True)
    building.parent.mkdir(parents=True, exist_ok=True)
    build(building)
    (building / ".complete").touch()
    building.rename(done)
    return done


def factory_image() -> Path:
    """The root file system every node starts from, as a Spark leaves the factory."""
    factory_files = sorted(p for p in (HERE / "factory").rglob("*") if p.is_file())
    key = [BUILD_REVISION, SUITE, *PACKAGES, *NOT_IN_FACTORY_IMAGE, DEPLOY_USER, *factory_files, MEMLOCK_SHIM]
    return _cached("base", key, lambda root: _build_factory(root, factory_files))


def _build_factory(root: Path, factory_files: list[Path]) -> None:
    run("debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE, str(root),
        debian_mirror(), stdout=subprocess.DEVNULL)
    chroot = ("chroot", str(root))
    offline_mirror(root)
    run(*chroot, "dpkg", "--purge", *NOT_IN_FACTORY_IMAGE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run(*chroot, "dpkg-divert", "--local", "--rename", "--add", "/usr/sbin/netplan", stdout=subprocess.DEVNULL)
    for path in factory_files:
        shutil.copy2(path, root / path.relative_to(HERE / "factory"))
    shim = root / "usr/local/lib/sparklab/memlock_shim.so"
    shim.parent.mkdir(parents=True)
    run("gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(MEMLOCK_SHIM), "-ldl")
    (root / "etc/ld.so.preload").write_text("/usr/local/lib/sparklab/memlock_shim.so\n")
    run(*chroot, "useradd", "--create-home", "--shell", "/bin/bash", DEPLOY_USER)
    (root / "etc/sudoers.d/deploy").write_text(f"{DEPLOY_USER} ALL=(ALL) NOPASSWD:ALL\n")
    (root / "etc/ssh/sshd_config.d/lab.conf").write_text("UseDNS no\nPasswordAuthentication no\n")
    (root / "etc/netplan").mkdir(exist_ok=True)


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
    shutil.rmtree(root / "var/cache/apt/archives")
    (root / "var/cache/apt/archives/partial").mkdir(parents=True)


def vllm_paths() -> list[str]:
    """What a container needs to run the cached CPU vLLM: its virtualenv and that venv's Python."""
    venv = VLLM_PYTHON.parent.parent
    if not (venv / ".complete").exists():
        raise RuntimeError(f"no CPU vLLM environment at {venv}: run scripts/test or scripts/quickstart, which set it up")
    home = next(line.split("=", 1)[1].strip() for line in (venv / "pyvenv.cfg").read_text().splitlines()
                if line.startswith("home"))
    return [str(venv), str(Path(home).parent)]


def tiny_model() -> Path:
    """The lab's model: a tiny Llama with random weights (tiny_model.py), built once with the
    CPU vLLM environment's torch and transformers."""
    script = HERE / "tiny_model.py"
    return _cached("tiny-model", [BUILD_REVISION, script], lambda out: run(str(VLLM_PYTHON), str(script), str(out),
                                                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))


def runtime_build_context() -> Path:
    """A Docker build context (Dockerfile + root file system) for the lab's runtime image:
    Debian with Python's shared libraries and libnuma, running the shared CPU vLLM."""
    venv_bin = str(VLLM_PYTHON.parent)
    return _cached("runtime-context", [BUILD_REVISION, SUITE, *RUNTIME_PACKAGES, venv_bin], lambda out: _build_runtime(out, venv_bin))


def _build_runtime(out: Path, venv_bin: str) -> None:
    rootfs = out.with_name(out.name + ".rootfs")
    shutil.rmtree(rootfs, ignore_errors=True)
    run("debootstrap", "--variant=minbase", f"--include={','.join(RUNTIME_PACKAGES)}", SUITE, str(rootfs),
        debian_mirror(), stdout=subprocess.DEVNULL)
    for cache in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/locale"):
        shutil.rmtree(rootfs / cache, ignore_errors=True)
    (rootfs / "root").chmod(0o755)  # the shared Python lives under /root on this machine
    out.mkdir(parents=True)
    with tarfile.open(out / "rootfs.tar.gz", "w:gz", compresslevel=1) as tar:
        tar.add(rootfs, arcname=".")
    shutil.rmtree(rootfs)
    (out / "Dockerfile").write_text(
        "# The lab's runtime image: Debian with Python's libraries; vLLM itself is mounted read-only.\n"
        "FROM scratch\nADD rootfs.tar.gz /\n"
        f"ENV PATH={venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"
        'CMD ["python3"]\n'
    )


def older_runtime_context() -> Path:
    """The build context of an image whose vLLM predates dynamic speculation, which the lab's
    shared CPU vLLM cannot be: the runtime image's root file system (the same tar, hard-linked)
    and Dockerfile, plus older_vllm.py as its sitecustomize.py (on PYTHONPATH), which drops the
    newer SpeculativeConfig fields, so that the deploy's smoke test reads what an older vLLM has."""
    runtime = runtime_build_context()
    return _cached("older-runtime-context", [BUILD_REVISION, runtime.name, OLDER_VLLM], lambda out: _build_older(out, runtime))


def _build_older(out: Path, runtime: Path) -> None:
    out.mkdir(parents=True)
    os.link(runtime / "rootfs.tar.gz", out / "rootfs.tar.gz")
    shutil.copy2(OLDER_VLLM, out / "sitecustomize.py")
    (out / "Dockerfile").write_text((runtime / "Dockerfile").read_text().replace(
        "CMD", "# Older: its vLLM reads as one without dynamic speculation (lab/older_vllm.py).\n"
        "COPY sitecustomize.py /usr/local/lib/sparklab-older/\nENV PYTHONPATH=/usr/local/lib/sparklab-older\nCMD"))


def build() -> None:
    """Every image that needs no CPU vLLM environment (the factory image, the runtime build
    contexts): scripts/setup.sh builds them beside the installs, so that on a fresh machine
    debootstrap and pip's downloads overlap. ``python3 -m lab.image``: the standard library alone."""
    factory_image()
    older_runtime_context()  # and the runtime context it is made from


if __name__ == "__main__":
    build()
