"""The lab's stand-in for systemctl (lab/factory/usr/local/sbin/systemctl), which runs the units
the deploy manages on nodes without systemd: it reads a unit and its drop-ins as systemd does (an
empty ExecStart= resets, EnvironmentFile=, ${VAR} and $VAR), supervises the process as Restart=
says, hands a unit its LoadCredential= files, sends SIGHUP on reload and reports is-active,
is-enabled and show; run here on a tree of its own."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SYSTEMCTL = Path(__file__).resolve().parents[1] / "lab/factory/usr/local/sbin/systemctl"
SERVICE = """\
import signal, sys, time
out = sys.argv[1]
open(out, "a").write(" ".join(sys.argv[2:]) + "\\n")
signal.signal(signal.SIGHUP, lambda *_: open(out, "a").write("reloaded\\n"))
while True:
    time.sleep(0.1)
"""


@pytest.fixture
def root(tmp_path):
    (tmp_path / "lib/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/demo.service.d").mkdir(parents=True)
    (tmp_path / "etc/default").mkdir()
    (tmp_path / "service.py").write_text(SERVICE)
    (tmp_path / "etc/default/demo").write_text('ARGS="--from default"\n')
    (tmp_path / "lib/systemd/system/demo.service").write_text(
        f"[Service]\nEnvironmentFile={tmp_path}/etc/default/demo\nExecStart={sys.executable} {tmp_path}/service.py {tmp_path}/out $ARGS\n"
        "Restart=on-failure\nProtectSystem=full\n\n[Install]\nWantedBy=multi-user.target\n")
    (tmp_path / "etc/systemd/system/demo.service.d/50-lab.conf").write_text(
        f"[Service]\nExecStart=\nExecStart={sys.executable} {tmp_path}/service.py {tmp_path}/out --listen 10.0.0.1:9100 ${{WHERE}} $ARGS\n"
        'Environment="WHERE=/var/lib/x y"\nRestart=always\nRestartSec=0.2\n')
    (tmp_path / "lib/systemd/system/broken.service").write_text("[Service]\nExecStart=/bin/false\n")
    yield tmp_path
    systemctl(tmp_path, "stop", "demo")


def systemctl(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SYSTEMCTL), *args], env={**os.environ, "SPARKLAB_SYSTEMCTL_ROOT": str(root)},
                          capture_output=True, text=True, timeout=60)


def main_pid(root: Path) -> int:
    return int((root / "run/sparklab-units/demo.service.main").read_text())


def wait_for(condition, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.1)


def test_a_unit_runs_as_its_drop_in_says_and_is_supervised(root):
    assert systemctl(root, "is-active", "demo").stdout.strip() == "inactive"
    assert systemctl(root, "is-enabled", "demo").stdout.strip() == "disabled"
    assert systemctl(root, "enable", "--now", "demo").returncode == 0
    assert systemctl(root, "is-enabled", "demo").stdout.strip() == "enabled"
    assert systemctl(root, "is-active", "demo").stdout.strip() == "active"
    wait_for(lambda: (root / "out").exists())
    assert (root / "out").read_text() == "--listen 10.0.0.1:9100 /var/lib/x y --from default\n"  # ${VAR} one word, $VAR split
    assert systemctl(root, "reload", "demo").returncode == 0
    wait_for(lambda: "reloaded" in (root / "out").read_text())
    first = main_pid(root)
    os.kill(first, signal.SIGKILL)  # Restart=always from the drop-in: back after RestartSec
    wait_for(lambda: (root / "run/sparklab-units/demo.service.main").exists() and main_pid(root) != first)
    assert systemctl(root, "stop", "demo").returncode == 0
    assert systemctl(root, "is-active", "demo").stdout.strip() == "inactive"


def test_a_unit_that_fails_at_once_reads_as_failed(root):
    systemctl(root, "start", "broken")
    wait_for(lambda: systemctl(root, "is-active", "broken").stdout.strip() == "failed")
    systemctl(root, "reset-failed", "broken")
    assert systemctl(root, "is-active", "broken").stdout.strip() == "inactive"
    assert systemctl(root, "is-enabled", "nosuch").stdout == "" and systemctl(root, "start", "nosuch").returncode == 5


def test_show_reads_as_is_active_and_is_enabled_say(root):
    """The deploy reads every unit in one `systemctl show` (facts/units.py): what it makes of the
    stand-in's blocks is what is-active and is-enabled say of each unit, "unknown" for no unit file."""
    from facts.units import PROPERTIES, units_read

    systemctl(root, "enable", "--now", "demo")
    systemctl(root, "start", "broken")
    wait_for(lambda: systemctl(root, "is-active", "broken").stdout.strip() == "failed")
    names = ["demo", "broken", "nosuch"]
    shown = systemctl(root, "show", f"--property={PROPERTIES}", "--", *names)
    units, unreadable = units_read([f"units {' '.join(names)}", *shown.stdout.splitlines()])
    assert unreadable == []
    assert units == {name: {"active": systemctl(root, "is-active", name).stdout.strip(),
                            "enabled": systemctl(root, "is-enabled", name).stdout.strip() or "unknown"} for name in names}
    assert units["demo"] == {"active": "active", "enabled": "enabled"} and units["broken"]["active"] == "failed"


def test_a_credential_is_copied_for_the_unit_alone_and_named_by_percent_d(root):
    """As systemd's LoadCredential=: the file copied at the start into a directory of the unit's
    own, readable by its user alone, which %d names on its command line."""
    (root / "secret").write_text("sk-lab\n")
    (root / "etc/systemd/system/keyed.service").write_text(
        f"[Service]\nLoadCredential=api-key:{root}/secret\nExecStart={sys.executable} {root}/service.py {root}/keyed %d/api-key\n")
    try:
        assert systemctl(root, "start", "keyed").returncode == 0
        wait_for(lambda: (root / "keyed").exists())
        given = Path((root / "keyed").read_text().strip())
        assert given == root / "run/credentials/keyed.service/api-key" and given.read_text() == "sk-lab\n"
        assert oct(given.stat().st_mode & 0o777) == "0o400" and oct(given.parent.stat().st_mode & 0o777) == "0o500"
    finally:
        systemctl(root, "stop", "keyed")
