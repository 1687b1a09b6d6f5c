"""Shared by the end-to-end tests: a fresh lab per test module, and the pyinfra CLI run as a
user runs it, against the lab's site file."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.lab.lab import LAB_DIR, Lab

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
LAB_ENV = {**os.environ, "DUAL_SPARK_SITE": str(LAB_DIR / "site.toml")}

collect_ignore_glob = [] if os.geteuid() == 0 else ["test_*.py"]  # the lab needs root


def pyinfra(*args: str, task: str = "deploy.py") -> subprocess.CompletedProcess:
    """Run the pyinfra CLI from the repository; stdout and stderr together."""
    return subprocess.run(
        [str(PYINFRA), *args, "inventory.py", task], cwd=REPO, env=LAB_ENV, stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
    )


@pytest.fixture(scope="module")
def lab():
    """Both nodes fresh from the factory image, cable in the f0 port; removed afterwards."""
    lab = Lab("f0")
    lab.down()
    lab.up()
    yield lab
    lab.down()
