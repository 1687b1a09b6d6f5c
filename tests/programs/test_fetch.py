"""The hub fetch as the deploy runs it (Xet on, FETCH_ENV), in the lab's runtime Python (the CPU
vLLM environment: its huggingface_hub and hf_xet), against the lab's stand-in hub on loopback.
huggingface_hub takes a file over Xet only when the hub's answer to its HEAD names the file's
Xet hash (X-Xet-Hash) and where to get a Xet token (a Link rel="xet-auth", or
X-Xet-Refresh-Route); the stand-in sends neither, so it is fetched over plain HTTP."""

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from lab.config import VLLM_PYTHON
from lab.hub import Hub
from operations.runtime import FETCH_ENV
from tests.programs import ARCHIVE

pytestmark = pytest.mark.end_to_end
TOKEN = "hf_stand_in_secret"


@pytest.fixture
def served(tmp_path) -> Path:
    """A small model directory, its weights a safetensors file (LFS on the hub: SHA-256 checked)."""
    assert Path(VLLM_PYTHON).exists(), f"no vLLM environment at {VLLM_PYTHON}: run scripts/test (it sets it up)"
    directory = tmp_path / "served"
    directory.mkdir()
    (directory / "config.json").write_text('{"model_type": "llama"}\n')
    (directory / "model.safetensors").write_bytes(os.urandom(3 << 20))
    return directory


def fetch(hub: Hub, dest: Path, xet: Path, token_file: Path, rooms: tuple[str, ...] = ("here=1099511627776:0",),
          **more: str) -> subprocess.CompletedProcess:
    """The fetch with the deploy's environment, its container paths moved here: HF_HOME in the
    model directory, HF_XET_CACHE apart from it; each node's room (a TiB free here by default)."""
    env = {**os.environ, **FETCH_ENV, "HF_HOME": str(dest / ".cache/huggingface"), "HF_XET_CACHE": str(xet),
           "HF_ENDPOINT": hub.endpoint, **more}
    env.pop("HF_HUB_DISABLE_XET", None)
    return subprocess.run([str(VLLM_PYTHON), str(ARCHIVE), "fetch", "--repo", hub.repo, "--revision", hub.commit,
                           "--dest", str(dest), "--store", str(dest.parent), *[arg for room in rooms for arg in ("--room", room)],
                           "--token-file", str(token_file), "--allow-http-token"],  # the stand-in is plain HTTP
                          env=env, capture_output=True, text=True, timeout=120)


def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return path


def test_the_stand_in_is_fetched_over_plain_http_with_xet_on(served, tmp_path):
    xet_on = subprocess.run([str(VLLM_PYTHON), "-c", "from huggingface_hub.utils._runtime import is_xet_available as x; print(x())"],
                            env={k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_XET"},
                            capture_output=True, text=True, timeout=60)
    assert xet_on.stdout.strip() == "True", xet_on.stderr  # hf_xet is there and not disabled: Xet would be used
    dest, xet = tmp_path / "model", tmp_path / "xet"
    with Hub(served, repo="lab/tiny", token=TOKEN, gated=True, address="127.0.0.1") as hub:
        result = fetch(hub, dest, xet, token_file(tmp_path))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout.splitlines()[-1])
    assert summary["fetched_files"] == 2 and summary["commit"] == hub.commit
    for name in ("config.json", "model.safetensors"):
        assert (dest / name).read_bytes() == (served / name).read_bytes()
    assert [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]  # the bytes came over HTTP
    assert not [r for r in hub.requests if "xet" in r]  # no Xet token was asked for
    assert not xet.exists()  # hf_xet never started
    beside = {p.relative_to(dest).parts[0] for p in dest.rglob("*") if p.is_file()} - {"config.json", "model.safetensors"}
    assert beside == {".cache"} and not (dest / ".cache/huggingface/xet").exists()  # huggingface_hub's metadata only
    assert TOKEN not in result.stdout + result.stderr


def test_a_node_short_of_room_for_the_hubs_sizes_stops_the_fetch_before_a_byte_moves(served, tmp_path):
    """The hub's sizes for the revision (3 MiB and a config) against each node's free space less
    what it holds of them: the second node lacks room; it is named with both numbers, nothing is
    downloaded, and the directory is not even made."""
    dest = tmp_path / "model"
    with Hub(served, repo="lab/tiny", token=TOKEN, gated=True, address="127.0.0.1") as hub:
        refused = fetch(hub, dest, tmp_path / "xet", token_file(tmp_path), rooms=("head=1099511627776:0", "worker-2=2097152:0"))
        assert refused.returncode == 1
        assert f"worker-2: {tmp_path} has 2.0 MiB free; lab/tiny at {hub.commit[:12]} needs 3.0 MiB more. Fix: free space there" in refused.stderr
        assert not [r for r in hub.requests if "/resolve/" in r] and not dest.exists()
        fits = fetch(hub, dest, tmp_path / "xet", token_file(tmp_path), rooms=("worker-2=2097152:1572864",))  # 1.5 MiB there already
    assert fits.returncode == 0, fits.stderr


def test_a_hub_that_names_a_xet_hash_is_fetched_over_xet_apart_from_the_model(served, tmp_path):
    """The same stand-in, its file answers carrying Xet headers, its token route a Xet token for a
    storage service that does not answer: huggingface_hub turns to Xet, hf_xet fails, and the fetch
    stops with its own message (nothing of the token in it). hf_xet wrote only where it was set
    apart (its log); the model directory holds no Xet file."""
    dest, xet = tmp_path / "model", tmp_path / "xet"
    with Hub(served, repo="lab/tiny", token=TOKEN, gated=True, address="127.0.0.1") as hub:
        plain = hub.server.RequestHandlerClass

        class XetHeaders(plain):
            def end_headers(self):
                if "/resolve/" in self.path:
                    self.send_header("X-Xet-Hash", "a" * 64)
                    self.send_header("X-Xet-Refresh-Route", f"{hub.endpoint}/api/models/{hub.repo}/xet-read-token/{hub.commit}")
                super().end_headers()

            def do_GET(self):
                if "/xet-read-token/" not in self.path:
                    return super().do_GET()
                hub.requests.append(f"GET {self.path}")
                self.send_response(200)
                for name, value in (("X-Xet-Cas-Url", "http://127.0.0.1:9"), ("X-Xet-Access-Token", "xet_stand_in"),
                                    ("X-Xet-Token-Expiration", str(int(time.time()) + 3600)), ("Content-Length", "0")):
                    self.send_header(name, value)
                self.end_headers()

        hub.server.RequestHandlerClass = XetHeaders
        result = fetch(hub, dest, xet, token_file(tmp_path),
                       HF_XET_CLIENT_RETRY_MAX_ATTEMPTS="1", HF_XET_CLIENT_RETRY_MAX_DURATION="2s")
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"fetch_model: fetching {hub.repo} at {hub.commit[:12]} stopped: " in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and TOKEN not in result.stdout + result.stderr
    assert [r for r in hub.requests if "/xet-read-token/" in r]  # it went for Xet
    assert not [r for r in hub.requests if r.startswith("GET") and "/resolve/" in r]  # not for the HTTP bytes
    assert list(xet.glob("logs/*.log"))  # hf_xet ran, and wrote where it was told
    assert not [p for p in dest.rglob("*") if "xet" in p.name.lower() or p.suffix in (".log", ".incomplete")]
    assert {p.relative_to(dest).parts[0] for p in dest.rglob("*") if p.is_file()} <= {".cache"}  # huggingface_hub's metadata


def test_progress_counts_the_bytes_written_not_a_length_set_ahead(tmp_path):
    """Xet writes a file's parts at their offsets as they arrive: a part near the end makes the
    file long while little of it is written."""
    script = ("import sys; from pathlib import Path; from dual_spark.fetch import tree_bytes; "
              "root = Path(sys.argv[1]); f = open(root / 'part.incomplete', 'wb'); f.seek(100 << 20); "
              "f.write(b'x' * (1 << 20)); f.close(); (root / 'small').write_bytes(b'abc'); print(tree_bytes(root))")
    assert Path(VLLM_PYTHON).exists(), f"no vLLM environment at {VLLM_PYTHON}: run scripts/test (it sets it up)"
    result = subprocess.run([str(VLLM_PYTHON), "-c", script, str(tmp_path)], env={**os.environ, "PYTHONPATH": str(ARCHIVE)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert (1 << 20) + 3 <= int(result.stdout) < 2 << 20  # the length is 101 MiB
