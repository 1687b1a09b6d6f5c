"""Runtime artifacts on the lab, for real: the runtime image built once on the head and streamed
to the worker's real Docker engine; the model copied once, hashed, and replicated over both
rails; a cut transfer, a damaged shard, a rail without link, a full disk; and the hub path
against a stand-in hub on the lab's bridge (gated, pinned). Each source has its own directory of
the model store (model_dir). The model cases run the runtime step alone (tasks/runtime.py): the
stacks keep the model the pair serves, and never restart."""

import filecmp
import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from lab import faults
from lab.config import HEAD, LAB_DIR, LAB_MODEL, WORKER
from lab.hub import Hub
from lab.processes import in_node
from layout import store_entry
from tests.e2e.conftest import LAB_ENV, PYINFRA, REPO, SITE, pyinfra, serving_after, site_variant

pytestmark = pytest.mark.end_to_end
MODEL_DIR = "/var/lib/dual-spark/model"  # the store
TINY = store_entry(MODEL_DIR, {"path": LAB_MODEL})  # the directory of the model the pair serves
BIG = "/srv/lab-models/big"
BIG_MODEL = store_entry(MODEL_DIR, {"path": BIG})
TOKEN = "hf_lab_token_4d9e61c0"
RUNTIME = "tasks/runtime.py"  # a model change alone: the serving stacks are the next step


def docker(node, *args) -> str:
    return in_node(node.dir, "docker", *args, capture_output=True).stdout.strip()


def moved(output: str) -> int | None:
    """Bytes the replication reported, None if it did not run."""
    match = re.search(r"model replicated: bytes (\d+)", output)
    return int(match.group(1)) if match else None


def small_disk_for_the_deploy(node, size: str) -> None:
    """A nearly full disk mounted as model_dir, marked the deploy's as its refusal of an unmarked
    directory says (sudo touch DIR/.dual-spark-managed): a new mount is no directory the deploy made."""
    faults.small_disk(node, MODEL_DIR, size)
    in_node(node.dir, "touch", f"{MODEL_DIR}/.dual-spark-managed")


def on_node(node, path: str) -> Path:
    return node.root / path.lstrip("/")


def model_files(root: Path) -> list[str]:
    """The model's files as the manifest counts them: hidden paths (the hub's cache, our record) left out."""
    return sorted(n for n in (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) if not n.startswith("."))


def same_model(path: str) -> bool:
    head, worker = on_node(HEAD, path), on_node(WORKER, path)
    names = model_files(head)
    return names == model_files(worker) and all(filecmp.cmp(head / n, worker / n, shallow=False) for n in names)


def test_image_and_model_are_on_both_nodes_verified(converged):
    tag = re.search(r"runtime image (dual-spark/lab-cpu:\w+)", converged.stdout).group(1)
    assert docker(HEAD, "image", "inspect", "-f", "{{.Id}}", tag) == docker(WORKER, "image", "inspect", "-f", "{{.Id}}", tag)
    assert re.search(rf"spark-worker\s+runtime image {tag}\s+PASS\s+sha256:\w+, the same as spark-head's, smoke-tested", converged.stdout)
    assert re.search(r"spark-worker\s+model copy\s+PASS\s+verified against manifest", converged.stdout)
    assert same_model(TINY)
    manifest = json.loads(on_node(HEAD, f"{TINY}/.dual-spark-manifest.json").read_text())
    assert manifest["source"] == {"path": LAB_MODEL} and "model.safetensors" in manifest["files"]


def test_an_image_already_on_the_worker_is_not_sent_again(converged):
    """The head's smoke marker is gone: the head tests again, the worker's image stays as loaded."""
    tag = re.search(r"runtime image (dual-spark/lab-cpu:\w+)", converged.stdout).group(1)
    loaded = docker(WORKER, "image", "inspect", "-f", "{{.Metadata.LastTagTime}}", tag)
    for marker in on_node(HEAD, "/var/lib/dual-spark/runtime").iterdir():
        marker.unlink()
    result = pyinfra("-y")
    assert result.returncode == 0, result.stdout
    assert re.search(r"Obtain the runtime image .*\s+2\s+1\s+-\s+1\s", result.stdout), result.stdout  # the head tests again
    assert docker(WORKER, "image", "inspect", "-f", "{{.Metadata.LastTagTime}}", tag) == loaded
    assert moved(result.stdout) is None


def test_the_replication_benchmark_compares_with_rsync_and_moves_nothing_again(converged, tmp_path):
    """bench.replicate on a small load (its figures for README come from the default 2 GiB)."""
    result = subprocess.run([str(PYINFRA.parent / "python"), "-m", "bench.replicate", "--site", str(SITE), "--gib", "0.25",
                             "--shard-mib", "64", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    [raw] = tmp_path.glob("replicate-*.json")
    record = json.loads(raw.read_text())
    assert record["bytes"] == 256 << 20 and record["model_sync"]["bytes_moved"] == record["bytes"]
    assert set(record["model_sync"]["bytes_by_rail"]) == {"10.0.0.2", "10.0.1.2"}  # both rails carried shards
    assert record["rerun_bytes_moved"] == 0 and record["speedup_vs_rsync_ssh"] > 0
    assert re.search(r"speedup: [\d.]+x", result.stdout)
    assert not in_node(WORKER.dir, "test", "-e", f"{MODEL_DIR}/.dual-spark-bench", check=False).returncode == 0  # cleaned up


@pytest.fixture(scope="module")
def big_model(converged, tmp_path_factory):
    """The tiny model plus two 100 MiB shard files (real shards are ~3.5 GiB; vLLM ignores these),
    on the head's disk; the site points at it. The tiny model alone comes back afterwards."""
    directory = on_node(HEAD, BIG)
    shutil.copytree(on_node(HEAD, LAB_MODEL), directory)  # vLLM still loads the tiny weights; the shards are extra
    for index in range(2):
        with open(directory / f"extra-0000{index}-of-00002.bin", "wb") as handle:
            handle.write(os.urandom(100 << 20))
    yield site_variant(tmp_path_factory.mktemp("big"), model={"path": BIG, "served_name": "tiny", "tokenizer_mode": "auto",
                                                              "tool_call_parser": "", "reasoning_parser": ""})
    result = pyinfra("-y", task=RUNTIME)
    assert result.returncode == 0 and same_model(TINY), result.stdout


def landed(directory: Path) -> int:
    """Bytes written so far into the files still being received; a file that completes between
    the listing and its reading has been renamed from its .dsp-part name, and counts no more."""
    total = 0
    for part in directory.glob("*.dsp-part"):
        try:
            total += part.stat().st_blocks * 512
        except FileNotFoundError:
            continue
    return total


def test_a_cut_transfer_resumes_where_it_stopped(big_model):
    run = subprocess.Popen([str(PYINFRA), "-y", "inventory.py", RUNTIME], cwd=REPO, stdin=subprocess.DEVNULL,
                           env={**LAB_ENV, "DUAL_SPARK_SITE": str(big_model)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    worker_dir = on_node(WORKER, BIG_MODEL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and run.poll() is None:
        if landed(worker_dir) >= 64 << 20:  # at least a chunk's worth written
            assert faults.kill(WORKER, "dual-spark.pyz sync receive")
            break
        time.sleep(0.02)
    output = run.communicate(timeout=300)[0]
    assert run.returncode != 0, output
    assert "transfer interrupted" in output and "it resumes where this stopped" in output, output
    result = pyinfra("-y", task=RUNTIME, site=big_model)
    total = sum(p.stat().st_size for p in on_node(HEAD, BIG_MODEL).iterdir() if p.is_file() and not p.name.startswith("."))
    assert result.returncode == 0, result.stdout
    assert 0 < moved(result.stdout) < total, result.stdout
    assert same_model(BIG_MODEL)


def test_a_damaged_shard_on_the_worker_is_found_and_resent(big_model):
    shard = on_node(WORKER, BIG_MODEL) / "extra-00001-of-00002.bin"
    with open(shard, "r+b") as handle:
        handle.seek(70 << 20)
        handle.write(b"flipped bits")
    result = pyinfra("-y", task=RUNTIME, site=big_model)
    assert result.returncode == 0, result.stdout
    assert moved(result.stdout) == (100 - 64) << 20, result.stdout  # only the chunk that holds the damage (the last 36 MiB)
    assert same_model(BIG_MODEL)


def test_a_rail_without_link_is_skipped_and_said(big_model):
    (on_node(WORKER, BIG_MODEL) / "extra-00000-of-00002.bin").unlink()
    faults.link(WORKER, "enp1s0f0np0", False)
    try:
        result = pyinfra("-y", task=RUNTIME, site=big_model)
        assert "the worker does not answer over SSH at 10.0.0.2; trying the next rail" in result.stdout, result.stdout
        assert re.search(r"model replicated: bytes 104857600, .*rails 1, via spark@10.0.1.2", result.stdout), result.stdout
        assert same_model(BIG_MODEL)
    finally:
        faults.link(WORKER, "enp1s0f0np0", True)
        serving_after()  # serving ran over rail 0: the watchdogs restart the pair once it is back


def test_a_full_disk_on_the_worker_stops_before_a_byte_moves(big_model):
    """The worker's store a 16 MiB disk: the head's copy (its manifest's bytes) does not fit
    there; refused, naming the worker and both numbers, before the head sends a byte or either
    node makes a directory, and the pair serves on."""
    small_disk_for_the_deploy(WORKER, "16m")
    try:
        result = pyinfra("-y", task=RUNTIME, site=big_model)
        assert result.returncode != 0
        assert re.search(r"spark-worker: /var/lib/dual-spark/model has 16.0 MiB free; the model needs 20\d.\d+ MiB more. "
                         r"Fix: free space there, or set model_dir", result.stdout), result.stdout
        assert moved(result.stdout) is None
        assert in_node(WORKER.dir, "ls", "-A", MODEL_DIR, capture_output=True).stdout == ".dual-spark-managed\n"  # its marker only
        assert serving_after(30) < 30  # nothing in service touched
    finally:
        faults.free_disk(WORKER, MODEL_DIR)


@pytest.fixture(scope="module")
def hub(converged):
    with Hub(on_node(HEAD, LAB_MODEL), repo="lab/tiny-llama", token=TOKEN, gated=True) as hub:
        yield hub


def hub_site(directory: Path, hub: Hub, revision: str | None = None) -> Path:
    return site_variant(directory, model={"repo": "lab/tiny-llama", "revision": revision or hub.commit, "served_name": "tiny",
                                          "tokenizer_mode": "auto", "tool_call_parser": "", "reasoning_parser": ""},
                        hf_endpoint=hub.endpoint, hf_endpoint_insecure_http=True)


TOKEN_FILE = "/home/spark/.cache/huggingface/token"


def test_a_gated_model_without_a_token_stops_before_a_byte_moves(hub, tmp_path):
    on_node(HEAD, TOKEN_FILE).unlink(missing_ok=True)
    result = pyinfra("-y", task=RUNTIME, site=hub_site(tmp_path, hub))
    assert result.returncode != 0
    assert "lab/tiny-llama at " in result.stdout and "is gated: a token is needed" in result.stdout, result.stdout
    assert not [r for r in hub.requests if "/resolve/" in r]


def test_a_wrong_revision_is_named(hub, tmp_path):
    token = on_node(HEAD, TOKEN_FILE)
    token.parent.mkdir(parents=True, exist_ok=True)
    token.write_text(TOKEN + "\n")
    in_node(HEAD.dir, "chown", "-R", "spark:", "/home/spark/.cache")  # the deploy user's own file: the deploy takes no other
    result = pyinfra("-y", task=RUNTIME, site=hub_site(tmp_path, hub, revision="0" * 40))
    assert result.returncode != 0
    assert f"lab/tiny-llama has no revision {'0' * 40}. Fix: set model.revision" in result.stdout, result.stdout
    assert not [r for r in hub.requests if "/resolve/" in r]


@pytest.mark.parametrize("node, size", [(HEAD, "100k"), (WORKER, "512k")], ids=["head", "worker"])
def test_a_hub_revision_too_big_for_a_node_stops_before_the_head_fetches(hub, tmp_path, node, size):
    """A node's store a disk smaller than the revision (the model: 1.5 MiB): the hub's sizes,
    read before any download, are checked against every node that will receive it; refused,
    naming the node and both numbers, before the head downloads a byte, and the pair serves on."""
    small_disk_for_the_deploy(node, size)
    try:
        result = pyinfra("-y", task=RUNTIME, site=hub_site(tmp_path, hub))
        assert result.returncode != 0
        assert re.search(rf"{node.hostname}: /var/lib/dual-spark/model has [\d.]+ MiB free; lab/tiny-llama at \w+ needs [\d.]+ MiB more",
                         result.stdout), result.stdout
        assert not [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]
        assert serving_after(30) < 30  # nothing in service touched
    finally:
        faults.free_disk(node, MODEL_DIR)


def test_the_hub_path_fetches_once_with_the_token_and_never_shows_it(hub, tmp_path):
    site = hub_site(tmp_path, hub)
    result = pyinfra("-y", task=RUNTIME, site=site)
    assert result.returncode == 0, result.stdout
    assert "fetched lab/tiny-llama: commit " + hub.commit in result.stdout and moved(result.stdout) is not None
    assert oct(on_node(HEAD, TOKEN_FILE).stat().st_mode)[-3:] == "600"
    fetched = len([r for r in hub.requests if r.startswith("GET") and "/resolve/" in r])
    again = pyinfra("-y", task=RUNTIME, site=site)
    assert again.returncode == 0 and "fetched" not in again.stdout and moved(again.stdout) is None
    assert len([r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]) == fetched
    verbose = pyinfra("-y", "-vv", task=RUNTIME, site=site)
    for output in (result.stdout, again.stdout, verbose.stdout):
        assert TOKEN not in output
    assert same_model(store_entry(MODEL_DIR, {"repo": "lab/tiny-llama", "revision": hub.commit}))
    assert (LAB_DIR / "site.toml").exists()


def test_a_long_fetch_says_where_it_is_while_it_runs(hub, tmp_path):
    """The hub slowed so that the fetch of the tiny model and a 40 MiB extra file (huggingface_hub
    writes 10 MiB at a time) takes about 30 s: its progress lines (done of total, rate, time left)
    reach the run's output while the fetch runs, the first long before the final line. The extra
    file makes it another revision: a directory of its own in the store, fetched whole."""
    served = tmp_path / "hub"
    shutil.copytree(on_node(HEAD, LAB_MODEL), served)
    (served / "extra-00000-of-00001.bin").write_bytes(os.urandom(40 << 20))  # vLLM ignores it
    total = sum(p.stat().st_size for p in served.rglob("*") if p.is_file())
    with Hub(served, repo="lab/tiny-llama", token=TOKEN, gated=True, rate=total // 30) as slow:
        run = subprocess.Popen([str(PYINFRA), "-y", "inventory.py", RUNTIME], cwd=REPO, stdin=subprocess.DEVNULL,
                               env={**LAB_ENV, "DUAL_SPARK_SITE": str(hub_site(tmp_path, slow))},
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines = [(time.monotonic(), line) for line in run.stdout]
        run.wait(timeout=60)
    output = "".join(line for _, line in lines)
    assert run.returncode == 0, output
    of_total = re.escape(f"of {total / 2**20:.1f} MiB")  # the model's files and the extra one, as progress writes sizes
    progress = [(at, line) for at, line in lines if re.search(r"\[spark-head\]\s+fetching lab/tiny-llama: [\d.]+ \w+ " + of_total +
                                                              r" \(\d+%\), [\d.]+ \w+/s", line)]
    [(done_at, _)] = [(at, line) for at, line in lines if "fetched lab/tiny-llama: commit " + slow.commit in line]
    assert len(progress) >= 2 and any("MiB of" in line for _, line in progress), output  # bytes seen moving
    assert done_at - progress[0][0] >= 8, output  # printed as it came, not with the step's end
    assert re.search(r"will fetch lab/tiny-llama at \w{12} from the hub into /var/lib/dual-spark/model", output), output
    assert TOKEN not in output and same_model(store_entry(MODEL_DIR, {"repo": "lab/tiny-llama", "revision": slow.commit}))
