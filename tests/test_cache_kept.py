"""The caches' claim and prune before a start (operations/own.py: cache_kept), the program the
deploy ships (the archive, files/dual_spark/own.py) run by a real shell on directories planted
under a temporary directory: what the deploy made and no stack file names goes, everything else
stays, and what is not the deploy's is refused before anything changes. The stack files are the
real compose files (operations/stack.py), with their cache moved there."""

import os
import pwd
import subprocess
from pathlib import Path

import pytest

from files.dual_spark.refusals import MARKER_TEXT
from layout import MANAGED_MARKER, RECORDS
from operations.own import cache_kept
from operations.stack import compose_file, environment, stack_settings
from site_config import load_site
from tests.programs import ARCHIVE

ME = pwd.getpwuid(os.getuid()).pw_name  # root's place on a node: the owner these tests trust
PAIR = Path(__file__).parent / "pair" / "site.toml"


def mark(path: Path) -> Path:
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    (path / MANAGED_MARKER).write_text(MARKER_TEXT + "\n")
    return path


@pytest.fixture
def node(tmp_path):
    """state_dir claimed (real, marked), an empty stack_dir; returns (state_dir, stack_dir)."""
    state, stack = mark(tmp_path / "var/lib/dual-spark"), mark(tmp_path / "etc/dual-spark")
    return state, stack


def stack_file(path: Path, cache: Path) -> None:
    """A compose file as the deploy writes it, mounting ``cache``."""
    cluster = load_site(PAIR)
    settings = stack_settings(cluster, cluster.head.hostname)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = compose_file(settings, environment(settings, 3), "0123456789abcdef", "0123456789ab")
    path.write_text(text.replace(f"source: {settings.cache_dir}\n", f"source: {cache}\n"))


def named(stack: Path) -> list[str]:
    return [str(stack / "compose.yaml"), str(stack / "compose.yaml.previous"), *(str(stack / r / "compose.yaml") for r in RECORDS)]


def run(state: Path, cache: Path, stack: Path) -> subprocess.CompletedProcess:
    command = cache_kept(str(ARCHIVE), str(state), str(cache), named(stack), owner=ME)
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30)


def test_a_fresh_node_gets_the_caches_made_and_marked_then_nothing_to_do(node):
    state, stack = node
    cache = state / "cache/tony-overlay-8c83abf6f44b"
    first = run(state, cache, stack)
    assert first.returncode == 0, first.stderr
    assert first.stdout.splitlines() == [f"made {state / 'cache'}, marked {MANAGED_MARKER}", f"made {cache}, marked {MANAGED_MARKER}"]
    for path in (state / "cache", cache):
        assert (path / MANAGED_MARKER).read_text() == MARKER_TEXT + "\n" and oct(path.stat().st_mode & 0o777) == "0o755"
    (cache / "vllm").mkdir()
    (cache / "vllm/kernel.so").write_text("compiled")
    again = run(state, cache, stack)
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")
    assert (cache / "vllm/kernel.so").read_text() == "compiled"


def test_only_the_deploys_caches_no_stack_names_are_removed(node, tmp_path):
    state, stack = node
    root = mark(state / "cache")
    cache = mark(root / "new-aaaaaaaaaaaa")
    gone = mark(root / "old-bbbbbbbbbbbb")
    (gone / "triton").mkdir()
    previous, served, rollback = (mark(root / f"{name}-cccccccccccc") for name in ("previous", "served", "rollback"))
    stack_file(stack / "compose.yaml", cache)
    stack_file(stack / "compose.yaml.previous", previous)
    stack_file(stack / "served/compose.yaml", served)
    stack_file(stack / "rollback/compose.yaml", rollback)
    unmarked = root / "someone-dddddddddddd"
    unmarked.mkdir()
    open_to_all = mark(root / "open-eeeeeeeeeeee")
    open_to_all.chmod(0o777)
    elsewhere = mark(tmp_path / "elsewhere")
    (root / "link-ffffffffffff").symlink_to(elsewhere)
    (root / "a-file").write_text("not a directory")
    # a name the stack files hold only as a prefix of theirs is no name of it
    prefix = mark(root / "new-aaaaaaaaaaa")

    result = run(state, cache, stack)

    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(
        f"removed {path}: the caches of an image no stack here names" for path in (gone, prefix))
    assert not gone.exists() and not prefix.exists()
    for kept in (cache, previous, served, rollback, unmarked, open_to_all, elsewhere, root / "a-file"):
        assert kept.exists(), kept
    assert (root / "link-ffffffffffff").is_symlink() and (elsewhere / MANAGED_MARKER).exists()
    assert run(state, cache, stack).stdout == ""


@pytest.mark.parametrize("plant, refusal", [
    (lambda root, cache: root.mkdir(), "is not the deploy's"),
    (lambda root, cache: (mark(root), cache.mkdir()), "is not the deploy's"),
    (lambda root, cache: (mark(root), cache.symlink_to(mark(root.parent / "elsewhere"))), "is a symbolic link"),
    (lambda root, cache: (mark(root), mark(cache).chmod(0o777)), "a user other than root"),
])
def test_a_cache_directory_not_the_deploys_is_refused_and_nothing_changes(node, plant, refusal):
    state, stack = node
    root, cache = state / "cache", state / "cache/img-aaaaaaaaaaaa"
    plant(root, cache)
    gone = root / "old-bbbbbbbbbbbb"
    if (root / MANAGED_MARKER).exists():
        mark(gone)
    before = sorted(str(p) for p in root.rglob("*"))
    result = run(state, cache, stack)
    assert result.returncode != 0 and refusal in result.stderr, result.stderr
    assert sorted(str(p) for p in root.rglob("*")) == before


def test_nothing_happens_in_a_state_dir_the_deploy_did_not_claim(tmp_path):
    state, stack = tmp_path / "var/lib/dual-spark", mark(tmp_path / "etc/dual-spark")
    state.mkdir(parents=True)
    result = run(state, state / "cache/img-aaaaaaaaaaaa", stack)
    assert result.returncode != 0 and "is not a directory the deploy claimed" in result.stderr
    assert list(state.iterdir()) == []
