"""The order of the tiers when one session runs them all (plain `pytest`; scripts/test runs what
needs no lab in sessions of their own beside the lab's): the fast tier first (it fails fast), then the
end-to-end tiers, the 4-node one (tests/cluster) last: its lab replaces the pair's."""

from pathlib import Path

CLUSTER = Path(__file__).resolve().parent / "cluster"


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: (CLUSTER in item.path.parents, item.get_closest_marker("end_to_end") is not None))
