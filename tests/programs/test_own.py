"""The program of the deploy's own directories (own.py) on real trees, at its edges: no link is
followed anywhere (a level, a directory above it, a marker, an earlier version's file), a path it
is not given in order is refused before anything is made, what it makes has its modes whatever
the umask, a model entry is made the user's, and only what the deploy made is removed. The
claims as the head composes them: tests/test_own.py and tests/test_cache_kept.py."""

import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest
from dual_spark.constants import MANAGED_MARKER
from dual_spark.refusals import MARKER_TEXT

from tests.programs import ARCHIVE

ME = pwd.getpwuid(os.getuid()).pw_name


def own(*args: str, umask: int | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ARCHIVE), "own", *args], capture_output=True, text=True, timeout=30,
                          preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)


def mark(path: Path) -> Path:
    path.mkdir(mode=0o755, parents=True, exist_ok=True)
    (path / MANAGED_MARKER).write_text(MARKER_TEXT + "\n")
    return path


def test_a_claimed_directory_passes_the_guard_and_a_link_to_it_does_not(tmp_path):
    ours = mark(tmp_path / "state")
    (tmp_path / "link").symlink_to(ours)
    assert own("guard", "--dir", str(ours), "--field", "state_dir", "--owner", ME).returncode == 0
    for path in (tmp_path / "link", f"{tmp_path}/state/../state", "state"):
        refused = own("guard", "--dir", str(path), "--field", "state_dir", "--owner", ME)
        assert refused.returncode == 1
        assert refused.stderr == (f"state_dir {path} is not a directory the deploy claimed (a real directory only root and {ME} "
                                  f"can change, holding their {MANAGED_MARKER}): run `pyinfra inventory.py tasks/runtime.py`, "
                                  "which makes and marks it\n")


def test_a_directory_below_a_link_and_a_marker_that_is_a_link_are_not_the_deploys(tmp_path):
    mark(tmp_path / "real/state")
    (tmp_path / "via").symlink_to(tmp_path / "real")
    assert own("guard", "--dir", str(tmp_path / "via/state"), "--field", "state_dir", "--owner", ME).returncode == 1
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / MANAGED_MARKER).symlink_to(tmp_path / "real/state" / MANAGED_MARKER)
    assert own("guard", "--dir", str(linked), "--field", "state_dir", "--owner", ME).returncode == 1


def claim(tmp_path: Path, *more: str, umask: int | None = None) -> subprocess.CompletedProcess:
    state = str(tmp_path / "state")
    return own("claim", "--owner", ME, "--parent", str(tmp_path), "state_dir", state, "--level", state, "state_dir", *more,
               umask=umask)


def test_what_it_makes_has_its_modes_whatever_the_umask(tmp_path):
    tmp_path.chmod(0o755)
    made = claim(tmp_path, "--level", str(tmp_path / "state/model"), "model_dir", "--own", str(tmp_path / "state/model"), ME, "750",
                 umask=0o077)
    assert made.returncode == 0, made.stderr
    assert made.stdout.splitlines() == [f"made {tmp_path}/state, marked {MANAGED_MARKER}",
                                        f"made {tmp_path}/state/model, marked {MANAGED_MARKER}"]
    assert oct((tmp_path / "state").stat().st_mode & 0o7777) == "0o755"
    assert oct((tmp_path / "state/model").stat().st_mode & 0o7777) == "0o750"
    marker = tmp_path / "state" / MANAGED_MARKER
    assert marker.read_text() == MARKER_TEXT + "\n" and oct(marker.stat().st_mode & 0o777) == "0o644"
    again = claim(tmp_path, "--level", str(tmp_path / "state/model"), "model_dir")
    assert (again.returncode, again.stdout, again.stderr) == (0, "", "")


def test_a_level_given_out_of_order_or_an_own_of_no_level_is_refused_before_anything_is_made(tmp_path):
    tmp_path.chmod(0o755)
    deep = str(tmp_path / "state/a/b")
    refused = own("claim", "--owner", ME, "--parent", str(tmp_path), "state_dir", deep, "--level", str(tmp_path / "state"), "state_dir",
                  "--level", deep, "state_dir")
    assert refused.returncode == 1 and refused.stderr == f"{deep}: its directory is neither a --parent nor a --level before it\n"
    assert list(tmp_path.iterdir()) == []
    refused = claim(tmp_path, "--own", str(tmp_path / "other"), ME, "755")
    assert refused.returncode == 1 and "--own names no --level" in refused.stderr


def test_a_parent_that_is_a_file_or_a_link_is_no_parent(tmp_path):
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(tmp_path)
    for parent in (tmp_path / "file", tmp_path / "link"):
        path = str(parent / "state")
        refused = own("claim", "--owner", ME, "--parent", str(parent), "state_dir", path, "--level", path, "state_dir")
        assert refused.returncode == 1 and refused.stderr.startswith(f"{parent} is not a directory here (or is a symbolic link)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["file", "link"]


@pytest.mark.as_root
def test_an_earlier_versions_file_behind_a_link_adopts_nothing(tmp_path):
    tmp_path.chmod(0o755)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "model_sync.py").write_text("# not the deploy's\n")
    (tmp_path / "state").mkdir()
    (tmp_path / "state/bin").symlink_to(elsewhere)
    refused = claim(tmp_path, "--legacy", str(tmp_path / "state"), "bin/model_sync.py")
    assert refused.returncode == 1 and f"{tmp_path}/state exists and is not the deploy's" in refused.stderr
    assert not (tmp_path / "state" / MANAGED_MARKER).exists()
    (tmp_path / "state/bin").unlink()
    (tmp_path / "state/bin").mkdir()
    (tmp_path / "state/bin/model_sync.py").write_text("# an earlier version's\n")
    adopted = claim(tmp_path, "--legacy", str(tmp_path / "state"), "bin/model_sync.py")
    assert adopted.stdout == f"adopted {tmp_path}/state (an earlier version's bin/model_sync.py), marked {MANAGED_MARKER}\n"


def entry(store: Path, name: str, user: str) -> subprocess.CompletedProcess:
    return own("entry", "--store", str(store), "--entry", str(store / name), "--user", user)


@pytest.mark.as_root
def test_a_model_entry_is_made_the_users_with_a_marker_of_theirs(tmp_path):
    store = mark(tmp_path / "model")
    os.chown(store, 65534, 65534)
    os.chown(store / MANAGED_MARKER, 65534, 65534)
    made = entry(store, "dsv4-0123456789ab", "nobody")
    assert made.returncode == 0, made.stderr
    for path in (store / "dsv4-0123456789ab", store / "dsv4-0123456789ab" / MANAGED_MARKER):
        assert (path.stat().st_uid, path.stat().st_gid) == (65534, pwd.getpwnam("nobody").pw_gid)
    assert entry(store, "dsv4-0123456789ab", "nobody").returncode == 0


def test_an_entry_someone_else_made_or_outside_the_store_is_refused_and_left(tmp_path):
    store = mark(tmp_path / "model")
    (store / "theirs").mkdir()
    (store / "theirs/weights").write_text("theirs")
    refused = entry(store, "theirs", ME)
    assert refused.returncode == 1 and refused.stderr.startswith(f"{store}/theirs exists and is not the deploy's")
    assert sorted(path.name for path in (store / "theirs").iterdir()) == ["weights"]
    (store / "link").symlink_to(mark(tmp_path / "elsewhere"))
    assert "is a symbolic link" in entry(store, "link", ME).stderr
    outside = own("entry", "--store", str(store), "--entry", str(tmp_path / "elsewhere"), "--user", ME)
    assert outside.returncode == 1 and outside.stderr == f"{tmp_path}/elsewhere is not a directory right in {store}\n"
    assert entry(tmp_path / "nowhere", "dsv4", ME).returncode == 1 and not (tmp_path / "nowhere").exists()


def test_remove_takes_what_the_deploy_made_and_nothing_a_link_in_it_points_at(tmp_path):
    store, keep = mark(tmp_path / "model"), mark(tmp_path / "keep")
    (keep / "weights").write_text("kept")
    gone = mark(store / "old")
    (gone / "deep/er").mkdir(parents=True)
    (gone / "deep/er/file").write_text("x")
    (gone / "to-keep").symlink_to(keep)
    assert own("remove", "--dir", str(gone), "--owner", ME).returncode == 0
    assert not gone.exists() and (keep / "weights").read_text() == "kept"
    (store / "unmarked").mkdir()
    (store / "link").symlink_to(keep)
    for path in (store / "unmarked", store / "link", tmp_path / "link" / "keep"):
        refused = own("remove", "--dir", str(path), "--owner", ME)
        assert refused.returncode == 1 and refused.stderr == (
            f"{path} is no longer the deploy's (no marker, or a user other than root and {ME} can change it): not removed\n")
    assert (store / "unmarked").is_dir() and (store / "link").is_symlink() and (keep / MANAGED_MARKER).exists()


def test_cache_sources_are_read_without_following_a_link(tmp_path):
    """A stack file that is a link names nothing: what only it mounts goes."""
    state, stack = mark(tmp_path / "state"), mark(tmp_path / "stack")
    mark(state / "cache")
    other = mark(state / "cache/other-bbbbbbbbbbbb")
    (tmp_path / "planted.yaml").write_text(f"    source: {other}\n")
    (stack / "compose.yaml").symlink_to(tmp_path / "planted.yaml")
    result = own("cache", "--state-dir", str(state), "--cache", str(state / "cache/new-aaaaaaaaaaaa"),
                 "--named", str(stack / "compose.yaml"), "--owner", ME)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [f"made {state}/cache/new-aaaaaaaaaaaa, marked {MANAGED_MARKER}",
                                          f"removed {other}: the caches of an image no stack here names"]
    (stack / "compose.yaml").unlink()
    (stack / "compose.yaml").write_text(f"    source: {mark(other)}\n")
    kept = own("cache", "--state-dir", str(state), "--cache", str(state / "cache/new-aaaaaaaaaaaa"),
               "--named", str(stack / "compose.yaml"), "--owner", ME)
    assert (kept.returncode, kept.stdout) == (0, "") and other.exists()
