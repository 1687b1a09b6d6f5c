"""sync, the program that hashes the model and replicates it to a worker, run from the archive
the deploy ships: real files, real TCP streams on loopback addresses; only ssh is a stand-in
(tests/programs/ssh, which runs the worker's side from the same archive)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dual_spark.sync.model import CHUNK

from tests.programs import ARCHIVE

SSH = {**os.environ, "PATH": f"{Path(__file__).parent}:{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Three shards spanning several 64 MiB chunks, small files, one in a subdirectory; hashed
    once, its manifest beside it."""
    source = tmp_path_factory.mktemp("source") / "model"
    (source / "tokenizer").mkdir(parents=True)
    for index, size in enumerate((150 << 20, 70 << 20, 3 << 20)):
        with open(source / f"model-0000{index}.safetensors", "wb") as handle:
            handle.write(os.urandom(size))
    (source / "config.json").write_text('{"hidden": 64}')
    (source / "tokenizer/tokenizer.json").write_text("{}")
    assert manifest(source)["hashed_files"] == 5
    return source


@pytest.fixture
def bare_model(source, tmp_path):
    """The source, hard-linked into this test's directory (its manifest goes beside it)."""
    copy = tmp_path / "model"
    shutil.copytree(source, copy, copy_function=os.link)
    return copy


@pytest.fixture
def model(source, bare_model):
    """The model as the head has it once hashed: the source's manifest beside the copy. The
    copy's files are the source's (hard links: the same bytes, sizes and mtimes), so `manifest`
    would write this manifest again byte for byte (test_manifest_hashes_once_then_only_what_moved
    checks), hashing the 223 MiB once more in every test."""
    shutil.copyfile(source.parent / "manifest.json", bare_model.parent / "manifest.json")
    return bare_model


@pytest.fixture(scope="module")
def first_send(source, tmp_path_factory):
    """A send of the model to an empty worker, made once: the worker's model directory as it
    leaves it (the files, the marker, the verified record) and its summary."""
    dest = tmp_path_factory.mktemp("sent") / "worker"
    return dest, send(source, dest)


@pytest.fixture
def worker(first_send, tmp_path):
    """A worker that holds the model, verified: a copy of the first send's directory with its
    files' mtimes, which the verified record lists (test_replication_copies_everything_then_nothing
    checks that a send to it moves nothing)."""
    dest = tmp_path / "worker"
    shutil.copytree(first_send[0], dest)
    return dest


def run(*args, env_path=True, check=True) -> dict:
    env = SSH if env_path else None
    result = subprocess.run([sys.executable, str(ARCHIVE), "sync", *map(str, args)], capture_output=True, text=True, env=env, timeout=120)
    if check:
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout.splitlines()[-1])
    return result


def manifest(model: Path, *extra) -> dict:
    return run("manifest", "--dir", model, "--manifest", model.parent / "manifest.json", "--source", '{"path": "/src"}', *extra)


def send(model: Path, dest: Path, peers="u@127.0.0.2,u@127.0.0.3", local="127.0.0.1,127.0.0.1", check=True):
    return run("send", "--dir", model, "--manifest", model.parent / "manifest.json", "--peer", peers, "--local", local,
               "--remote-dir", dest, "--remote-state", dest / ".dual-spark-verified.json", "--streams", "2", check=check)


def same_bytes(a: Path, b: Path) -> bool:
    """Whether two files hold the same bytes, read a MiB at a time: a third of the time of reading
    each whole (a 150 MiB bytes object is paid for in page faults)."""
    with open(a, "rb") as x, open(b, "rb") as y:
        while (block := x.read(1 << 20)) == y.read(1 << 20):
            if not block:
                return True
    return False


def same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file() and not p.name.startswith(".")) and all(
        same_bytes(a / f, b / f) for f in files)


def test_manifest_hashes_once_then_only_what_moved(bare_model, source):
    model = bare_model
    first = manifest(model)
    assert first["files"] == 5 and first["hashed_files"] == 5 and first["hashed_bytes"] == first["bytes"]
    assert (model.parent / "manifest.json").read_bytes() == (source.parent / "manifest.json").read_bytes()
    assert manifest(model)["hashed_files"] == 0
    (model / "config.json").unlink()
    (model / "config.json").write_text('{"hidden": 64}')  # the same bytes, a new mtime
    again = manifest(model)
    assert again["hashed_files"] == 1 and again["digest"] == first["digest"]
    assert manifest(model, "--full")["hashed_files"] == 5
    record = json.loads((model.parent / "manifest.json").read_text())
    assert len(record["files"]["model-00000.safetensors"]["chunks"]) == 3  # 150 MiB in 64 MiB chunks


def test_replication_copies_everything_then_nothing(model, first_send, worker):
    """The first send (made once, for the tests that start from a worker holding the model) moves
    every byte over both rails; a send to a worker holding its result moves nothing."""
    dest, first = first_send
    assert first["bytes"] == sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert first["rails"] == 2 and same_tree(model, dest)
    status = run("status", "--dir", dest, "--state", dest / ".dual-spark-verified.json")
    assert status["verified"] == json.loads((model.parent / "manifest.json").read_text())["digest"] and status["changed"] == []
    second = send(model, worker)
    assert second["bytes"] == 0 and second["chunks"] == 0


def test_a_corrupted_chunk_and_a_truncated_file_are_found_and_only_they_resent(model, worker):
    dest = worker
    with open(dest / "model-00000.safetensors", "r+b") as handle:
        handle.seek(CHUNK + 12345)
        handle.write(b"bit rot")
    os.truncate(dest / "model-00001.safetensors", 10 << 20)
    status = run("status", "--dir", dest, "--state", dest / ".dual-spark-verified.json")
    assert status["changed"] == ["model-00000.safetensors", "model-00001.safetensors"]
    repaired = send(model, dest)
    assert repaired["chunks"] == 1 + 2 and repaired["bytes"] == CHUNK + (70 << 20)
    assert same_tree(model, dest)


def test_a_cut_transfer_resumes_where_it_stopped(model, tmp_path):
    dest = tmp_path / "worker"
    sender = subprocess.Popen([sys.executable, str(ARCHIVE), "sync", "send", "--dir", str(model), "--manifest", str(model.parent / "manifest.json"),
                               "--peer", "u@127.0.0.2", "--local", "127.0.0.1", "--remote-dir", str(dest),
                               "--remote-state", str(dest / ".dual-spark-verified.json"), "--streams", "1"],
                              env=SSH, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the sender runs in steps of 5 ms until the first shard is in
        time.sleep(0.005)
        os.kill(sender.pid, signal.SIGSTOP)
        if any(p.name.endswith(".safetensors") for p in dest.glob("*")) or sender.poll() is not None:
            break
        os.kill(sender.pid, signal.SIGCONT)
    subprocess.run(["pkill", "-KILL", "-f", f"sync receive --dir {dest}"])  # the sender is stopped with 73 MiB to go
    os.kill(sender.pid, signal.SIGCONT)
    _, stderr = sender.communicate(timeout=60)
    assert sender.returncode == 1 and "Run the deploy again: it resumes" in stderr
    assert not (dest / ".dual-spark-verified.json").exists()
    resumed = send(model, dest)
    total = sum(p.stat().st_size for p in model.rglob("*") if p.is_file())
    assert 0 < resumed["bytes"] < total
    assert same_tree(model, dest)


def test_a_rail_that_does_not_answer_is_skipped_and_said(model, tmp_path):
    dest = tmp_path / "worker"
    result = run("send", "--dir", model, "--manifest", model.parent / "manifest.json", "--peer", "u@192.0.2.1,u@127.0.0.3",
                 "--local", "127.0.0.1,127.0.0.1", "--remote-dir", dest, "--remote-state", dest / ".dual-spark-verified.json",
                 check=False)
    assert result.returncode == 0, result.stderr
    assert "the worker does not answer over SSH at 192.0.2.1; trying the next rail" in result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["rails"] == 1 and summary["via"] == "u@127.0.0.3" and same_tree(model, dest)


def test_the_copy_mirrors_the_manifest(model, worker):
    """An older model's shard in the worker's model directory (the deploy's: it carries the marker)
    goes (vLLM would load every *.safetensors there). The worker holds the model already: what
    removes the shard is the receiver's plan, before any chunk moves."""
    dest = worker
    (dest / "model-00099.safetensors").write_bytes(b"an older model")
    result = send(model, dest, check=False)
    assert result.returncode == 0 and "removed 1 file(s) the model does not have from the worker" in result.stderr
    assert same_tree(model, dest)


def test_a_directory_the_deploy_did_not_make_is_refused_and_left_alone(model, tmp_path):
    """A model directory holding a user's file and no marker: the worker refuses it, the sender
    says which directory and the fix, and nothing there is deleted or changed."""
    dest = tmp_path / "worker"
    (dest / "photos").mkdir(parents=True)
    (dest / "photos/holiday.jpg").write_bytes(b"not a model")
    (dest / "notes.txt").write_text("mine")
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in dest.rglob("*") if p.is_file()}
    result = send(model, dest, check=False)
    assert result.returncode == 1
    assert f"model_dir {dest} holds files the deploy did not put there (notes.txt, photos/holiday.jpg" in result.stderr
    assert "Fix: move those files away" in result.stderr and "set model_dir in site.toml" in result.stderr
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in dest.rglob("*") if p.is_file()} == before


def test_claim_takes_new_empty_and_recorded_directories_and_refuses_others(model, tmp_path):
    """claim writes the marker into a new or empty directory, and into one holding only what a
    record of the deploy lists (a model directory an older version filled, without a marker)."""
    for name in ("new", "empty", "legacy", "foreign"):
        if name != "new":
            (tmp_path / name).mkdir()
    shutil.copytree(model, tmp_path / "legacy", dirs_exist_ok=True, copy_function=os.link)
    (tmp_path / "legacy/.cache/huggingface").mkdir(parents=True)
    (tmp_path / "legacy/.cache/huggingface/x.lock").write_text("")
    (tmp_path / "foreign/model-00000.safetensors").write_bytes(b"x")
    (tmp_path / "foreign/thesis.tex").write_text("mine")
    for name in ("new", "empty", "legacy"):
        run("claim", "--dir", tmp_path / name, "--manifest", model.parent / "manifest.json", check=False).check_returncode()
        assert (tmp_path / name / ".dual-spark-managed").is_file()
    refused = run("claim", "--dir", tmp_path / "foreign", "--manifest", model.parent / "manifest.json", check=False)
    assert refused.returncode == 1 and "(thesis.tex; 1 in all)" in refused.stderr
    assert not (tmp_path / "foreign/.dual-spark-managed").exists()
    (tmp_path / "foreign/.dual-spark-managed").write_text("")  # the deploy's own: taken as it is
    run("claim", "--dir", tmp_path / "foreign", check=False).check_returncode()


def test_a_write_that_fails_on_the_worker_reaches_the_senders_error(model, tmp_path):
    """The worker cannot write its verified record (its directory is missing): the sender fails
    saying so, instead of hanging or blaming the network."""
    dest = tmp_path / "worker"
    result = run("send", "--dir", model, "--manifest", model.parent / "manifest.json", "--peer", "u@127.0.0.2",
                 "--local", "127.0.0.1", "--remote-dir", dest, "--remote-state", tmp_path / "missing/verified.json",
                 check=False)
    assert result.returncode == 1, result.stderr
    assert "transfer interrupted after" in result.stderr and f"{tmp_path / 'missing'}/.verified.json." in result.stderr


def test_progress_lines_then_one_summary_line(bare_model, tmp_path):
    """With --progress the long steps print a line that often while they run, and end with one
    summary line for people."""
    model = bare_model
    hashed = run("manifest", "--dir", model, "--manifest", model.parent / "manifest.json", "--progress", "0.01", check=False)
    lines = hashed.stdout.splitlines()
    assert re.fullmatch(r"hashing the model: [\d.]+ (MiB|KiB|B) of 223\.0 MiB \(\d+%\), [\d.]+ \w+/s(, [\w ]+ left)?", lines[0]), lines
    assert lines[-1].startswith("model hashed: files 5, bytes 233832464, hashed_files 5")
    sent = run("send", "--dir", model, "--manifest", model.parent / "manifest.json", "--peer", "u@127.0.0.2",
               "--local", "127.0.0.1", "--remote-dir", tmp_path / "worker", "--remote-state", tmp_path / "worker/.v.json",
               "--streams", "1", "--progress", "0.01", check=False)
    lines = sent.stdout.splitlines()
    assert lines[0].startswith("replicating the model: ") and " of 223.0 MiB (" in lines[0], lines
    assert lines[-1].startswith("model replicated: bytes 233832464, chunks 8")


def test_no_manifest_is_a_clear_error(bare_model, tmp_path):
    model = bare_model
    result = send(model, tmp_path / "worker", check=False)
    assert result.returncode == 1 and "no manifest at" in result.stderr and "hash the model first" in result.stderr


def test_files_already_right_under_another_record_are_checked_not_sent(model, worker):
    """The worker holds every file, right, but its verified record names another model (the site
    went back to a model it had before): each file is hashed there, nothing moves, the record is
    written once every file is back in place."""
    dest = worker
    state = dest / ".dual-spark-verified.json"
    state.write_text(json.dumps({"digest": "0" * 64, "files": {}}))
    again = send(model, dest)
    assert again["bytes"] == 0 and same_tree(model, dest)
    assert json.loads(state.read_text())["digest"] == json.loads((model.parent / "manifest.json").read_text())["digest"]


def test_a_receiver_that_fails_is_said_not_taken_for_an_unanswering_rail(model, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("the remote directory cannot be made under a file")
    result = send(model, blocked / "worker", check=False)
    assert result.returncode == 1
    assert "does not answer over SSH" not in result.stderr and "model_sync on the worker failed" in result.stderr, result.stderr


def test_every_rail_carries_its_share_with_fewer_chunks_than_streams(model, tmp_path):
    """Eight chunks for sixteen streams: the first rail to connect must not take them all."""
    dest = tmp_path / "worker"
    result = run("send", "--dir", model, "--manifest", model.parent / "manifest.json", "--peer", "u@127.0.0.2,u@127.0.0.3",
                 "--local", "127.0.0.1,127.0.0.1", "--remote-dir", dest, "--remote-state", dest / ".dual-spark-verified.json",
                 "--streams", "8")
    assert result["chunks"] == 8 and result["rails"] == 2 and same_tree(model, dest)
    assert min(result["bytes_by_rail"].values()) >= 3 << 20, result["bytes_by_rail"]



def test_a_worker_sends_its_verified_copy_on_with_the_heads_manifest_on_stdin(model, worker, tmp_path):
    """The chain: the head sends to the first worker, which then sends from its copy to the next,
    reading the head's manifest from stdin as the head passes it along; the next checks every
    chunk against it. A copy that differs from the manifest arrives corrupted, and is said."""
    first, second = worker, tmp_path / "worker2"

    def hop(check=True):
        result = subprocess.run(
            [sys.executable, str(ARCHIVE), "sync", "send", "--dir", str(first), "--manifest", "-", "--peer", "u@127.0.0.3,u@127.0.0.4",
             "--local", "127.0.0.2,127.0.0.2", "--remote-dir", str(second), "--remote-state", str(second / ".dual-spark-verified.json"),
             "--streams", "2"], input=(model.parent / "manifest.json").read_text(), capture_output=True, text=True, env=SSH, timeout=120)
        assert result.returncode == 0 or not check, result.stderr
        return result

    moved = json.loads(hop().stdout.splitlines()[-1])
    assert moved["bytes"] == sum(p.stat().st_size for p in model.rglob("*") if p.is_file()) and same_tree(model, second)
    status = run("status", "--dir", second, "--state", second / ".dual-spark-verified.json")
    assert status["verified"] == json.loads((model.parent / "manifest.json").read_text())["digest"] and status["changed"] == []
    with open(first / "model-00001.safetensors", "r+b") as handle:
        handle.write(b"rot on the sender")
    os.truncate(second / "model-00001.safetensors", 1 << 20)
    spoiled = hop(check=False)
    assert spoiled.returncode == 1 and "model-00001.safetensors chunk 0 arrives corrupted" in spoiled.stderr, spoiled.stderr
