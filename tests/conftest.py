"""The order of the tiers when one session runs them all (plain `pytest`; scripts/test runs what
needs no lab in sessions of their own beside the lab's): the fast tier first (it fails fast), then the
end-to-end tiers, the 4-node one (tests/cluster) last: its lab replaces the pair's. A test marked
`as_root` makes its case as only root can (a file of another owner): skipped for other users, run
by scripts/test in its root session.

A run that leaves out `end_to_end` (the fast tier) spreads over FAST_TIER_WORKERS processes
(pytest.ini: -n auto --dist worksteal, so that a process that runs out takes tests from another's
share and the slow files do not queue in one). Its tests share nothing but the machine: each has
its own files and free ports, and an address of its own where a program counts every link to one.
Every other run is one process: the lab's tiers share one lab."""

import os
from pathlib import Path

import pytest

CLUSTER = Path(__file__).resolve().parent / "cluster"
FAST_TIER_WORKERS = 4  # two cores, and half the slow tests wait on timers rather than compute


def pytest_xdist_auto_num_workers(config):
    return FAST_TIER_WORKERS if config.option.markexpr == "not end_to_end" else 0


def pytest_collection_modifyitems(items):
    if os.geteuid() != 0:
        for item in items:
            if item.get_closest_marker("as_root"):
                item.add_marker(pytest.mark.skip(reason="makes a file of another owner: needs root"))
    items.sort(key=lambda item: (CLUSTER in item.path.parents, item.get_closest_marker("end_to_end") is not None))
