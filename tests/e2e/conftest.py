"""Shared by the end-to-end tests: the lab, held (lab/lock.py) and brought up from the factory
state once for the whole session, and the pyinfra CLI run as a user runs it against it. The
test modules are numbered in the order they build on each other's state."""

import os
import re
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lab.config import LAB_DIR
from lab.core import Lab
from lab.lock import LabLock
from lab.site import table, toml
from tests.net import free_port

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
SITE = LAB_DIR / "site.toml"
LAB_ENV = {**os.environ, "DUAL_SPARK_SITE": str(SITE)}
RECOVERED: dict[str, float] = {}
"""Fault -> seconds until the pair served a token again (test_50), printed at the end of the run."""
FOUND: dict[str, float] = {}
"""Fault -> seconds until a watchdog ended vLLM for it (test_50), printed at the end of the run."""
DOWNTIME: dict[str, float] = {}
"""Change -> seconds the API answered no request while the run made it (test_40), printed at the end."""


def pyinfra(*args: str, task: str = "deploy.py", site: Path = SITE, timeout: int = 900) -> subprocess.CompletedProcess:
    """Run the pyinfra CLI from the repository; stdout and stderr together."""
    return subprocess.run(
        [str(PYINFRA), *args, "inventory.py", task], cwd=REPO, env={**LAB_ENV, "DUAL_SPARK_SITE": str(site)},
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
    )


def site_variant(directory: Path, model: dict | None = None, **settings) -> Path:
    """The lab's site file with another [model] and more [settings], written in ``directory``."""
    text = SITE.read_text()
    if model is not None:
        text = re.sub(r"\[model\]\n(?:.+\n)*", "\n".join(table("model", model)) + "\n", text)
    text = text.replace("[settings]\n", "[settings]\n" + "".join(f"{k} = {toml(v)}\n" for k, v in settings.items()), 1)
    path = directory / "site.toml"
    path.write_text(text)
    return path


@pytest.fixture(scope="session")
def lab():
    """Both nodes fresh from the factory image, cable in the f0 port; removed at the end."""
    assert os.geteuid() == 0, "the lab needs root: run scripts/test (the fast tier is pytest -m 'not end_to_end')"
    with LabLock():
        lab = Lab("f0")
        lab.up()
        yield lab
        lab.down()


@pytest.fixture(scope="module")
def converged(lab):
    """A full deploy run on the lab, once per module (each starts from the last one's state);
    the run's output."""
    result = pyinfra("-y")
    assert result.returncode == 0, result.stdout
    return result


@pytest.fixture(scope="module")
def clients(converged, tmp_path_factory):
    """`python -m clients` for the lab: the output directory, the local port, what it printed."""
    out, port = tmp_path_factory.mktemp("clients"), free_port()
    result = subprocess.run([sys.executable, "-m", "clients", "--site", str(SITE), "--out", str(out), "--port", str(port)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return out, port, result.stdout + result.stderr


@pytest.fixture(scope="module")
def tunnel(clients):
    """The tunnel command the clients command printed, run as printed; its local URL."""
    _, port, text = clients
    [command] = [line.strip() for line in text.splitlines() if line.strip().startswith("ssh -N -L")]
    process = subprocess.Popen(shlex.split(command), stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.2)
    yield f"http://127.0.0.1:{port}"
    process.terminate()
    process.wait(timeout=10)


def generates() -> bool:
    """One token through the head's API, asked on the head; False while any rank is down."""
    from lab.config import HEAD
    from lab.processes import in_node

    try:
        return in_node(HEAD.dir, "python3", "/var/lib/dual-spark/bin/dual-spark.pyz", "health", "--key-file", "/var/lib/dual-spark/api-key",
                       "--timeout", "20", capture_output=True, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def healed_after(name: str, fault) -> float:
    """Inject ``fault``; the cluster must stop serving, then serve again with no one touching it.
    The seconds from the fault to the first token served again."""
    assert generates(), "the cluster must serve before the fault"
    started = time.monotonic()
    fault()
    while generates():
        assert time.monotonic() - started < 120, f"{name}: the cluster still serves two minutes after the fault"
        time.sleep(1)
    while not generates():
        assert time.monotonic() - started < 900, f"{name}: the cluster does not serve 15 minutes after the fault"
        time.sleep(1)
    return round(time.monotonic() - started, 1)


def reboot(*which) -> None:
    """Power the nodes off at once, then on."""
    from lab import faults, nodes

    for node in which:
        faults.crash(node)
    for node in which:
        nodes.boot(node)


def serving_after(timeout: float = 600) -> float:
    """Seconds until the head's API generates a token again (the watchdogs heal the cluster after
    a fault); fails the test past ``timeout``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        if generates():
            return time.monotonic() - started
        time.sleep(2)
    raise AssertionError(f"the cluster does not serve {timeout:.0f} s later")


def pytest_terminal_summary(terminalreporter):
    """The recovery times, past pytest's output capture (README quotes them)."""
    if RECOVERED:
        terminalreporter.section("fault -> first served token (lab, goal <= 180 s; the recipe's Sparks: ~9 min)")
        for fault, seconds in RECOVERED.items():
            terminalreporter.write_line(f"{fault:<34} {seconds:6.0f} s")
    if FOUND:
        terminalreporter.section("fault -> a watchdog ends vLLM for it (lab, goal <= 30 s)")
        for fault, seconds in FOUND.items():
            terminalreporter.write_line(f"{fault:<34} {seconds:6.1f} s")
    if DOWNTIME:
        terminalreporter.section("change -> seconds without service (lab, a probe every 0.5 s through the API)")
        for change, seconds in DOWNTIME.items():
            terminalreporter.write_line(f"{change:<34} {seconds:6.1f} s")
