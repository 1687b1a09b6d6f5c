"""Least privilege for every path the site names, on the serving lab pair. A site naming /etc as
the model's source and /etc/profile.d as stack_dir is refused before any host is contacted; paths
that pass the parse but not the node (stack_dir a link to /etc/profile.d, a model_dir that exists
without the deploy's marker, a hub token that is a link to /etc/shadow) are refused on the head
by the step that first touches them, before anything is installed or stopped: the pair still
serves, and no owner, mode or byte under /etc, /root or the deploy user's ~/.cache changed on
either node. Afterwards a normal converge changes nothing."""

import hashlib
import os
import re
import stat
import time
from pathlib import Path

import pytest

from lab.config import DEPLOY_USER, HEAD, LAB_MODEL, WORKER
from lab.hub import Hub
from lab.processes import in_node
from layout import MANAGED_MARKER
from tests.e2e.conftest import generates, pyinfra, site_variant

pytestmark = pytest.mark.end_to_end
WATCHED = ("etc", "root", f"home/{DEPLOY_USER}/.cache")
EVIL_LINK = "/var/lib/dual-spark-evil"  # a link to /etc/profile.d, as stack_dir
UNMARKED = "/srv/dual-spark-unmarked"  # someone's directory, as model_dir
TOKEN = f"/home/{DEPLOY_USER}/.cache/huggingface/token"  # a link to /etc/shadow, as the hub token


def snapshot(node) -> dict[str, str]:
    """Path -> mode, owner and SHA-256 (or a link's target) of everything under the watched trees."""
    found = {}
    for top in WATCHED:
        base = node.root / top
        for directory, dirs, files in os.walk(base):
            for path in [Path(directory), *(Path(directory) / name for name in dirs + files)]:
                info = path.lstat()
                if stat.S_ISLNK(info.st_mode):
                    content = os.readlink(path)
                elif stat.S_ISREG(info.st_mode):
                    content = hashlib.sha256(path.read_bytes()).hexdigest()
                else:
                    content = "-"
                found[str(path.relative_to(node.root))] = f"{info.st_mode:o} {info.st_uid}:{info.st_gid} {content}"
    return found


def differences(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return [f"{path}: {before.get(path)} -> {after.get(path)}" for path in sorted(before.keys() | after.keys())
            if before.get(path) != after.get(path)]


def container(node) -> str:
    """The vLLM container's ID and start time: another after a restart."""
    return in_node(node.dir, "docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}}", "dual-spark-vllm",
                   capture_output=True).stdout.strip()


def sh(node, script: str) -> None:
    in_node(node.dir, "sh", "-ec", script)


def the_deploys_own(node, path: str) -> bool:
    """A directory this test's runs made on a node: it holds the marker and nothing else."""
    local = node.root / path.lstrip("/")
    return local.is_dir() and not local.is_symlink() and [p.name for p in local.iterdir()] == [MANAGED_MARKER]


def test_paths_the_site_names_are_never_taken_as_root(converged, tmp_path):
    started = time.monotonic()
    profile_d = HEAD.root / "etc/profile.d"
    assert profile_d.is_dir() and not (profile_d / MANAGED_MARKER).exists()
    assert not (HEAD.root / EVIL_LINK.lstrip("/")).exists() and not (HEAD.root / UNMARKED.lstrip("/")).exists()
    before = {node.name: snapshot(node) for node in (HEAD, WORKER)}
    assert all({"etc/shadow", "etc/profile.d", "etc/dual-spark/compose.yaml", "root"} <= set(found) for found in before.values())
    running = {node.name: container(node) for node in (HEAD, WORKER)}
    token = HEAD.root / TOKEN.lstrip("/")
    kept = token.with_name("token.kept-by-test-47")  # a token an earlier test left, put back at the end
    made: list[str] = []  # how to remove what this test made on the head, in order
    try:
        # (a) Refused by the parse, before any host is contacted, naming both fields.
        (tmp_path / "a").mkdir()
        result = pyinfra("-y", task="tasks/profile.py",
                         site=site_variant(tmp_path / "a", stack_dir="/etc/profile.d",
                                        model={"path": "/etc", "served_name": "tiny", "tokenizer_mode": "auto"}))
        assert result.returncode != 0 and "no host was contacted" in result.stdout, result.stdout
        assert "model.path = '/etc'" in result.stdout and "stack_dir = '/etc/profile.d'" in result.stdout, result.stdout
        assert "Connecting to hosts" not in result.stdout and "Beginning operation run" not in result.stdout, result.stdout

        # (b) Past the parse, refused on the head by the first step that touches them.
        sh(HEAD, f"ln -s /etc/profile.d {EVIL_LINK}")
        made.append(f"rm {EVIL_LINK}")
        (tmp_path / "b1").mkdir()
        result = pyinfra("-y", task="tasks/profile.py", site=site_variant(tmp_path / "b1", stack_dir=EVIL_LINK))
        assert result.returncode != 0, result.stdout
        assert f"spark-head: {EVIL_LINK} is a symbolic link to /etc/profile.d: the deploy follows no link" in result.stdout, result.stdout
        assert not (profile_d / MANAGED_MARKER).exists()

        sh(HEAD, f"mkdir -m 700 {UNMARKED} && echo mine > {UNMARKED}/thesis.tex")
        made.append(f"rm -r {UNMARKED}")
        unmarked = HEAD.root / UNMARKED.lstrip("/")
        theirs = (unmarked.stat().st_mode, unmarked.stat().st_uid, sorted(p.name for p in unmarked.iterdir()))
        (tmp_path / "b2").mkdir()
        result = pyinfra("-y", task="tasks/profile.py", site=site_variant(tmp_path / "b2", model_dir=UNMARKED))
        assert result.returncode != 0, result.stdout
        assert (f"spark-head: {UNMARKED} exists and is not the deploy's (no {MANAGED_MARKER}): name another directory in "
                f"site.toml (model_dir), or, if it is this deploy's, sudo touch {UNMARKED}/{MANAGED_MARKER}") in result.stdout, result.stdout
        assert (unmarked.stat().st_mode, unmarked.stat().st_uid, sorted(p.name for p in unmarked.iterdir())) == theirs
        assert (unmarked / "thesis.tex").read_text() == "mine\n"

        for directory in (Path(TOKEN).parent.parent, Path(TOKEN).parent):  # ~/.cache, ~/.cache/huggingface
            if not (HEAD.root / str(directory).lstrip("/")).exists():
                sh(HEAD, f"mkdir {directory} && chown {DEPLOY_USER}: {directory}")
                made.insert(0, f"rmdir {directory}")
        if token.exists() or token.is_symlink():
            token.rename(kept)
        sh(HEAD, f"ln -s /etc/shadow {TOKEN} && chown -h {DEPLOY_USER}: {TOKEN}")
        made.insert(0, f"rm {TOKEN}")
        with Hub(HEAD.root / LAB_MODEL.lstrip("/"), repo="lab/tiny-llama") as hub:
            (tmp_path / "b3").mkdir()
            site = site_variant(tmp_path / "b3", hf_endpoint=hub.endpoint, hf_endpoint_insecure_http=True,
                             model={"repo": "lab/tiny-llama", "revision": hub.commit, "served_name": "tiny", "tokenizer_mode": "auto",
                                    "tool_call_parser": "", "reasoning_parser": ""})
            result = pyinfra("-y", task="tasks/profile.py", site=site)
            assert result.returncode != 0, result.stdout
            assert ("spark-head: hf_token_file = ~/.cache/huggingface/token is a symbolic link: the hub token must be a regular "
                    f"file owned by {DEPLOY_USER}") in result.stdout, result.stdout
            assert hub.requests == []  # nothing was asked of the hub, let alone with /etc/shadow as the token
        shadow = (HEAD.root / "etc/shadow").read_text()
        assert not any(line and line in result.stdout for line in shadow.splitlines())

        # Nothing was stopped: the same containers, the pair serves.
        assert {node.name: container(node) for node in (HEAD, WORKER)} == running
        assert generates()
    finally:
        for command in made:  # the token before its directories
            sh(HEAD, command)
        if kept.exists() or kept.is_symlink():
            kept.rename(token)
        for path in (EVIL_LINK, UNMARKED):  # the worker made its own, marked, in the step that refused on the head
            if the_deploys_own(WORKER, path):
                sh(WORKER, f"rm -rf {path}")

    # (c) No owner, mode or byte under /etc, /root or ~/.cache changed on either node.
    for node in (HEAD, WORKER):
        changed = differences(before[node.name], snapshot(node))
        assert not changed, f"{node.name}: " + "\n".join(changed[:20])
    for path in (EVIL_LINK, UNMARKED):
        assert not (WORKER.root / path.lstrip("/")).exists(), f"the worker keeps {path}: not the deploy's alone"

    # A normal converge afterwards changes nothing.
    result = pyinfra("-y")
    assert result.returncode == 0, result.stdout
    assert re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", result.stdout), result.stdout
    assert {node.name: container(node) for node in (HEAD, WORKER)} == running
    print(f"test_47: {time.monotonic() - started:.0f} s after the converged fixture")


OTHER = "mallory"  # another local user of the head, with a shell and no sudo
SHARED = "/srv/dual-spark-shared"  # a directory of theirs, marked by them, as model_dir


def test_another_local_user_gets_no_way_in(converged, tmp_path):
    """Another local user of the head plants what a careless deploy would take: a directory of
    theirs with the deploy's marker, and pyinfra's predictable temporary upload file (a hash of
    the destination under /tmp, mode 666) for a file the next run replaces. The first is refused
    naming its owner; the second is never opened: the upload goes through the deploy user's
    private directory. Nothing of theirs changes."""
    sh(HEAD, f"id -u {OTHER} >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh {OTHER}")
    limits = HEAD.root / "etc/security/limits.d/99-rdma.conf"
    shipped = Path("files/host_prep/99-rdma.conf").read_text()
    assert limits.read_text() == shipped
    planted = f"/tmp/pyinfra-{hashlib.sha1(b'/etc/security/limits.d/99-rdma.conf').hexdigest()}"
    try:
        sh(HEAD, f"runuser -u {OTHER} -- sh -ec 'umask 0; echo theirs > {planted}; chmod 666 {planted}'")
        sh(HEAD, f"install -d -m 755 -o {OTHER} -g {OTHER} {SHARED} && runuser -u {OTHER} -- sh -ec "
                 f"'echo planted > {SHARED}/{MANAGED_MARKER}; echo theirs > {SHARED}/notes'")
        theirs = snapshot_of(HEAD, [planted, SHARED, f"{SHARED}/{MANAGED_MARKER}", f"{SHARED}/notes"])

        (tmp_path / "a").mkdir()
        result = pyinfra("-y", task="tasks/runtime.py", site=site_variant(tmp_path / "a", model_dir=SHARED))
        assert result.returncode != 0, result.stdout
        assert f"spark-head: {SHARED} is {OTHER}'s, mode 755: a user other than root and {DEPLOY_USER} can change it" in result.stdout, \
            result.stdout

        limits.write_text(shipped + "# changed by hand\n")
        result = pyinfra("-y", task="tasks/host_prep.py")
        assert result.returncode == 0, result.stdout
        assert limits.read_text() == shipped
        assert snapshot_of(HEAD, ["/run/dual-spark/upload"]) == [f"/run/dual-spark/upload 700 {DEPLOY_USER} directory"]
        assert snapshot_of(HEAD, [planted, SHARED, f"{SHARED}/{MANAGED_MARKER}", f"{SHARED}/notes"]) == theirs
        assert len(theirs) == 7 and in_node(HEAD.dir, "cat", planted, capture_output=True).stdout == "theirs\n"
    finally:
        sh(HEAD, f"rm -rf {planted} {SHARED}")
        if the_deploys_own(WORKER, SHARED):  # the worker made its own, marked, in the step that refused on the head
            sh(WORKER, f"rm -rf {SHARED}")


def snapshot_of(node, paths: list[str]) -> list[str]:
    """Each path's mode, owner and kind, read inside the node (its own /tmp and /run), and a
    file's SHA-256."""
    script = 'for p; do stat -c "%n %a %U %F" -- "$p"; if [ -f "$p" ]; then sha256sum -- "$p"; fi; done'
    return in_node(node.dir, "sh", "-c", script, "-", *paths, capture_output=True).stdout.splitlines()


SECRET = "/etc/dual-spark/secrets/wandb"  # a container secret of the site's, on every node


def test_a_container_secret_is_mounted_from_a_root_only_file_and_never_shown(converged, tmp_path):
    """container_secrets on the pair: a file another user owns on the worker is refused on the
    head before anything stops; once it is root's, mode 600, on both nodes, the stacks restart
    with it read-only at /run/secrets/wandb, and its text is in no output, stack file, environment
    or label. The site without it then puts the stacks back."""
    value = "wandb-" + hashlib.sha256(str(tmp_path).encode()).hexdigest()[:24]
    for node in (HEAD, WORKER):
        sh(node, f"install -d -m 755 {Path(SECRET).parent} && umask 077 && printf %s {value} > {SECRET}")
    sh(WORKER, f"id -u {OTHER} >/dev/null 2>&1 || useradd --no-create-home --shell /bin/sh {OTHER}; chown {OTHER}: {SECRET}")
    running = {node.name: container(node) for node in (HEAD, WORKER)}
    site = site_variant(tmp_path, container_secrets={"wandb": SECRET})
    try:
        refused = pyinfra("-y", task="tasks/serving.py", site=site)
        assert refused.returncode != 0, refused.stdout
        assert (f"spark-worker: container_secrets.wandb = {SECRET} is {OTHER}'s, mode 600: a secret must be root's and read by root "
                f"alone. Fix: sudo chown root: {SECRET} && sudo chmod 600 {SECRET}") in refused.stdout, refused.stdout
        assert {node.name: container(node) for node in (HEAD, WORKER)} == running  # nothing was stopped
        sh(WORKER, f"chown root: {SECRET}")
        served = pyinfra("-y", task="tasks/serving.py", site=site)
        assert served.returncode == 0, served.stdout
        for node in (HEAD, WORKER):
            inside = in_node(node.dir, "docker", "exec", "dual-spark-vllm", "cat", "/run/secrets/wandb", capture_output=True).stdout
            assert inside == value, node.name
            shown = in_node(node.dir, "docker", "inspect", "dual-spark-vllm", capture_output=True).stdout
            assert SECRET in shown and "/run/secrets/wandb" in shown and value not in shown, node.name
            assert value not in (node.root / "etc/dual-spark/compose.yaml").read_text()
        assert value not in refused.stdout + served.stdout
        assert generates()
    finally:
        back = pyinfra("-y", task="tasks/serving.py")
        for node in (HEAD, WORKER):
            sh(node, f"rm -rf {Path(SECRET).parent}")
    assert back.returncode == 0, back.stdout
    assert generates()
