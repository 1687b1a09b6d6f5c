"""The runtime's shell commands run by a real shell, with stand-ins that record their arguments
for the programs that need a node (docker, chown) and the real helpers for the rest."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from operations import runtime
from operations.runtime import fetch, paths
from tests.fake_host import args_key, run_operation

REPO = Path(__file__).resolve().parents[1]
RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps([os.path.basename(sys.argv[0]), *sys.argv[1:]]) + "\\n")
"""
HUB_MODEL = {"repo": "org/model", "revision": "0" * 40}
IMAGE = {"tag": "dual-spark/x:1", "python": "/opt/env/bin/python"}
NO_CONTAINER = {"mounts": [], "env": {}}


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


def test_a_hub_token_path_with_spaces_reaches_docker_as_one_argument(tmp_path):
    token = tmp_path / "my tokens" / "hf token"
    token.parent.mkdir()
    token.write_text("hf_secret")
    model_dir = str(tmp_path / "model dir")
    command = fetch(HUB_MODEL, "spark", paths("/s", model_dir), model_dir, IMAGE, "http://hub", str(token), NO_CONTAINER).args[0]
    result, calls = run(command, tmp_path, "docker", "python3", "chown")
    assert result.returncode == 0, result.stderr
    assert [call[0] for call in calls] == ["python3", "docker", "chown"]
    docker = calls[1]
    assert docker[docker.index(f"{token}:/run/secrets/hf_token:ro") - 1] == "-v"
    assert f"{model_dir}:/model" in docker and "hf_secret" not in json.dumps(calls)
    assert oct(token.stat().st_mode & 0o777) == "0o600"


def test_without_a_token_file_docker_gets_no_token_mount(tmp_path):
    command = fetch(HUB_MODEL, "spark", paths("/s", "/m"), "/m", IMAGE, "http://hub", str(tmp_path / "absent"), NO_CONTAINER).args[0]
    result, calls = run(command, tmp_path, "docker", "python3", "chown")
    assert result.returncode == 0, result.stderr
    assert not any("hf_token:ro" in arg for arg in calls[1]) and calls[1][-3:] == ["/run/secrets/hf_token", "--progress", "10"]


def copying(tmp_path: Path, model_dir: Path):
    """The copy from a directory on the head, with this repository's helpers."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_bytes(b"weights")
    where = {**paths("/s", str(model_dir)), "model_sync": str(REPO / "files/runtime/model_sync.py"),
             "progress": str(REPO / "files/runtime/progress.py"), "manifest": str(tmp_path / "manifest.json")}
    return fetch({"path": str(source)}, "spark", where, str(model_dir), IMAGE, "http://hub", "~/t", NO_CONTAINER).args[0]


def test_copying_into_a_directory_the_deploy_did_not_make_is_refused_and_touches_nothing(tmp_path):
    model_dir = tmp_path / "home"
    model_dir.mkdir()
    (model_dir / "thesis.tex").write_text("mine")
    result, calls = run(copying(tmp_path, model_dir), tmp_path, "chown")
    assert result.returncode == 1 and f"model_dir {model_dir} holds files the deploy did not put there (thesis.tex" in result.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == ["thesis.tex"] and calls == []  # nothing deleted, copied or re-owned


@pytest.mark.skipif(shutil.which("rsync") is None, reason="rsync is not installed here (the deploy installs it on the nodes)")
def test_copying_into_a_new_directory_claims_it_then_copies_and_owns(tmp_path):
    model_dir = tmp_path / "model"
    result, calls = run(copying(tmp_path, model_dir), tmp_path, "chown")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in model_dir.iterdir()) == [".dual-spark-managed", "model.safetensors"]
    assert calls == [["chown", "-R", "spark:", str(model_dir)]]
    assert result.stdout.splitlines()[-1].startswith(f"copying the model from {tmp_path / 'source'}: done in ")


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
os.execvp("sh", ["sh", "-c", command])
"""
DOCKER = f"""#!{sys.executable}
import json, os, sys
args, node = sys.argv[1:], os.environ.get("NODE", "head")
call = ["docker", node, *args]
if args[0] == "save":
    sys.stdout.write("the layers of " + args[1])
elif args[0] == "load":
    call.append(sys.stdin.read())
elif args[:3] == ["image", "inspect", "-f"]:
    print("sha256:" + "ab" * 32 if "Id" in args[3] else "20")
elif args[0] == "run":
    print("INFO a log line of vLLM's")
    print(json.dumps(["method", "num_speculative_tokens"]))
with open(os.environ["RECORD"], "a") as record:
    record.write(json.dumps(call) + "\\n")
"""
THREE = {"nodes": [{"hostname": name, "ssh_host": f"192.168.1.{10 + rank}", "rails": [
    {"netdev": "enp1s0f0np0", "rdma": "rocep1s0f0", "address": f"10.0.0.{rank + 1}/24"},
    {"netdev": "enP2p1s0f0np0", "rdma": "roceP2p1s0f0", "address": f"10.0.1.{rank + 1}/24"}]}
    for rank, name in enumerate(["spark-head", "spark-worker1", "spark-worker2"])]}


def chain_case(fact: str, args: dict, fact_args: dict, head: dict, worker1: dict, worker2: dict) -> dict:
    key = args_key(fact_args)
    return {"cluster": THREE, "args": args,
            "host": {"name": "spark-head", "data": {"role": "head"}, "facts": {fact: {key: head}}},
            "peer": {"name": "spark-worker1", "facts": {fact: {key: worker1}}},
            "others": [{"name": "spark-worker2", "facts": {fact: {key: worker2}}}]}


def hop_from_worker1(tmp_path: Path, fact: str, args: dict, fact_args: dict, head: dict, worker1: dict, worker2: dict):
    """The operation's one command (worker1 sends to worker2), run by sh on the "head" with the
    stand-ins; its result and the calls recorded."""
    commands, _ = run_operation(getattr(runtime, "runtime_image" if fact == "runtime.ImageState" else "model_on_every_node"),
                                chain_case(fact, args, fact_args, head, worker1, worker2))
    assert len(commands) == 1 and commands[0][:2] == ["function", "streamed"], commands
    directory = tmp_path / "bin"
    directory.mkdir()
    for name, text in (("sudo", SUDO), ("ssh", SSH), ("docker", DOCKER)):
        (directory / name).write_text(text)
        (directory / name).chmod(0o755)
    record = tmp_path / "record"
    env = {**os.environ, "PATH": f"{directory}:{os.environ['PATH']}", "RECORD": str(record)}
    result = subprocess.run(["sh", "-c", commands[0][2]], env=env, capture_output=True, text=True, timeout=60)
    return result, [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []


def test_an_image_hop_from_a_worker_streams_from_it_to_the_next_and_tests_it_there(tmp_path):
    """worker1 has the image, worker2 lacks it: the head has worker1 stream it to worker2 (over
    worker2's second rail: its first does not answer), the IDs compared, smoke-tested on worker2."""
    state = tmp_path / "state"
    (state / "bin").mkdir(parents=True)
    shutil.copy(REPO / "files/runtime/progress.py", state / "bin/progress.py")
    marker = runtime.smoke_marker(str(state), IMAGE["tag"])
    image_id = "sha256:" + "ab" * 32
    have = {"id": image_id, "size": 20, "smoke_tested": image_id, "speculative_keys": ["method"], "unreadable": []}
    result, calls = hop_from_worker1(
        tmp_path, "runtime.ImageState",
        {"image_name": "x", "image": IMAGE, "user": "spark", "state_dir": str(state), "container": NO_CONTAINER},
        {"tag": IMAGE["tag"], "marker": marker}, have, have, {**have, "id": None, "smoke_tested": None, "speculative_keys": None})
    assert result.returncode == 0, result.stderr
    assert "the worker does not answer over SSH at 10.0.0.3: trying the next rail" in result.stderr
    assert result.stdout.startswith(f"streaming {IMAGE['tag']} to spark-worker2: 28 B in "), result.stdout
    assert ["ssh", "head", "spark@10.0.0.2"] in calls and ["ssh", "10.0.0.2", "spark@10.0.1.3"] in calls
    assert ["docker", "10.0.0.2", "save", IMAGE["tag"]] in calls
    assert ["docker", "10.0.1.3", "load", f"the layers of {IMAGE['tag']}"] in calls
    run_on_worker2 = [call for call in calls if call[:3] == ["docker", "10.0.1.3", "run"]]
    assert len(run_on_worker2) == 1 and run_on_worker2[0][-3:] == [IMAGE["tag"], "-c", runtime.SMOKE]
    assert Path(marker).read_text() == f'{image_id}\n["method", "num_speculative_tokens"]\n'  # the fields, without vLLM's log
    assert not any(call[:2] == ["docker", "head"] for call in calls)  # the head's link stays free


def test_a_model_hop_from_a_worker_runs_model_sync_there_as_the_deploy_user(tmp_path):
    """worker1 holds the model, verified, worker2 nothing: model_sync send runs on worker1 (not
    under sudo), bound to its rails, to worker2's, the head's manifest on its stdin."""
    state = tmp_path / "state"
    (state / "bin").mkdir(parents=True)
    (state / "bin/model_sync.py").write_text(RECORDER.replace("os.path.basename(sys.argv[0]), *sys.argv[1:]",
                                                              "os.environ.get('NODE', 'head'), *sys.argv[1:], sys.stdin.read()"))
    where = paths(str(state), "/m")
    Path(where["manifest"]).write_text('{"digest": "the head\'s manifest"}')
    manifest = {"digest": "d" * 64, "files": 2, "bytes": 10, "source": HUB_MODEL}
    done = {"exists": True, "free_bytes": 1 << 40, "manifest": None, "verified": "d" * 64, "changed": [], "token_mode": None,
            "unreadable": []}
    result, calls = hop_from_worker1(
        tmp_path, "runtime.ModelState",
        {"model": HUB_MODEL, "user": "spark", "state_dir": str(state), "model_dir": "/m", "image": IMAGE, "hf_endpoint": "http://hub",
         "hf_token_file": "~/t", "container": NO_CONTAINER, "streams": 2, "verify_model": "size"},
        {"script": where["model_sync"], "model_dir": "/m", "manifest": where["manifest"], "state": where["verified"], "user": "spark",
         "token_file": "~/t"},
        {**done, "manifest": manifest, "verified": None}, done, {**done, "verified": None})
    assert result.returncode == 0, result.stderr
    assert calls == [["ssh", "head", "spark@10.0.0.2"],
                     ["10.0.0.2", "send", "--dir", "/m", "--manifest", "-", "--peer", "spark@10.0.0.3,spark@10.0.1.3",
                      "--local", "10.0.0.2,10.0.1.2", "--remote-dir", "/m", "--remote-state", where["verified"],
                      "--remote-script", where["model_sync"], "--streams", "2", "--progress", "10", '{"digest": "the head\'s manifest"}']]
