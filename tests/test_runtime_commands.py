"""The runtime's shell commands run by a real shell, with stand-ins that record their arguments
for the programs that need a node (docker, chown) and the real helpers for the rest."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from operations.runtime import fetch, paths

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
