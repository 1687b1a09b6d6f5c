"""The model store's clean-up removes, in the run that follows its plan, only what the plan
showed: a directory the stack files named when the run planned stays, even once the stack the
run installs no longer names it (compose.yaml.previous moved on)."""

import subprocess
from pathlib import Path

from facts.store import StoreState
from layout import MANAGED_MARKER
from operations.store import store_pruned
from tests.fake_host import load, running, task_arguments

CASE = Path(__file__).parent / "operations/store.store_pruned/the_new_revision_serves.json"


def run(case: dict, mounted: list[str]) -> list[str]:
    """The operation's commands on the case's host, its stack files mounting ``mounted``."""
    next(iter(case["facts"]["spark-head"]["store.StoreState"].values()))["mounted"] = mounted
    return [command.get_raw_value() for command in store_pruned._inner(**task_arguments(store_pruned, {}))]


def test_the_run_removes_only_what_its_plan_showed():
    case = load(CASE)
    names = next(iter(case["facts"]["spark-head"]["store.StoreState"].values()))["entries"]
    new, old, older = (next(f"/var/lib/dual-spark/model/{name}" for name in names if revision in name)
                       for revision in ("14c06b6db367", "0b1c8e2d5f7a", "f00dfeed1234"))
    with running(case) as (state, _):
        planned = run(case, [new, old, older])  # the plan: each named, the older by compose.yaml.previous
        state.is_executing = True
        ran = run(case, [new, old])  # the run: the stack it installed moved compose.yaml.previous on
    assert planned == [] and ran == []
    with running(case) as (state, _):
        state.is_executing = True
        assert [command for command in run(case, [new, old]) if f"own remove --dir {older} " in command]  # no plan: the files decide


def test_a_marked_entry_another_user_can_change_is_not_the_stores(tmp_path):
    """The reading counts an entry the deploy's only if root or the store's owner owns it and its
    marker, and no one else can write it: a marker alone proves nothing."""
    store, stacks = tmp_path / "model", tmp_path / "stacks"
    store.mkdir()
    stacks.mkdir()
    for name in ("lab-ours-0123456789ab", "lab-open-0123456789ab"):
        (store / name).mkdir()
        (store / name / MANAGED_MARKER).write_text("marker\n")
    (store / "lab-open-0123456789ab").chmod(0o777)
    fact = StoreState()
    output = subprocess.run(["sh", "-c", fact.command(str(store), str(stacks)).get_raw_value()],
                            capture_output=True, text=True, timeout=30).stdout
    assert fact.process(output.splitlines())["entries"] == {"lab-ours-0123456789ab": True, "lab-open-0123456789ab": False}
