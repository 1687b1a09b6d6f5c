"""Last on the session's lab: the cable in the other QSFP port is found, not assumed; and
`python -m lab up` always starts from the factory state, whatever an earlier run left."""

import re
import subprocess
import sys

import pytest

from lab import faults, image
from lab.config import HEAD, LAB_DIR, WORKER
from lab.core import Lab
from tests.e2e.conftest import REPO, pyinfra

pytestmark = pytest.mark.end_to_end


def test_cable_in_the_other_port_is_found_not_assumed(lab):
    Lab("f1").up()
    pyinfra("-y")
    result = pyinfra("-y", task="tasks/verify.py")
    assert result.returncode != 0
    for pattern in (r"spark-head\s+rail 0 enp1s0f0np0 link\s+FAIL\s+link (lowerlayerdown|down)",
                    r"the cable is in the other QSFP port: rocep1s0f1 \(enp1s0f1np1\) is ACTIVE",
                    r"spark-worker\s+rail 1 roceP2p1s0f0 RoCE\s+FAIL\s+port DOWN"):
        assert re.search(pattern, result.stdout), f"{pattern!r} not in:\n{result.stdout}"


def test_up_starts_from_the_factory_state(lab):
    """Faults and changes a killed run would leave behind are gone after the next `up` (called
    here in the process that holds the lab; `python -m lab up` calls the same)."""
    faults.port_down(WORKER, "rocep1s0f0", True)
    faults.available_memory(HEAD, 12)
    (HEAD.root / "etc/netplan/50-broken.yaml").write_text("network: [\n")
    lab.up()
    factory_id = (image.factory_image() / "etc/machine-id").read_text()
    for node in (HEAD, WORKER):
        assert (node.root / "etc/machine-id").read_text() == factory_id
        assert not list((node.root / "etc/netplan").glob("*.yaml"))
        assert "MemAvailable:   123102822 kB" in (node.dir / "hw/meminfo").read_text()
    assert not list((WORKER.dir / "faults").iterdir())


def test_a_second_holder_is_told_who_holds_the_lab(lab):
    result = subprocess.run([sys.executable, "-m", "lab", "up"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert re.search(r"the lab is in use by PID \d+ \(.*pytest", result.stderr), result.stderr
    assert (LAB_DIR / "site.toml").exists()
