"""The runtime's shell commands run by a real shell, with stand-ins that record their arguments
for the programs that need a node (docker, chown) and the real helpers for the rest."""

import json
import os
import pwd
import subprocess
import sys
from pathlib import Path

import pytest

import programs
from cluster import Image, Model
from facts.runtime import ImageState
from files.dual_spark.smoke import SMOKE
from layout import store_entry
from operations import runtime
from operations.runtime import fetch, paths
from tests.fake_host import args_key, run_operation
from tests.programs import ARCHIVE

REPO = Path(__file__).resolve().parents[1]
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
HUB_MODEL = Model("x", "auto", repo="org/model", revision="0" * 40)
IMAGE = Image("dual-spark/x:1", ["auto"], "/opt/env/bin/python", "vllm", {})
NO_CONTAINER = {"mounts": [], "env": {}}
# The deploy user of the fetch and copy tests: this test's own, whose directories the claim checks trust.
ME = pwd.getpwuid(os.getuid()).pw_name


def run(command, tmp_path: Path, *stand_ins: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """The command in sh, the programs named replaced by recorders; its result and their calls."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for name in stand_ins:
        (directory / name).write_text(RECORDER)
        (directory / name).chmod(0o755)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}", "RECORD": str(record)}
    result = subprocess.run(["sh", "-c", command.get_raw_value()], env=env, capture_output=True, text=True, timeout=60)
    return result, [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


# sudo -n -u USER CMD... as the commands use it: recorded, then CMD run (as this test's user: the
# deploy user of these tests); getent passwd ME: the deploy user's home is $HOME_OF_SPARK.
AS_USER = f"""#!{sys.executable}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps(["sudo", *args]) + "\\n")
while args[0] in ("-n", "-u"):
    args = args[1:] if args[0] == "-n" else args[2:]
os.execvp(args[0], args)
"""
GETENT = f"""#!/bin/sh
[ "$1 $2" = "passwd {ME}" ] && echo "{ME}:x:1000:1000::$HOME_OF_SPARK:/bin/sh"
"""


def on_the_head(command, tmp_path: Path, home: Path, *stand_ins: str) -> tuple[subprocess.CompletedProcess, list[list[str]]]:
    """run(), with sudo -u and getent standing in for the head's (the deploy user is this test's)."""
    directory = tmp_path / "bin"
    directory.mkdir(exist_ok=True)
    for name, text in (("sudo", AS_USER), ("getent", GETENT)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    os.environ["HOME_OF_SPARK"] = str(home)
    try:
        return run(command, tmp_path, *stand_ins)
    finally:
        del os.environ["HOME_OF_SPARK"]


def claimed_dir(path: Path) -> Path:
    """A model store as the first step leaves it: made and marked."""
    path.mkdir(parents=True)
    (path / ".dual-spark-managed").write_text("the deploy's\n")
    return path


ROOM = ["spark-head=1099511627776:0", "spark-worker=1099511627776:0"]  # a TiB free on each node, nothing of the model


def hub_fetch(store: Path, token_file: str, container: dict = NO_CONTAINER):
    """The fetch of HUB_MODEL into its directory of the store, with the programs' archive this
    repository builds; the command, and that directory."""
    entry = store_entry(str(store), HUB_MODEL.source)
    return fetch(HUB_MODEL, ME, {**paths("/s", entry), "programs": str(ARCHIVE)}, str(store), entry, IMAGE, "http://hub", token_file, container, ROOM).args[0], entry


def test_a_hub_token_path_with_spaces_reaches_docker_as_one_argument(tmp_path):
    home = tmp_path / "home of spark"
    token = home / "my tokens" / "hf token"
    token.parent.mkdir(parents=True)
    token.write_text("hf_secret")
    token.chmod(0o644)
    command, entry = hub_fetch(claimed_dir(tmp_path / "model dir"), "~/my tokens/hf token")
    result, calls = on_the_head(command, tmp_path, home, "docker", "chown")
    assert result.returncode == 0, result.stderr
    assert [call[0] for call in calls] == ["sudo", "docker", "chown"]
    assert calls[0][:4] == ["sudo", "-n", "-u", ME]  # the token is checked and made 600 by its user, not root
    assert Path(entry).stat().st_uid == os.getuid() and Path(entry, ".dual-spark-managed").is_file()  # the user's, marked
    docker = calls[1]
    assert docker[docker.index(f"{token}:/run/secrets/hf_token:ro") - 1] == "-v"
    assert f"{entry}:/model" in docker and "hf_secret" not in json.dumps(calls)
    assert docker[docker.index("--room") + 1] == ROOM[0] and docker[docker.index("--store") + 1] == str(tmp_path / "model dir")
    assert oct(token.stat().st_mode & 0o777) == "0o600"
    assert calls[2] == ["chown", "-R", f"{ME}:", entry]  # the container wrote as root: given back, in the same command


def test_without_a_token_file_docker_gets_no_token_mount(tmp_path):
    command, _ = hub_fetch(claimed_dir(tmp_path / "model"), "~/absent")
    result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
    assert result.returncode == 0, result.stderr
    docker = calls[1]
    assert not any("hf_token:ro" in arg for arg in docker) and docker[-3:] == ["/run/secrets/hf_token", "--progress", "10"]


def env_of(docker: list[str]) -> list[str]:
    """The NAME=value of each -e of a recorded docker call, in order."""
    return [docker[i + 1] for i, arg in enumerate(docker[:-1]) if arg == "-e"]


def test_the_fetch_keeps_xet_out_of_the_model_directory_and_its_own_settings_from_the_site(tmp_path):
    """Xet is on (no HF_HUB_DISABLE_XET); its directory is the container's, not under /model, and
    its chunk cache is off. The site's container_env cannot move either (each name given once,
    the fetch's), and what else it sets applies: HF_HUB_DISABLE_XET=1 falls back to plain HTTP."""
    store = claimed_dir(tmp_path / "model")
    site = {"mounts": [], "env": {"HF_XET_CACHE": "/model/xet", "HF_HOME": "/cache/hf", "HF_HUB_DISABLE_XET": "1"}}
    for container, disabled in ((NO_CONTAINER, []), (site, ["HF_HUB_DISABLE_XET=1"])):
        command, _ = hub_fetch(store, "~/absent", container)
        result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
        assert result.returncode == 0, result.stderr
        env = env_of(next(call for call in calls if call[0] == "docker"))
        names = [item.partition("=")[0] for item in env]
        assert len(names) == len(set(names)), env
        assert "HF_XET_CACHE=/tmp/hf-xet" in env and "HF_XET_CHUNK_CACHE_SIZE_BYTES=0" in env
        assert "HF_HOME=/model/.cache/huggingface" in env
        assert [item for item in env if item.startswith("HF_HUB_DISABLE_XET")] == disabled
        (tmp_path / "record").unlink()


def test_a_token_that_is_a_link_is_refused_never_mounted_and_what_it_names_untouched(tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("root:$6$hash")
    secret.chmod(0o640)
    (tmp_path / ".cache").mkdir()
    (tmp_path / ".cache" / "token").symlink_to(secret)
    command, _ = hub_fetch(claimed_dir(tmp_path / "model"), "~/.cache/token")
    result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
    assert result.returncode == 1
    assert f"hf_token_file = ~/.cache/token is a symbolic link, not a regular file, or not owned by {ME}" in result.stderr
    assert f"Fix: as {ME}, replace it with the token itself" in result.stderr
    assert [call[0] for call in calls] == ["sudo"]  # no docker, no chown
    assert oct(secret.stat().st_mode & 0o777) == "0o640" and "$6$hash" not in result.stdout + result.stderr


@pytest.mark.as_root
def test_a_token_of_another_owner_is_refused(tmp_path):
    token = tmp_path / "token"
    token.write_text("hf_theirs")
    os.chown(token, 65534, 65534)
    command, _ = hub_fetch(claimed_dir(tmp_path / "model"), "~/token")
    result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
    assert result.returncode == 1 and "hf_token_file = ~/token is a symbolic link, not a regular file, or not owned" in result.stderr
    assert [call[0] for call in calls] == ["sudo"] and oct(token.stat().st_mode & 0o777) == "0o644"


def test_a_fetch_into_a_directory_the_deploy_did_not_claim_is_refused(tmp_path):
    model_dir = tmp_path / "theirs"
    model_dir.mkdir()
    command, _ = hub_fetch(model_dir, "~/absent")
    result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
    assert result.returncode == 1 and f"model_dir {model_dir} is not a directory the deploy claimed" in result.stderr
    assert not [call for call in calls if call[0] in ("docker", "chown")] and list(model_dir.iterdir()) == []


def test_a_fetch_into_a_store_directory_someone_else_made_is_refused(tmp_path):
    store = claimed_dir(tmp_path / "model")
    command, entry = hub_fetch(store, "~/absent")
    Path(entry).mkdir()  # named as the store names its directories, but without the marker
    result, calls = on_the_head(command, tmp_path, tmp_path, "docker", "chown")
    assert result.returncode == 1 and f"{entry} exists and is not the deploy's (no .dual-spark-managed)" in result.stderr
    assert not [call for call in calls if call[0] in ("docker", "chown")] and list(Path(entry).iterdir()) == []


def copying(tmp_path: Path, model_dir: Path, config: bool = True, rooms: list[str] = ROOM):
    """The copy from a directory on the head into its directory of the store ``model_dir``, with
    the programs' archive this repository builds."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    if config:
        (source / "config.json").write_text("{}")
    archive = tmp_path / "dual-spark.pyz"
    archive.write_bytes(programs.built())
    entry = store_entry(str(model_dir), {"path": str(source)})
    where = {**paths("/s", entry), "programs": str(archive)}
    return fetch(Model("x", "auto", path=str(source)), ME, where, str(model_dir), entry, IMAGE, "http://hub", "~/t",
                 NO_CONTAINER, rooms).args[0]


def test_copying_into_a_directory_the_deploy_did_not_make_is_refused_and_touches_nothing(tmp_path):
    model_dir = tmp_path / "home"
    model_dir.mkdir()
    (model_dir / "thesis.tex").write_text("mine")
    result, calls = on_the_head(copying(tmp_path, model_dir), tmp_path, tmp_path, "rsync", "chown")
    assert result.returncode == 1 and f"model_dir {model_dir} is not a directory the deploy claimed" in result.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == ["thesis.tex"] and calls == []  # nothing read, copied or re-owned


def test_copying_through_a_link_to_a_directory_is_refused(tmp_path):
    target = claimed_dir(tmp_path / "elsewhere")
    (tmp_path / "model").symlink_to(target)
    result, calls = on_the_head(copying(tmp_path, tmp_path / "model"), tmp_path, tmp_path, "rsync", "chown")
    assert result.returncode == 1 and "is not a directory the deploy claimed" in result.stderr and calls == []


def test_copying_checks_the_source_as_the_deploy_user_then_copies_as_that_user(tmp_path):
    model_dir = claimed_dir(tmp_path / "model")
    result, calls = on_the_head(copying(tmp_path, model_dir), tmp_path, tmp_path, "rsync", "chown")
    assert result.returncode == 0, result.stderr
    source = tmp_path / "source"
    entry = store_entry(str(model_dir), {"path": str(source)})
    assert calls[0] == ["sudo", "-n", "-u", ME, "test", "-f", f"{source}/config.json"]
    assert calls[1][:4] + calls[1][5:8] == ["sudo", "-n", "-u", ME, str(tmp_path / "dual-spark.pyz"), "sync", "room"]  # room first
    assert Path(entry).stat().st_uid == os.getuid() and Path(entry, ".dual-spark-managed").is_file()  # made the user's, marked
    assert calls[2:] == [["sudo", "-n", "-u", ME, "rsync", "-a", "--delete", "--exclude", "/.dual-spark-*", "--info=progress2",
                          "--no-inc-recursive", f"{source}/", f"{entry}/"],
                         ["rsync", "-a", "--delete", "--exclude", "/.dual-spark-*", "--info=progress2", "--no-inc-recursive",
                          f"{source}/", f"{entry}/"]]  # and no chown: the store's directory is the user's already
    assert result.stdout.splitlines()[-1].startswith(f"copying the model from {source}: done in ")


def test_a_source_that_is_no_model_directory_is_refused_before_a_byte_moves(tmp_path):
    model_dir = claimed_dir(tmp_path / "model")
    result, calls = on_the_head(copying(tmp_path, model_dir, config=False), tmp_path, tmp_path, "rsync", "chown")
    assert result.returncode == 1
    assert f"model.path = {tmp_path / 'source'} is not a model directory {ME} may read (no config.json there" in result.stderr
    assert [call[1:5] for call in calls] == [["-n", "-u", ME, "test"]] and sorted(p.name for p in model_dir.iterdir()) == [
        ".dual-spark-managed"]


def test_a_source_larger_than_a_nodes_room_is_refused_before_a_byte_moves(tmp_path):
    """The source's size (7 bytes of weights, 2 of config) against each node's free space, less
    what it has of it: the worker with 8 bytes free is refused, named, with both numbers."""
    model_dir = claimed_dir(tmp_path / "model")
    rooms = ["spark-head=1099511627776:0", "spark-worker=8:0"]
    result, calls = on_the_head(copying(tmp_path, model_dir, rooms=rooms), tmp_path, tmp_path, "rsync", "chown")
    assert result.returncode == 1
    assert (f"spark-worker: {model_dir} has 0.0 MiB free; the model in {tmp_path / 'source'} needs 0.0 MiB more. Fix: free space "
            "there, or set model_dir in site.toml to a disk with room") in result.stderr
    assert [call[6:9] for call in calls[1:]] == [["sync", "room", "--source"]]  # no directory made, nothing copied
    assert sorted(p.name for p in model_dir.iterdir()) == [".dual-spark-managed"]
    result, _ = on_the_head(copying(tmp_path / "again", claimed_dir(tmp_path / "again" / "model"), rooms=["spark-worker=8:2"]),
                            tmp_path / "again", tmp_path, "rsync", "chown")
    assert result.returncode == 0, result.stderr  # it has 2 bytes of it already: the 7 it lacks fit in 8


def test_copying_into_the_claimed_directory_keeps_its_marker(tmp_path):
    model_dir = claimed_dir(tmp_path / "model")
    result, _ = on_the_head(copying(tmp_path, model_dir), tmp_path, tmp_path, "chown")
    assert result.returncode == 0, result.stderr
    entry = Path(store_entry(str(model_dir), {"path": str(tmp_path / "source")}))
    assert sorted(p.name for p in entry.iterdir()) == [".dual-spark-managed", "config.json", "model.safetensors"]


# -- the chain's hops, driven from the head: three levels of shell and ssh --------------------

SUDO = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
while args[0] in ("-n", "-u"):
    args = args[1:] if args[0] == "-n" else args[2:]
os.execvp(args[0], args)
"""
SSH = f"""#!{sys.executable}
# ssh at the process boundary: the remote command (its words joined, as ssh sends them) runs
# here in sh, with NODE naming the node it runs on; 10.0.0.3 does not answer (a rail without link).
import json, os, sys
args = sys.argv[1:]
while args[0] in ("-o", "-c"):
    args = args[2:]
target, command = args[0], " ".join(args[1:])
if target.endswith("@10.0.0.3"):
    sys.exit(255)
if command != "true":
    with open(os.environ["RECORD"], "a") as record:
        record.write(json.dumps(["ssh", os.environ.get("NODE", "head"), target]) + "\\n")
os.environ["NODE"] = target.split("@")[1]
# each node its own working directory (a relative state_dir is each node's own), named after the
# host of its rails' last octet, the head's the one the test starts in
node = ("spark-head", "spark-worker1", "spark-worker2", "spark-worker3")[int(os.environ["NODE"].split(".")[-1]) - 1]
os.makedirs(os.path.join(os.environ["NODES"], node), exist_ok=True)
os.chdir(os.path.join(os.environ["NODES"], node))
os.execvp("sh", ["sh", "-c", command])
"""
DOCKER = f"""#!{sys.executable}
import json, os, sys, time
args, node, status = sys.argv[1:], os.environ.get("NODE", "head"), 0
call = ["docker", node, *args]
if args[0] == "save":
    sys.stdout.write("the layers of " + args[1])
elif args[0] == "load":
    call.append(sys.stdin.read())
elif args[:3] == ["image", "inspect", "-f"]:
    print(os.environ.get("IMAGE_ID", "sha256:" + "ab" * 32) if "Id" in args[3] else "20")
elif args[0] == "run":  # a smoke test, its start and end times kept apart; vLLM does not import on NO_VLLM
    with open(os.environ["RECORD"] + ".times", "a") as times:
        times.write(f"{{node}} start {{time.monotonic()}}\\n")
    began = time.monotonic()  # with AT_ONCE=n, it ends once n tests have started (or after 5 s: one at a time)
    while time.monotonic() - began < 5 and open(os.environ["RECORD"] + ".times").read().count(" start ") < int(os.environ.get("AT_ONCE", 0)):
        time.sleep(0.05)
    with open(os.environ["RECORD"] + ".times", "a") as times:
        times.write(f"{{node}} end {{time.monotonic()}}\\n")
    if node in os.environ.get("NO_VLLM", "").split():
        print("Traceback (most recent call last):\\nModuleNotFoundError: No module named 'vllm'", file=sys.stderr)
        status = 1
    else:
        print("INFO a log line of vLLM's")
        print(json.dumps(["method", "num_speculative_tokens"]))
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps(call) + "\\n")
sys.exit(status)
"""


def chain_case(fact: str, args: dict, fact_args: dict, head: dict, worker1: dict, worker2: dict, worker3: dict | None = None) -> dict:
    """Four nodes: the head, worker1, worker2 and worker3 reading as given, worker3 by default as
    worker1 (it has it)."""
    key = args_key(fact_args)
    readings = {"spark-head": head, "spark-worker1": worker1, "spark-worker2": worker2, "spark-worker3": worker3 or worker1}
    return {"site": "four", "host": "spark-head", "args": args, "facts": {name: {fact: {key: reading}} for name, reading in readings.items()}}


def the_chain(tmp_path: Path, fact: str, args: dict, fact_args: dict, *readings: dict, before=None, env: dict | None = None):
    """The operation's commands, run one after another by sh on the "head" with the stand-ins,
    each node in its own directory under tmp_path/nodes (``before`` called with it first), up to
    the first that fails, as pyinfra runs them; the commands, their results and the calls recorded."""
    commands, _ = run_operation(getattr(runtime, "runtime_image" if fact == "runtime.ImageState" else "model_on_every_node"),
                                chain_case(fact, args, fact_args, *readings))
    directory = tmp_path / "bin"
    directory.mkdir()
    for name, text in (("sudo", SUDO), ("ssh", SSH), ("docker", DOCKER)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    nodes = tmp_path / "nodes"
    (nodes / "spark-head").mkdir(parents=True)
    if before:
        before(nodes)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}", "RECORD": str(record), "NODES": str(nodes), **(env or {})}
    results = []
    for command in commands:
        text = command[2] if command[:2] == ["function", "streamed"] else command
        results.append(subprocess.run(["sh", "-c", text], env=env, cwd=nodes / "spark-head", capture_output=True, text=True, timeout=60))
        if results[-1].returncode != 0:
            break
    return commands, results, [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def hop_from_worker1(tmp_path: Path, fact: str, args: dict, fact_args: dict, head: dict, worker1: dict, worker2: dict):
    """The operation's one command (worker1 sends to worker2), run by sh on the "head" with the
    stand-ins; its result and the calls recorded."""
    commands, results, calls = the_chain(tmp_path, fact, args, fact_args, head, worker1, worker2)
    assert len(commands) == 1 and commands[0][:2] == ["function", "streamed"], commands
    return results[0], calls


def with_programs(nodes: Path, *names: str) -> None:
    """The programs' archive in the (relative) state directory of the nodes named."""
    for name in names:
        (nodes / name / "state/bin").mkdir(parents=True)
        (nodes / name / "state/bin/dual-spark.pyz").write_bytes(programs.built())


IMAGE_ID = "sha256:" + "ab" * 32
HAVE = {"id": IMAGE_ID, "size": 20, "smoke_tested": IMAGE_ID, "speculative_keys": ["method"], "unreadable": []}
UNTESTED = {**HAVE, "smoke_tested": None, "speculative_keys": None}
LACKS = {**UNTESTED, "id": None}
IMAGE_ARGS = {"image_name": "x", "image": IMAGE, "user": "spark", "state_dir": "state", "container": NO_CONTAINER}
IMAGE_FACT = {"tag": IMAGE.tag, "marker": runtime.smoke_marker("state", IMAGE.tag)}  # relative: each node's own
MARKER = f"state/runtime/{IMAGE_ID}"  # the file that marker names, under each node's directory


def test_an_image_hop_from_a_worker_streams_from_it_to_the_next_and_tests_it_there(tmp_path):
    """worker1 has the image, worker2 lacks it: the head has worker1 stream it to worker2 (over
    worker2's second rail: its first does not answer), the IDs compared; then, in the next
    command, worker2 is smoke-tested."""
    commands, results, calls = the_chain(tmp_path, "runtime.ImageState", IMAGE_ARGS, IMAGE_FACT, HAVE, HAVE, LACKS,
                                         before=lambda nodes: with_programs(nodes, "spark-head", "spark-worker1", "spark-worker2"))
    assert len(commands) == 2 and commands[0][:2] == ["function", "streamed"], commands
    hop, smoke = results
    assert hop.returncode == 0, hop.stderr
    assert "spark-worker2 does not answer over SSH at 10.0.0.3: trying the next rail" in hop.stderr
    assert hop.stdout.startswith(f"streaming {IMAGE.tag} to spark-worker2: 28 B in "), hop.stdout
    assert smoke.returncode == 0, smoke.stderr
    assert ["ssh", "head", "spark@10.0.0.2"] in calls and ["ssh", "10.0.0.2", "spark@10.0.1.3"] in calls
    assert ["docker", "10.0.0.2", "save", IMAGE.tag] in calls
    assert ["docker", "10.0.1.3", "load", f"the layers of {IMAGE.tag}"] in calls
    run_on_worker2 = [call for call in calls if call[:3] == ["docker", "10.0.1.3", "run"]]
    assert len(run_on_worker2) == 1 and run_on_worker2[0][-3:] == [IMAGE.tag, "-c", SMOKE]
    assert [call[1] for call in calls if call[0] == "docker" and call[2] == "run"] == ["10.0.1.3"]  # the only one tested
    nodes = tmp_path / "nodes"
    marker = nodes / "spark-worker2" / MARKER
    assert marker.read_text() == f'{IMAGE_ID}\n["method", "num_speculative_tokens"]\n'  # the fields, without vLLM's log
    assert not any(call[:2] == ["docker", "head"] for call in calls)  # the head's link stays free


def test_the_smoke_tests_run_at_once_and_one_that_fails_names_its_node_the_others_recorded(tmp_path):
    """The head untested, worker2 lacking the image, worker3 untested, and vLLM does not import on
    worker3: the hop runs, then the three smoke tests at the same time, each on its own node; the
    step fails naming worker3 with its error, and the head and worker2 have their markers, worker3
    none (it is tested again next run)."""
    commands, results, calls = the_chain(tmp_path, "runtime.ImageState", IMAGE_ARGS, IMAGE_FACT, UNTESTED, HAVE, LACKS, UNTESTED,
                                         before=lambda nodes: with_programs(nodes, "spark-head", "spark-worker1", "spark-worker2", "spark-worker3"),
                                         env={"NO_VLLM": "10.0.0.4", "AT_ONCE": "3"})
    assert len(commands) == 2 and len(results) == 2, commands
    hop, smoke = results
    assert hop.returncode == 0, hop.stderr
    assert smoke.returncode == 1, smoke.stderr
    assert f"the smoke test of {IMAGE.tag} (import vllm) failed on spark-worker3:" in smoke.stderr
    assert "spark-worker3: ModuleNotFoundError: No module named 'vllm'" in smoke.stderr
    assert smoke.stderr.splitlines()[-1] == (f"the smoke test of {IMAGE.tag} (import vllm) failed on: spark-worker3 "
                                             "(tested again there next run; each node that passed is recorded)")
    assert "failed on spark-head" not in smoke.stderr and "failed on spark-worker2" not in smoke.stderr
    assert "spark-worker2: spark-worker2 does not answer over SSH at 10.0.0.3: trying the next rail" in smoke.stderr
    nodes = tmp_path / "nodes"
    for node in ("spark-head", "spark-worker2"):
        assert (nodes / node / MARKER).read_text() == f'{IMAGE_ID}\n["method", "num_speculative_tokens"]\n', node
    assert not (nodes / "spark-worker3" / MARKER).exists() and not (nodes / "spark-worker1" / MARKER).exists()
    assert sorted(call[1] for call in calls if call[0] == "docker" and call[2] == "run") == ["10.0.0.4", "10.0.1.3", "head"]
    times = [line.split() for line in (tmp_path / "record.times").read_text().splitlines()]
    starts, ends = [float(t) for _, what, t in times if what == "start"], [float(t) for _, what, t in times if what == "end"]
    assert len(starts) == 3 and max(starts) < min(ends), times  # all three running at once


def test_the_marker_is_the_image_ids_so_another_tag_of_it_is_not_tested_again(tmp_path):
    """Once the head's smoke test passed, the same image under another tag (a site's new name for
    the same bytes) reads as tested there, with its fields; another image under that tag does not."""
    _, results, _ = the_chain(tmp_path, "runtime.ImageState", IMAGE_ARGS, IMAGE_FACT, UNTESTED, HAVE, HAVE,
                              before=lambda nodes: with_programs(nodes, "spark-head"))
    assert results[-1].returncode == 0, results[-1].stderr
    renamed = "dual-spark/renamed:0123456789ab"
    fact = ImageState()
    command = fact.command(tag=renamed, marker=runtime.smoke_marker("state", renamed)).get_raw_value()

    def reading(image_id: str) -> dict:
        env = {**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "RECORD": str(tmp_path / "record"), "IMAGE_ID": image_id}
        output = subprocess.run(["sh", "-c", command], env=env, cwd=tmp_path / "nodes/spark-head", capture_output=True, text=True, timeout=60)
        return fact.process(output.stdout.splitlines())

    same = reading(IMAGE_ID)
    assert same["smoke_tested"] == IMAGE_ID and same["speculative_keys"] == ["method", "num_speculative_tokens"]
    other = "sha256:" + "cd" * 32
    assert reading(other)["id"] == other and reading(other)["smoke_tested"] is None


def test_a_model_hop_from_a_worker_runs_sync_there_as_the_deploy_user(tmp_path):
    """worker1 holds the model, verified, worker2 nothing: sync send runs on worker1 (not
    under sudo), bound to its rails, to worker2's, the head's manifest on its stdin."""
    state = tmp_path / "state"
    (state / "bin").mkdir(parents=True)
    (tmp_path / "real.pyz").write_bytes(programs.built())  # its peers program takes the head to worker1; sync is recorded
    (state / "bin/dual-spark.pyz").write_text(
        RECORDER.replace("import json, os, sys\n", f"import json, os, sys\nif sys.argv[1] == 'peers': os.execvp(sys.executable, "
                                                   f"[sys.executable, {str(tmp_path / 'real.pyz')!r}, *sys.argv[1:]])\n")
                .replace("os.path.basename(sys.argv[0]), *sys.argv[1:]", "os.environ.get('NODE', 'head'), *sys.argv[1:], sys.stdin.read()"))
    store = tmp_path / "m"
    entry = store_entry(str(store), HUB_MODEL.source)
    Path(entry).mkdir(parents=True)
    where = paths(str(state), entry)
    Path(where["manifest"]).write_text('{"digest": "the head\'s manifest"}')
    manifest = {"digest": "d" * 64, "files": 2, "bytes": 10, "source": HUB_MODEL.source}
    done = {"exists": True, "free_bytes": 1 << 40, "bytes": 10, "manifest": None, "verified": "d" * 64, "changed": [], "token": None,
            "unreadable": []}
    result, calls = hop_from_worker1(
        tmp_path, "runtime.ModelState",
        {"model": HUB_MODEL, "user": "spark", "state_dir": str(state), "model_dir": str(store), "image": IMAGE,
         "hf_endpoint": "http://hub", "hf_token_file": "~/t", "container": NO_CONTAINER, "streams": 2, "verify_model": "size"},
        {"programs": where["programs"], "model_dir": entry, "manifest": where["manifest"], "state": where["verified"], "user": "spark",
         "token_file": "~/t"},
        {**done, "manifest": manifest, "verified": None}, done, {**done, "bytes": 0, "verified": None})
    assert result.returncode == 0, result.stderr
    assert calls == [["ssh", "head", "spark@10.0.0.2"],
                     ["10.0.0.2", "sync", "send", "--dir", entry, "--manifest", "-", "--peer", "spark@10.0.0.3,spark@10.0.1.3",
                      "--local", "10.0.0.2,10.0.1.2", "--remote-dir", entry, "--remote-state", where["verified"],
                      "--remote-script", where["programs"], "--streams", "2", "--progress", "10", '{"digest": "the head\'s manifest"}']]
