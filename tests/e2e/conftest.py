"""Shared by the end-to-end tests: the lab, held (lab/lock.py) and brought up from the factory
state once for the whole session, and the pyinfra CLI run as a user runs it against it. The
test modules are numbered in the order they build on each other's state."""

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest

from lab.config import LAB_DIR
from lab.core import Lab
from lab.lock import LabLock
from lab.site import table
from site_config import load_site
from site_schema import toml_value
from tests.net import free_port

REPO = Path(__file__).resolve().parents[2]
PYINFRA = Path(sys.executable).parent / "pyinfra"
SITE = LAB_DIR / "site.toml"
LAB_ENV = {**os.environ, "DUAL_SPARK_SITE": str(SITE)}
LENT_BACK_WITHIN = 1200  # seconds the lab waits at the end of its idle stretch for the sessions beside it
RECOVERED: dict[str, float] = {}
"""Fault -> seconds until the pair served a token again (test_50), printed at the end of the run."""
FOUND: dict[str, float] = {}
"""Fault -> seconds until a watchdog ended vLLM for it (test_50), printed at the end of the run."""
DOWNTIME: dict[str, float] = {}  # a change -> the longest wait of a request at the front door
"""Change -> seconds the API answered no request while the run made it (test_40), printed at the end."""
CANARY_RUNS: dict[str, str] = {}  # a change -> each canary's seconds in its run, as the run printed them


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
    text = text.replace("[settings]\n", "[settings]\n" + "".join(f"{k} = {toml_value(v)}\n" for k, v in settings.items()), 1)
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
def api(converged):
    """The API through an SSH tunnel to the head, as a client reaches it: URL and key."""
    from bench.endpoint import through_site

    with ExitStack() as stack:
        url, key, _ = through_site(stack, load_site(SITE), accept_new=False)
        yield url, key


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


VLLM_URL, DOOR_URL = "http://127.0.0.1:8889", "http://127.0.0.1:8888"  # on the head: vLLM itself, and the front door


def generates(url: str = VLLM_URL, timeout: float = 20) -> bool:
    """One token, asked on the head: from vLLM itself (the front door would hold the request while
    a rank is down), or through the door with ``url``; False while it does not answer."""
    from lab.config import HEAD
    from lab.processes import in_node

    try:
        return in_node(HEAD.dir, "python3", "/var/lib/dual-spark/bin/dual-spark.pyz", "health", "--url", url,
                       "--key-file", "/var/lib/dual-spark/api-key", "--timeout", str(timeout), capture_output=True, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def door_sees() -> str | None:
    """vLLM's health as the front door's check sees it ("UP", "DOWN", ...), read on the head."""
    from lab.config import HEAD
    from lab.processes import in_node

    state = in_node(HEAD.dir, "python3", "/var/lib/dual-spark/bin/dual-spark.pyz", "door", "state", "--socket",
                    "/run/haproxy-dual-spark.sock", capture_output=True, check=False).stdout
    try:
        return json.loads(state)["door"]["health"]
    except (ValueError, KeyError, TypeError):
        return None


def healed_after(name: str, fault, door_stays: bool = True) -> float:
    """Inject ``fault``; vLLM must stop serving, then serve again with no one touching it; the
    seconds from the fault to its first token served again. Where the head itself stays up
    (``door_stays``), a request sent to the front door once it sees vLLM down is held there and
    served once the cluster heals (one sent before may meet the dying engine: it was in flight);
    in every case the door serves afterwards."""
    assert generates(), "the cluster must serve before the fault"
    started = time.monotonic()
    fault()
    held: list[bool] = []
    sender = threading.Thread(target=lambda: held.append(generates(DOOR_URL, timeout=600)))
    while generates():
        assert time.monotonic() - started < 120, f"{name}: the cluster still serves two minutes after the fault"
        time.sleep(1)
    if door_stays:
        while door_sees() != "DOWN" and generates(timeout=2) is False:
            assert time.monotonic() - started < 120, f"{name}: the front door never saw vLLM down"
            time.sleep(0.5)
        sender.start()
    while not generates():
        assert time.monotonic() - started < 900, f"{name}: the cluster does not serve 15 minutes after the fault"
        time.sleep(1)
    healed = round(time.monotonic() - started, 1)
    if door_stays:
        sender.join(timeout=660)
        assert held == [True], f"{name}: a request sent to the front door after the fault was not served once the cluster healed"
    assert generates(DOOR_URL), f"{name}: the front door does not serve after the cluster healed"
    return healed


def reboot(*which) -> None:
    """Power the nodes off at once, then on."""
    from lab import faults, nodes

    for node in which:
        faults.crash(node)
    for node in which:
        nodes.boot(node)


@pytest.fixture(scope="module")
def lent_cores():
    """The lab's idle stretch, for a module that waits on timers more than it computes: where
    scripts/test names a directory (DUAL_SPARK_LENT), the fast tier and tests/serving run from the
    module's start, and the session goes on to the next module, whose faults are timed, only once
    they have ended. Elsewhere, nothing."""
    lent = os.environ.get("DUAL_SPARK_LENT")
    if lent:
        Path(lent, "lent").touch()
    yield
    deadline = time.monotonic() + LENT_BACK_WITHIN
    while lent and not Path(lent, "returned").exists():
        assert time.monotonic() < deadline, f"the sessions beside the lab's have not ended {LENT_BACK_WITHIN} s after the module"
        time.sleep(2)


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
        terminalreporter.section("change -> the longest a request waited at the front door, none failed (lab, a probe every 0.5 s)")
        for change, seconds in DOWNTIME.items():
            terminalreporter.write_line(f"{change:<34} {seconds:6.1f} s")
    if CANARY_RUNS:
        terminalreporter.section("change -> the canaries' run after its first token (lab)")
        for change, seconds in CANARY_RUNS.items():
            terminalreporter.write_line(f"{change:<34} {seconds}")
