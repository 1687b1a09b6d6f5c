"""End to end: the real pyinfra CLI over real SSH against the two emulated Sparks.

The tests run in file order on the session's lab, from the factory state: the refusal before a
first converge, converge, idempotence, dry run, identity repair, verification under injected
faults, a node that does not answer, and a crashed worker.
"""

import hashlib
import os
import re
import subprocess
from pathlib import Path

import click
import pytest

import programs
from lab import faults, image, nodes
from lab.config import HEAD, LAB_DIR, NODES, WORKER
from tests.e2e.conftest import LAB_ENV, PYINFRA, REPO, pyinfra, serving_after

pytestmark = pytest.mark.end_to_end


def converge(*args: str) -> subprocess.CompletedProcess:
    return pyinfra("-y", *args)


def verify() -> subprocess.CompletedProcess:
    return pyinfra("-y", task="tasks/verify.py")


def changed_operations(output: str) -> int:
    """The Success column of pyinfra's results total: operations that changed something."""
    total = re.search(r"Grand total\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)", output)
    assert total, output
    return 0 if total.group(2) == "-" else int(total.group(2))


# What running services change by themselves once the observability step has started them: the
# node exporter's textfile, Prometheus's store, their logs on the lab.
RUNNING = ("var/lib/prometheus/", "var/lib/dual-spark-metrics/", "var/log/")


def tree_digest(root: Path) -> dict[str, str]:
    """Path -> mode, owner and content (or link target) of every file in a tree, but what the
    running services change by themselves (RUNNING)."""
    digest = {}
    for path in sorted(root.rglob("*")):
        if str(path.relative_to(root)).startswith(RUNNING):
            continue
        info = path.lstat()
        if path.is_symlink():
            content = os.readlink(path)
        elif path.is_file():
            content = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            content = "dir"
        digest[str(path.relative_to(root))] = f"{info.st_mode:o} {info.st_uid}:{info.st_gid} {content}"
    return digest




def new_file_diffs(output: str) -> dict[str, list[bool]]:
    """Path -> whether each "Will create" diff of it shows every line its hunk header counts."""
    shown: dict[str, list[bool]] = {}
    lines = click.unstyle(output).splitlines()
    for index, line in enumerate(lines):
        created = re.search(r"Will create (/\S+)$", line)
        header = re.fullmatch(r"\s*@@ -0,0 \+1(?:,(\d+))? @@", lines[index + 1]) if created and index + 1 < len(lines) else None
        if header:
            added = 0
            while index + 2 + added < len(lines) and re.match(r"\s*\+ ", lines[index + 2 + added]):
                added += 1
            shown.setdefault(created.group(1), []).append(added == int(header.group(1) or 1))
    return shown


def program_defs() -> list[str]:
    """The def and class lines of the programs the deploy ships (every file of their archive)."""
    return [line for text in programs.sources().values() for line in text.splitlines() if line.startswith(("def ", "class "))]


def program_lines(output: str) -> list[str]:
    """The lines of a diff that show a program's def or class lines."""
    defs = set(program_defs())
    return [line for line in click.unstyle(output).splitlines() if re.sub(r"^\s*\+ ", "", line) in defs]


def node_file(node, path: str) -> str:
    return (node.root / path.lstrip("/")).read_text()


def test_machine_id_repair_refuses_an_unexpected_hostname(lab, tmp_path):
    """Run before the first converge, while both nodes still share the factory machine id. In
    pyinfra's default mode the refusal comes while changes are detected: nothing has run yet."""
    site = tmp_path / "site.toml"
    site.write_text((LAB_DIR / "site.toml").read_text().replace('hostname = "spark-worker"', 'hostname = "spark-other"'))
    before = {node.role: tree_digest(node.dir / "upper") for node in NODES.values()}
    result = pyinfra(site=site)
    assert result.returncode != 0
    assert "refusing to replace the machine id: the hostname is 'spark-worker', expected 'spark-other'" in result.stdout
    assert "Beginning operation run" not in result.stdout
    assert {node.role: tree_digest(node.dir / "upper") for node in NODES.values()} == before


def test_a_dry_run_on_the_factory_image_shows_every_step_and_changes_nothing(lab):
    """What a user sees first (--dry, or the diff shown before asking): every step's change, the
    serving stacks included, though the rails have no address and so no GID yet. Configuration
    shows its whole diff; the programs' archive one line (each of its files with show_program_diffs=true)."""
    before = {node.role: tree_digest(node.dir / "upper") for node in NODES.values()}
    result = pyinfra("--dry")
    assert result.returncode == 0, result.stdout
    assert re.search(r"Start the head's stack \(rank 0, the API; tensor parallel 2 x pipeline parallel 1\).*\s1 \(spark-head\)", result.stdout), result.stdout
    assert 'NCCL_IB_GID_INDEX: the RoCE v2 GID of 10.0.0.2 on rocep1s0f0, read once the rail has that address' in result.stdout
    shown = new_file_diffs(result.stdout)
    for path in ("/etc/netplan/40-dual-spark.yaml", "/etc/dual-spark/compose.yaml", "/etc/dual-spark/launch.sh",
                 "/etc/security/limits.d/99-rdma.conf", "/etc/systemd/system.conf.d/90-rdma-memlock.conf",
                 "/etc/sysctl.d/60-apparmor-userns.conf"):
        assert shown.get(path) == [True, True], f"{path}: {shown.get(path)}\n{result.stdout}"
    lines = sum(len(text.splitlines()) for text in programs.sources().values())
    line = (f"Will create /var/lib/dual-spark/bin/dual-spark.pyz (program, {lines} lines, "
            f"sha256 {hashlib.sha256(programs.built()).hexdigest()[:12]}): full diff with --data show_program_diffs=true")
    assert result.stdout.count(line) == 2, result.stdout
    assert not program_lines(result.stdout), result.stdout
    # The door's configuration is about 60 lines of it, Alertmanager's about 40, the unit of the
    # watch of the answers about 45 (748 lines in all on 2026-12-05).
    assert len(result.stdout.splitlines()) < 770, "the first dry run no longer fits on a few screens"
    full = pyinfra("--dry", "--data", "show_program_diffs=true")
    assert full.returncode == 0 and len(program_lines(full.stdout)) == 2 * len(program_defs()), full.stdout
    assert {node.role: tree_digest(node.dir / "upper") for node in NODES.values()} == before


def test_fresh_converge_passes_verification(lab):
    assert not (image.factory_image() / "usr/bin/iperf3").exists()
    result = converge()
    assert result.returncode == 0, result.stdout
    assert re.search(r"Install the fabric and host tools\s+2\s+2\s", result.stdout), result.stdout
    assert all((node.root / "usr/bin/iperf3").exists() for node in NODES.values())
    assert re.search(r"readiness: (\d+) of \1 checks pass", result.stdout), result.stdout
    assert "Write and apply the QSFP netplan" in result.stdout
    for node, octet in ((HEAD, 1), (WORKER, 2)):
        netplan = node_file(node, "/etc/netplan/40-dual-spark.yaml")
        assert f"addresses: [10.0.0.{octet}/24]" in netplan and "mtu: 9000" in netplan
        assert oct((node.root / "etc/netplan/40-dual-spark.yaml").stat().st_mode)[-3:] == "600"
        addresses = subprocess.run(["ip", "-n", node.netns, "-4", "-o", "addr"], capture_output=True, text=True).stdout
        assert f"10.0.1.{octet}/24" in addresses


def test_second_run_changes_nothing(lab):
    result = converge()
    assert result.returncode == 0, result.stdout
    assert changed_operations(result.stdout) == 0, result.stdout
    dry = pyinfra("--dry")
    assert dry.returncode == 0 and "Will " not in dry.stdout, dry.stdout
    detected = dry.stdout.split("Detected changes:")[1].split("Detected changes may")[0]
    rows = [line for line in detected.splitlines() if " | " in line]
    operations = [line for line in result.stdout.split("--> Results:")[1].splitlines() if " | " in line]
    assert len(rows) == len(operations) > 0 and all(re.search(r"\s-\s+-\s*$", row) for row in rows), detected


def test_machine_id_is_repaired_on_the_worker_only(lab):
    factory_id = (image.factory_image() / "etc/machine-id").read_text().strip()
    assert node_file(HEAD, "/etc/machine-id").strip() == factory_id
    worker_id = node_file(WORKER, "/etc/machine-id").strip()
    assert re.fullmatch(r"[0-9a-f]{32}", worker_id) and worker_id != factory_id
    assert node_file(WORKER, f"/root/machine-id.{factory_id}.bak").strip() == factory_id
    assert not (HEAD.root / f"root/machine-id.{factory_id}.bak").exists()


def test_shared_ssh_host_keys_are_reported_not_changed(lab):
    result = verify()
    assert re.search(r"spark-worker\s+SSH host keys\s+WARN\s+ECDSA, ED25519, RSA shared with spark-head", result.stdout)
    assert "dpkg-reconfigure openssh-server" in result.stdout
    assert node_file(HEAD, "/etc/ssh/ssh_host_ed25519_key.pub") == node_file(WORKER, "/etc/ssh/ssh_host_ed25519_key.pub")


@pytest.mark.parametrize("override", ["fabric_mtu=8000", "memory_floor_gib=90"])
def test_dry_run_shows_the_diff_and_changes_no_file(lab, override):
    before = {node.role: tree_digest(node.dir / "upper") for node in NODES.values()}
    result = pyinfra("--dry", "--data", override)
    assert result.returncode == 0, result.stdout
    if override.startswith("fabric_mtu"):
        assert "Will modify /etc/netplan/40-dual-spark.yaml" in result.stdout
        assert "-       mtu: 9000" in result.stdout and "+       mtu: 8000" in result.stdout
    after = {node.role: tree_digest(node.dir / "upper") for node in NODES.values()}
    assert after == before


@pytest.mark.parametrize("ssh_host", ["198.51.100.11", "spark-head.lab"], ids=["address", "dns-name"])
def test_a_rail_named_after_the_management_interface_is_refused(lab, tmp_path, ssh_host):
    """The address the node is reached on is read from the node, so a DNS name in ssh_host
    (resolved here through /etc/hosts' stand-in, pyinfra's ssh_hostname) guards as well."""
    site = tmp_path / "site.toml"
    text = (LAB_DIR / "site.toml").read_text().replace('netdev = "enp1s0f0np0"', 'netdev = "mgmt0"', 1)
    site.write_text(text.replace('ssh_host = "198.51.100.11"', f'ssh_host = "{ssh_host}"'))
    hosts = Path("/etc/hosts")
    original = hosts.read_text()
    hosts.write_text(original + "198.51.100.11 spark-head.lab\n")
    try:
        result = pyinfra(site=site)
    finally:
        hosts.write_text(original)
    assert result.returncode != 0
    assert "mgmt0 carries the management address 198.51.100.11; refusing to reconfigure it" in result.stdout, result.stdout
    assert "Beginning operation run" not in result.stdout


def test_a_netplan_file_that_netplan_rejects_is_never_installed(lab):
    """Another netplan file on the node is broken: `netplan generate` fails in the staging root,
    so the new fabric file is neither installed nor applied, and the run says why."""
    broken = WORKER.root / "etc/netplan/50-cloud-init.yaml"
    broken.write_text("network:\n  version: 2\n  ethernets:\n    mgmt0:\n      addresses: [198.51.100.12/99]\n")
    broken.chmod(0o600)
    try:
        result = converge("--data", "fabric_mtu=8000")
        assert result.returncode != 0
        assert "invalid prefix length" in result.stdout, result.stdout
        assert "mtu: 9000" in node_file(WORKER, "/etc/netplan/40-dual-spark.yaml")
        assert "mtu 9000" in subprocess.run(["ip", "-n", WORKER.netns, "link", "show", "enp1s0f0np0"],
                                            capture_output=True, text=True).stdout
        assert "198.51.100.12/24" in subprocess.run(["ip", "-n", WORKER.netns, "-4", "addr", "show", "mgmt0"],
                                                    capture_output=True, text=True).stdout
    finally:
        broken.unlink()
    result = converge()
    assert result.returncode == 0, result.stdout
    assert "mtu: 9000" in node_file(HEAD, "/etc/netplan/40-dual-spark.yaml")


FAULTS = [
    ("slow link", lambda: faults.slow_link(HEAD, "enp1s0f0np0", 100000),
     lambda: faults.slow_link(HEAD, "enp1s0f0np0", 200000),
     [r"spark-head\s+rail 0 enp1s0f0np0 link\s+FAIL\s+100000 Mb/s, expected 200000", "fix: reseat or replace the QSFP cable"]),
    ("peer rail at MTU 1500", lambda: faults.set_mtu(WORKER, "enP2p1s0f0np0", 1500), None,
     [r"spark-head\s+rail 1 jumbo ping to spark-worker\s+FAIL\s+8972-byte DF ping to 10.0.1.2 fails",
      r"spark-worker\s+rail 1 enP2p1s0f0np0 link\s+FAIL\s+MTU 1500, expected 9000", "fix: set MTU 9000 on rail 1 of spark-head and spark-worker"]),
    ("RoCE port down", lambda: faults.port_down(WORKER, "rocep1s0f0", True),
     lambda: faults.port_down(WORKER, "rocep1s0f0", False),
     [r"spark-worker\s+rail 0 rocep1s0f0 RoCE\s+FAIL\s+port DOWN \(Disabled\)", "ibv_devinfo -d rocep1s0f0"]),
    ("unified memory below the floor", lambda: faults.available_memory(WORKER, 60),
     lambda: faults.available_memory(WORKER, 117.4),
     [r"spark-worker\s+GPU memory\s+FAIL\s+60.0 GiB available of 121.6 \(/proc/meminfo, NVIDIA GB10\), floor 95",
      "lower memory_floor_gib"]),
]


@pytest.mark.parametrize("inject, restore, expected", [f[1:] for f in FAULTS], ids=[f[0] for f in FAULTS])
def test_verification_names_node_rail_and_fix(lab, inject, restore, expected):
    inject()
    try:
        result = verify()
        assert result.returncode != 0, result.stdout
        for pattern in expected:
            assert re.search(pattern, result.stdout), f"{pattern!r} not in:\n{result.stdout}"
        assert "readiness FAILED" in result.stdout
    finally:
        if restore:
            restore()
    # A fault the deploy can fix (MTU drift) is fixed by the next run; the others are gone now.
    result = converge()
    assert result.returncode == 0 and "FAIL" not in result.stdout.split("readiness:")[0], result.stdout


def test_a_worker_that_drops_out_fails_the_run_clearly_and_once_back_the_pair_converges(lab):
    """Powered off, the worker is a fail row of a run (no traceback) whose steps wait for the next
    run; crashing in the middle of a run, it fails that run with its name, and the netplan change
    the run was making is reverted wherever it stopped. Back, the watchdogs bring the pair back
    and a run converges. One recovery serves both faults: each ends with the worker booted again."""
    nodes.stop(WORKER)
    try:
        result = converge()
        assert result.returncode != 0
        assert "Traceback" not in result.stdout and "ConnectError" not in result.stdout, result.stdout
        assert re.search(r"spark-worker\s+reachable over SSH\s+FAIL\s+no SSH answer at 198.51.100.12:22", result.stdout), result.stdout
        assert "check that the node is powered on and booted, that sshd runs" in result.stdout
        assert "needs spark-worker and is left for the next run" in result.stdout
    finally:
        nodes.boot(WORKER)

    run = subprocess.Popen(
        [str(PYINFRA), "-y", "--data", "fabric_mtu=8000", "inventory.py", "deploy.py"], cwd=REPO, env=LAB_ENV,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    output = []
    for line in run.stdout:
        output.append(line)
        if "Beginning operation run" in line:
            faults.crash(WORKER)
    run.wait(timeout=300)
    text = "".join(output)
    assert run.returncode != 0, text
    # Depending on where the connection drops, pyinfra reports a failed command on the worker, or
    # (paramiko's EOFError, pyinfra-dev/pyinfra#1220) an internal error naming the worker's host.
    assert re.search(r"\[spark-worker\].*(Error|error|Disconnected|failed)|Host\(spark-worker\).*failed with EOFError", text), text

    nodes.boot(WORKER)
    result = converge()  # the netplan change is reverted wherever the run stopped
    assert "mtu: 9000" in node_file(WORKER, "/etc/netplan/40-dual-spark.yaml")
    serving_after()  # the watchdogs bring the pair back
    result = converge()
    assert result.returncode == 0 and re.search(r"readiness: (\d+) of \1 checks pass", result.stdout), result.stdout
