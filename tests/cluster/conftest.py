"""The 4-node tier: four emulated Sparks through the lab's switch (a bridge per rail), held
(lab/lock.py) and brought up from the factory state once for the session, converged once for
the module. It runs after tests/e2e (its lab replaces the pair's: never both at once). What it
measures (converge, first token, memory, recovery) is printed at the end of the run."""

import os
import threading
import time
from pathlib import Path

import pytest

from lab.config import Node
from lab.core import Lab
from lab.lock import LabLock
from tests.e2e.conftest import clients, pyinfra, tunnel  # noqa: F401 (clients and tunnel: the fixtures, shared)

HERE = Path(__file__).resolve().parent
NODES = 4
MEASURED: dict[str, str] = {}
"""What -> how long or how much (the converge, the first token, memory, recovery), printed last."""


@pytest.fixture(scope="session")
def cluster_lab():
    """Four nodes fresh from the factory image through the switch; removed at the end. Bringing
    it up takes down whatever lab is up (the pair of tests/e2e in the same session)."""
    assert os.geteuid() == 0, "the lab needs root: run scripts/test (the fast tier is pytest -m 'not end_to_end')"
    with LabLock():
        lab = Lab("f0", NODES, "switch")
        lab.up()
        yield lab
        lab.down()


class MemorySampler:
    """The machine's lowest MemAvailable while it runs, sampled twice a second."""

    def __init__(self):
        self.lowest = self.start = available_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            self.lowest = min(self.lowest, available_bytes())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def available_bytes() -> int:
    line = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemAvailable:"))
    return int(line.split()[1]) * 1024


def containers_memory(node: Node, peak: bool) -> int:
    """Bytes the node's containers use (or used at most), from its cgroup parent (v1 or v2)."""
    for path in (Path("/sys/fs/cgroup/memory") / node.cgroup_parent / ("memory.max_usage_in_bytes" if peak else "memory.usage_in_bytes"),
                 Path("/sys/fs/cgroup") / node.cgroup_parent / ("memory.peak" if peak else "memory.current")):
        if path.exists():
            return int(path.read_text())
    return 0


@pytest.fixture(scope="module")
def converged(cluster_lab):
    """One full deploy from the factory state, shared by the module's tests: its output. The
    time it took, the first token's wait it printed and the memory it used are measured."""
    with MemorySampler() as memory:
        started = time.monotonic()
        result = pyinfra("-y", timeout=2400)
        took = time.monotonic() - started
    assert result.returncode == 0, result.stdout
    MEASURED["first converge (4 nodes)"] = f"{took:.0f} s"
    MEASURED["machine memory used at most during it"] = f"{(memory.start - memory.lowest) / 2**30:.1f} GiB"
    for node in cluster_lab.nodes:
        MEASURED[f"{node.hostname} containers: now / peak"] = (f"{containers_memory(node, False) / 2**30:.2f} / "
                                                              f"{containers_memory(node, True) / 2**30:.2f} GiB")
    return result


def pytest_terminal_summary(terminalreporter):
    """The measurements, past pytest's output capture."""
    if MEASURED:
        terminalreporter.section("4-node lab through the switch: measured (benchmarks, not targets)")
        for what, value in MEASURED.items():
            terminalreporter.write_line(f"{what:<48} {value}")
