"""The claim of the deploy's directories (operations/own.py) on a tree under a temporary directory
that stands for a node's file system (own_top moved there): read by the real ManagedPaths command,
planned, acted on by the program the deploy ships (the archive, files/dual_spark/own.py), read
again. What exists without the marker is refused by the program itself (the second line),
whatever the reading said, and left as it was."""

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from pyinfra.api import OperationError, QuoteString, StringCommand

import operations.own as own
import site_schema
from facts.host_prep import ManagedPaths
from facts.serving import SecretFiles
from layout import MANAGED_MARKER
from operations.own import NAMES, Claim, claim_command, plan, reading_paths, sealed
from tests.fake_host import FakeHost
from tests.programs import ARCHIVE

ME = pwd.getpwuid(os.getuid()).pw_name  # the deploy user of these tests (chown to it needs no root)


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A node's root under tmp_path: var/lib, etc and srv in it; own_top as the path rule has it,
    relative to that root."""
    root = tmp_path / "node"
    for directory in ("var/lib", "etc/profile.d", "srv"):
        (root / directory).mkdir(parents=True)
    (root / "etc/profile.d/a.sh").write_text("export A=1\n")

    def own_top(path: str) -> str | None:
        relative = "/" + Path(path).relative_to(root).as_posix()
        top = site_schema.own_top(relative)
        return str(root) + top if top else None

    monkeypatch.setattr(own, "own_top", own_top)
    return root


@pytest.fixture(autouse=True)
def on_a_host():
    from pyinfra.context import ctx_host
    with ctx_host.use(FakeHost("spark-head", {}, {}, None)):
        yield


def claims_of(root: Path, state="var/lib/dual-spark", model="var/lib/dual-spark/model", stack="etc/dual-spark") -> list[Claim]:
    return [Claim("state_dir", str(root / state), ME, "755"), Claim("model_dir", str(root / model), ME, "750"),
            Claim("stack_dir", str(root / stack), ME, "755")]


def sh(command) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True, timeout=30)


def read(claims: list[Claim]) -> dict:
    fact = ManagedPaths()
    result = sh(fact.command([], reading_paths(claims), NAMES))
    reading = fact.process(result.stdout.splitlines())
    assert reading["unreadable"] == [], reading
    return reading["directories"]


def tree(root: Path) -> dict[str, tuple]:
    """Every path under root: its mode and, for a file, its text; for a link, where it points."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path)] = ("link", os.readlink(path))
        else:
            found[str(path)] = (oct(path.stat().st_mode), path.read_text() if path.is_file() else None)
    return found


def test_a_fresh_node_gets_every_level_made_and_marked_then_nothing_to_do(node):
    claims = claims_of(node)
    planned = plan(claims, read(claims))
    assert planned.changes and [claim.field for claim in planned.owned] == ["state_dir", "model_dir", "stack_dir"]
    result = sh(claim_command(claims, planned.owned, str(ARCHIVE)))
    assert result.returncode == 0, result.stderr
    for claim in claims:
        assert f"made {claim.path}, marked {MANAGED_MARKER}" in result.stdout
        assert (Path(claim.path) / MANAGED_MARKER).is_file()
    assert oct(Path(claims[1].path).stat().st_mode & 0o777) == "0o750"
    again = plan(claims, read(claims))
    assert not again.changes and again.owned == []  # converged: the operation yields no command


def test_levels_below_a_system_home_are_made_one_at_a_time(node):
    claims = claims_of(node, model="var/lib/dual-spark-models/big/dsv4")
    result = sh(claim_command(claims, plan(claims, read(claims)).owned, str(ARCHIVE)))
    assert result.returncode == 0, result.stderr
    for level in ("var/lib/dual-spark-models", "var/lib/dual-spark-models/big", "var/lib/dual-spark-models/big/dsv4"):
        assert (node / level / MANAGED_MARKER).is_file()


def test_an_unmarked_directory_is_refused_by_the_command_and_nothing_changes_anywhere(node):
    theirs = node / "srv/theirs"
    theirs.mkdir(mode=0o700)
    (theirs / "thesis.tex").write_text("mine")
    claims = claims_of(node, model="srv/theirs")
    with pytest.raises(OperationError, match=f"{theirs} exists and is not the deploy's"):
        plan(claims, read(claims))
    before = tree(node)
    stale = claim_command(claims, claims, str(ARCHIVE))  # as if the reading had found it marked: the command checks again
    result = sh(stale)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"{theirs} exists and is not the deploy's (no {MANAGED_MARKER}): name another directory in "
                                     f"site.toml (model_dir), or, if it is this deploy's, sudo touch {theirs}/{MANAGED_MARKER}")
    assert tree(node) == before  # not even state_dir, checked before it, was made


def test_a_symbolic_link_is_refused_and_what_it_points_at_untouched(node):
    (node / "var/lib/dual-spark-evil").symlink_to(node / "etc/profile.d")
    claims = claims_of(node, stack="var/lib/dual-spark-evil")
    with pytest.raises(OperationError, match=f"dual-spark-evil is a symbolic link to {node}/etc/profile.d"):
        plan(claims, read(claims))
    before = tree(node)
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and "dual-spark-evil is a symbolic link, lies under one, or is not a directory" in result.stderr
    assert tree(node) == before and not (node / "etc/profile.d" / MANAGED_MARKER).exists()


def test_a_disk_that_is_not_mounted_is_never_made(node):
    claims = claims_of(node, model="srv/disk/models")
    with pytest.raises(OperationError, match=r"srv/disk is not a directory here .*If it is a data disk, mount it"):
        plan(claims, read(claims))
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and "srv/disk is not a directory here" in result.stderr
    assert not (node / "srv/disk").exists() and not (node / "var/lib/dual-spark").exists()


@pytest.mark.as_root
def test_an_earlier_versions_directories_are_adopted_and_said_so(node):
    (node / "var/lib/dual-spark/bin").mkdir(parents=True)
    (node / "var/lib/dual-spark/bin/model_sync.py").write_text("# an earlier version's\n")
    (node / "etc/dual-spark").mkdir()
    for name in ("compose.yaml", "launch.sh"):
        (node / "etc/dual-spark" / name).write_text("x\n")
    claims = [Claim("state_dir", str(node / "var/lib/dual-spark"), "root", "755"),
              Claim("model_dir", str(node / "var/lib/dual-spark/model"), "root", "755"),
              Claim("stack_dir", str(node / "etc/dual-spark"), "root", "755")]
    planned = plan(claims, read(claims))
    assert any(line.startswith(f"Will adopt {node}/var/lib/dual-spark (an earlier version's bin/model_sync.py") for line in planned.lines)
    result = sh(claim_command(claims, planned.owned, str(ARCHIVE)))
    assert result.returncode == 0, result.stderr
    assert f"adopted {node}/etc/dual-spark (an earlier version's compose.yaml and launch.sh), marked" in result.stdout
    assert (node / "etc/dual-spark/compose.yaml").read_text() == "x\n"  # adopted as it is
    assert not plan(claims, read(claims)).changes


@pytest.mark.as_root
def test_an_unmarked_directory_of_another_owner_is_not_adopted_even_with_those_files(node):
    stack = node / "etc/dual-spark"
    stack.mkdir()
    for name in ("compose.yaml", "launch.sh"):
        (stack / name).write_text("x\n")
    os.chown(stack, 65534, 65534)
    claims = claims_of(node)
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and f"{stack} is nobody's, mode 755: a user other than root and {ME} can change it" in result.stderr
    assert not (stack / MANAGED_MARKER).exists() and stack.stat().st_uid == 65534


def test_a_marker_in_a_directory_others_can_write_counts_for_nothing(node):
    shared = node / "srv/shared"
    shared.mkdir()
    (shared / MANAGED_MARKER).write_text("planted\n")
    (shared / "notes").write_text("theirs\n")
    shared.chmod(0o777)
    claims = claims_of(node, model="srv/shared")
    with pytest.raises(OperationError, match=f"{shared} is {ME}'s, mode 777: a user other than root and {ME} can change it"):
        plan(claims, read(claims))
    before = tree(node)
    result = sh(claim_command(claims, claims, str(ARCHIVE)))  # as if the reading had found it the deploy's: the command checks again
    assert result.returncode == 1
    assert f"{shared} is {ME}'s, mode 777: a user other than root and {ME} can change it" in result.stderr
    assert "sudo chown root: " in result.stderr and tree(node) == before


def test_a_directory_under_one_others_can_write_is_never_made(node):
    (node / "srv/open").mkdir()
    (node / "srv/open").chmod(0o777)
    claims = claims_of(node, model="srv/open/models")
    with pytest.raises(OperationError, match=f"{node}/srv/open is {ME}'s, mode 777: a user other than root and {ME}"):
        plan(claims, read(claims))
    before = tree(node)
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and f"{node}/srv/open is {ME}'s, mode 777" in result.stderr
    assert tree(node) == before and not (node / "var/lib/dual-spark").exists()


@pytest.mark.as_root
def test_a_marker_another_user_planted_counts_for_nothing(node):
    """Theirs: a directory of another user's holding a marker of theirs; and a marker of theirs in
    a directory of root's. Neither is the deploy's, and neither is touched."""
    theirs = node / "srv/theirs"
    theirs.mkdir()
    (theirs / MANAGED_MARKER).write_text("planted\n")
    os.chown(theirs / MANAGED_MARKER, 65534, 65534)
    os.chown(theirs, 65534, 65534)
    claims = claims_of(node, model="srv/theirs")
    with pytest.raises(OperationError, match=f"{theirs} is nobody's, mode 755: a user other than root and {ME} can change it"):
        plan(claims, read(claims))
    before = tree(node)
    assert sh(claim_command(claims, claims, str(ARCHIVE))).returncode == 1 and tree(node) == before and theirs.stat().st_uid == 65534
    os.chown(theirs, 0, 0)  # root's now, but the marker is still theirs
    with pytest.raises(OperationError, match=f"{theirs} exists and is not the deploy's"):
        plan(claims, read(claims))
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and f"{theirs} exists and is not the deploy's" in result.stderr
    assert (theirs / MANAGED_MARKER).read_text() == "planted\n" and (theirs / MANAGED_MARKER).stat().st_uid == 65534


@pytest.mark.as_root
def test_a_data_disk_directory_in_another_users_directory_is_refused(node):
    (node / "srv/bob").mkdir()
    os.chown(node / "srv/bob", 65534, 65534)
    claims = claims_of(node, model="srv/bob/models")
    with pytest.raises(OperationError, match=f"{node}/srv/bob is nobody's, mode 755: a user other than root"):
        plan(claims, read(claims))
    result = sh(claim_command(claims, claims, str(ARCHIVE)))
    assert result.returncode == 1 and f"{node}/srv/bob is nobody's, mode 755" in result.stderr
    assert list((node / "srv/bob").iterdir()) == [] and not (node / "var/lib/dual-spark").exists()


# The site's secrets (container_secrets): read by the real SecretFiles command, judged by
# secret_refusal; the command that mounts them guarded by sealed(), the program's, run by a real shell.

def secret_reading(paths: list[str]) -> dict:
    fact = SecretFiles()
    reading = fact.process(sh(fact.command(paths)).stdout.splitlines())
    assert reading["unreadable"] == [], reading
    return reading["files"]


def guarded(secrets: dict[str, str], started: Path) -> subprocess.CompletedProcess:
    """The guard, then what it guards (here: a file made), as stack_up yields them."""
    return sh(StringCommand(sealed(str(ARCHIVE), secrets), "&&", "touch", QuoteString(str(started))))


@pytest.mark.parametrize("plant, refusal", [
    (lambda f: (f.write_text("s3cret\n"), f.chmod(0o644)), f"is {ME}'s, mode 644: a secret must be root's and read by root alone. "
                                                          "Fix: sudo chown root: {f} && sudo chmod 600 {f}"),
    (lambda f: (f.write_text("s3cret\n"), f.chmod(0o640)), f"is {ME}'s, mode 640"),
    (lambda f: f.symlink_to("/etc/passwd"), "is a symbolic link: the deploy mounts a regular file only"),
    (lambda f: f.mkdir(), "is a directory: the deploy mounts a regular file only"),
    (lambda f: f.parent.chmod(0o777), "does not exist here"),
])
def test_a_planted_secret_file_is_refused_by_the_plan_and_by_the_guard(tmp_path, plant, refusal):
    """A file that is not root's alone is refused, naming its owner and mode and the fix, and the
    guarded command does not run. (In a temporary directory, even a file of root's is refused by
    its directories, which the case before it on a real node shows.)"""
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    secret, started = secrets / "wandb", tmp_path / "started"
    plant(secret)
    found = own.secret_refusal("wandb", str(secret), secret_reading([str(secret)]).get(str(secret)))
    assert found is not None and found.startswith(f"container_secrets.wandb = {secret} ")
    assert refusal.replace("{f}", str(secret)) in found
    result = guarded({"wandb": str(secret)}, started)
    assert result.returncode == 1 and not started.exists()
    assert result.stderr.strip() == (f"container_secrets.wandb = {secret} is not a regular file of root's, mode 600 or 400, in "
                                     f"directories only root can change: nothing was started. Fix: sudo chown root: {secret} && "
                                     f"sudo chmod 600 {secret} (and sudo chmod go-w on each directory above it)")


@pytest.mark.as_root
def test_a_secret_in_a_shared_directory_is_refused_by_that_directory(tmp_path):
    """Mode 600 and root's is not enough in a directory another user can change (here /tmp's, or
    the test's own): the file could be swapped."""
    secret = tmp_path / "wandb"
    secret.write_text("s3cret\n")
    secret.chmod(0o600)
    found = own.secret_refusal("wandb", str(secret), secret_reading([str(secret)])[str(secret)])
    assert found is not None and "a user other than root could replace the secret" in found


@pytest.fixture
def sealed_dir():
    """A directory only root can change, every directory above it too (under /run, as on a node)."""
    directory = Path(tempfile.mkdtemp(dir="/run", prefix="dual-spark-secret-test-"))
    yield directory
    shutil.rmtree(directory)


@pytest.mark.as_root
def test_a_root_only_secret_is_taken_and_the_same_file_of_another_owner_refused(sealed_dir, tmp_path):
    secret, started = sealed_dir / "wandb", tmp_path / "started"
    secret.write_text("s3cret\n")
    for mode in (0o600, 0o400):
        secret.chmod(mode)
        assert own.secret_refusal("wandb", str(secret), secret_reading([str(secret)])[str(secret)]) is None
        assert guarded({"wandb": str(secret)}, started).returncode == 0 and started.exists()
        started.unlink()
    os.chown(secret, 65534, 65534)
    found = own.secret_refusal("wandb", str(secret), secret_reading([str(secret)])[str(secret)])
    assert f"{secret} is nobody's, mode 400" in found and f"sudo chown root: {secret} && sudo chmod 600 {secret}" in found
    assert guarded({"wandb": str(secret)}, started).returncode == 1 and not started.exists()
    os.chown(secret, 0, 0)
    inner = sealed_dir / "inner"
    inner.mkdir(mode=0o700)
    (inner / "key").write_text("k\n")
    (inner / "key").chmod(0o600)
    os.chown(inner, 65534, 65534)  # the file root's, its directory another user's: the file could be swapped
    found = own.secret_refusal("key", str(inner / "key"), secret_reading([str(inner / "key")])[str(inner / "key")])
    assert f"is in {inner}, nobody's, mode 700: a user other than root could replace the secret" in found
    assert guarded({"key": str(inner / "key")}, started).returncode == 1 and not started.exists()
