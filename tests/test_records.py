"""The records of the states that served: the calls operations/records.py makes, run by a real
shell on real directories with the archive the deploy ships (files/dual_spark/stack.py): what
`record` keeps and moves, what `restore` installs and starts, and that both refuse a stack
directory the deploy did not claim. Docker is a script on PATH that answers `image inspect` and
logs every call: the e2e tests run the real one."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from layout import MANAGED_MARKER
from operations.records import record, restore
from operations.stack import stack_settings
from site_config import load_site
from states import cluster_state, described, state_of
from tests.fake_host import with_settings
from tests.programs import ARCHIVE

SITE = Path(__file__).parent / "sites" / "pair.toml"
IMAGE_ID = "sha256:" + "5e" * 32


@pytest.fixture
def node(tmp_path):
    """The head's stack settings with its stack and state directories in tmp_path, the stack
    directory claimed and holding a stack; docker on PATH."""
    stack_dir, state = tmp_path / "stack", tmp_path / "state"
    stack_dir.mkdir()
    (state / "serving").mkdir(parents=True)
    (state / "bin").mkdir()
    shutil.copy(ARCHIVE, state / "bin/dual-spark.pyz")
    (stack_dir / MANAGED_MARKER).touch()
    (stack_dir / "compose.yaml").write_text("stack A\n")
    (stack_dir / "launch.sh").write_text("#!/bin/sh\nA\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "docker").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/docker.log\n'
                                    f'[ "$1 $2" = "image inspect" ] && echo {IMAGE_ID}\nexit 0\n')
    (bin_dir / "docker").chmod(0o755)
    settings = stack_settings(load_site(SITE), "spark-head")
    return with_settings(settings, stack_dir=str(stack_dir), state_dir=str(state)), tmp_path


def run(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True,
                          env={"PATH": f"{tmp_path}/bin:/usr/bin:/bin"})


def values(settings, stack: str) -> dict:
    return state_of(settings, stack, cluster_state([stack, "worker-" + stack]), "e8" * 32)


def test_a_state_that_serves_is_recorded_once_and_the_one_before_becomes_the_rollback(node):
    settings, tmp_path = node
    stack_dir = Path(settings.site.stack_dir)
    assert run(record(settings, values(settings, "aaaa")), tmp_path).returncode == 0
    served = json.loads((stack_dir / "served/state.json").read_text())
    assert served["stack"] == "aaaa" and served["image_id"] == IMAGE_ID and served["profile"] == settings.cluster.profile_name
    assert served["model_digest"] == "e8" * 6 and served["since"].endswith("Z")
    assert (stack_dir / "served/compose.yaml").read_text() == "stack A\n"
    assert not (stack_dir / "rollback").exists()

    before = (stack_dir / "served/state.json").stat().st_mtime_ns
    (stack_dir / "compose.yaml").write_text("stack A, edited after\n")
    assert run(record(settings, values(settings, "aaaa")), tmp_path).returncode == 0
    assert (stack_dir / "served/state.json").stat().st_mtime_ns == before  # the same state: nothing moves
    assert (stack_dir / "served/compose.yaml").read_text() == "stack A\n"

    (stack_dir / "compose.yaml").write_text("stack B\n")
    assert run(record(settings, values(settings, "bbbb")), tmp_path).returncode == 0
    assert json.loads((stack_dir / "served/state.json").read_text())["stack"] == "bbbb"
    assert (stack_dir / "served/compose.yaml").read_text() == "stack B\n"
    assert json.loads((stack_dir / "rollback/state.json").read_text())["stack"] == "aaaa"
    assert (stack_dir / "rollback/compose.yaml").read_text() == "stack A\n"


def test_restore_installs_a_record_keeps_what_it_replaces_and_starts_it_owing_no_backoff(node):
    settings, tmp_path = node
    stack_dir = Path(settings.site.stack_dir)
    run(record(settings, values(settings, "aaaa")), tmp_path)
    (stack_dir / "compose.yaml").write_text("stack B\n")
    (stack_dir / "launch.sh").write_text("#!/bin/sh\nB\n")
    starts = Path(settings.restarts_dir) / "head-starts"
    starts.write_text('{"failed_starts": 3, "healthy": false}')

    done = run(restore(settings, "served"), tmp_path)
    assert done.returncode == 0, done.stderr
    assert (stack_dir / "compose.yaml").read_text() == "stack A\n"
    assert (stack_dir / "launch.sh").read_text() == "#!/bin/sh\nA\n" and (stack_dir / "launch.sh").stat().st_mode & 0o777 == 0o755
    assert (stack_dir / "compose.yaml.previous").read_text() == "stack B\n"
    assert not starts.exists()
    calls = (tmp_path / "docker.log").read_text().splitlines()
    assert calls[-1] == f"compose --project-directory {stack_dir} -f {stack_dir}/compose.yaml up -d --force-recreate --remove-orphans --timeout 3"


@pytest.mark.parametrize("answers, kept", [
    ({"cluster": "THIS", "failed": {}}, True),
    ({"cluster": "another state", "failed": {}}, False),
    ({"cluster": "THIS", "failed": {"long": ["differs at token 80"]}}, False),
    (None, False),
    ("a link", False),
], ids=["passed on this state", "ran on another state", "failed", "none ran", "a link"])
def test_the_canaries_answers_are_kept_with_the_state_they_passed_on_alone(node, answers, kept):
    settings, tmp_path = node
    stack_dir = Path(settings.site.stack_dir)
    state = values(settings, "aaaa")
    if answers == "a link":
        (tmp_path / "theirs.json").write_text(json.dumps({"cluster": state["cluster"], "failed": {}, "when": "now", "answers": {"x": {}}}))
        (stack_dir / "canary.json").symlink_to(tmp_path / "theirs.json")
    elif answers is not None:
        text = json.dumps({**answers, "cluster": state["cluster"] if answers["cluster"] == "THIS" else answers["cluster"],
                           "when": "2026-12-04T20:00:00Z", "answers": {"long": {"tokens": [1, 2, 3], "max_tokens": 3}}})
        (stack_dir / "canary.json").write_text(text)
    assert run(record(settings, state), tmp_path).returncode == 0
    served = json.loads((stack_dir / "served/state.json").read_text())
    assert (stack_dir / "served/canary.json").exists() == kept
    assert served.get("canaries") == ({"passed": ["long"], "when": "2026-12-04T20:00:00Z"} if kept else None)
    if kept:
        assert json.loads((stack_dir / "served/canary.json").read_text())["answers"]["long"]["tokens"] == [1, 2, 3]


def test_restore_without_the_record_changes_nothing(node):
    settings, tmp_path = node
    done = run(restore(settings, "rollback"), tmp_path)
    assert done.returncode != 0
    assert (Path(settings.site.stack_dir) / "compose.yaml").read_text() == "stack A\n"
    assert not (tmp_path / "docker.log").exists()


@pytest.mark.parametrize("script", [lambda s: record(s, values(s, "aaaa")), lambda s: restore(s, "served")])
def test_a_stack_directory_the_deploy_did_not_claim_is_refused(node, script):
    settings, tmp_path = node
    (Path(settings.site.stack_dir) / MANAGED_MARKER).unlink()
    done = run(script(settings), tmp_path)
    assert done.returncode != 0 and "is not a directory the deploy claimed" in done.stderr
    assert sorted(p.name for p in Path(settings.site.stack_dir).iterdir()) == ["compose.yaml", "launch.sh"]


def test_a_record_names_its_state_in_one_line():
    line = described({"profile": "fast", "image": "dual-spark/x:1", "image_id": "sha256:" + "5e" * 32,
                      "model": {"repo": "org/m", "revision": "a" * 40}, "since": "2026-12-01T10:00:00Z"})
    assert line == f"profile fast, image dual-spark/x:1 (sha256:5e5e5e5e5e5e), model org/m@{'a' * 12}, serving since 2026-12-01T10:00:00Z"
    assert described({"profile": "p", "image": "i", "model": {"path": "/srv/m"}}) == "profile p, image i, model /srv/m"


@pytest.mark.parametrize("script", [lambda s: record(s, values(s, "aaaa")), lambda s: restore(s, "served")], ids=["record", "restore"])
@pytest.mark.parametrize("hostile", ["writable by others", "reached through a link"])
def test_a_stack_directory_others_could_have_changed_is_refused(node, script, hostile):
    settings, tmp_path = node
    stack_dir = Path(settings.site.stack_dir)
    run(record(settings, values(settings, "aaaa")), tmp_path)
    if hostile == "writable by others":
        stack_dir.chmod(0o777)
    else:
        (tmp_path / "link").symlink_to(stack_dir)
        settings = with_settings(settings, stack_dir=str(tmp_path / "link"))
    before = sorted(p.name for p in stack_dir.iterdir())
    (stack_dir / "compose.yaml").write_text("stack B\n")
    done = run(script(settings), tmp_path)
    assert done.returncode != 0 and "is not a directory the deploy claimed" in done.stderr
    assert sorted(p.name for p in stack_dir.iterdir()) == before and (stack_dir / "compose.yaml").read_text() == "stack B\n"
    assert json.loads((stack_dir / "served/state.json").read_text())["stack"] == "aaaa"
