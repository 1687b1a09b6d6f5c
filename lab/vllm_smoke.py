"""Prove the CPU vLLM environment generates a token on this machine, the way the lab runs it:
the tiny model (tiny_model.py) in a temporary directory, served with the lab's arguments and
environment (config.VLLM_ARGS, VLLM_ENV), one completion on loopback. Its vLLM cache is the
environment's vllm-cache (config.VLLM_CACHE), which tests/serving then reads (the lab's nodes use the deploy's). Run by
scripts/setup-vllm.sh with the environment's Python, once; on failure it prints the server's
last lines and exits 1.

    python -m lab.vllm_smoke
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from lab.config import VLLM_ARGS, VLLM_ENV
from lab.tiny_model import build

DEADLINE = 150  # seconds for the server to load the tiny model and answer
LAST_LINES = 25


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def one_token(url: str) -> str | None:
    """None when a token came back, "" while the server does not listen yet, else its error."""
    request = urllib.request.Request(f"{url}/v1/completions", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"model": "tiny", "prompt": "ok", "max_tokens": 1}).encode())
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            tokens = json.load(response)["usage"]["completion_tokens"]
    except urllib.error.HTTPError as error:
        return f"the completion answered {error.code}: {error.read()[:200].decode(errors='replace')}"
    except OSError:
        return ""
    return None if tokens >= 1 else "the completion had no token"


def smoke(work: Path) -> tuple[str | None, list[str]]:
    """None when a token came back, else what failed; and the server's last lines."""
    build(work / "model")
    port = free_port()
    env = {**os.environ, **VLLM_ENV, "VLLM_CACHE_ROOT": str(Path(sys.prefix) / "vllm-cache"), "HF_HUB_OFFLINE": "1"}
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(work / "model"),
               "--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512",
               *VLLM_ARGS]
    log = work / "server.log"
    with open(log, "w") as handle:
        server = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    started, failure = time.monotonic(), f"no token within {DEADLINE} s"
    try:
        while time.monotonic() - started < DEADLINE:
            if server.poll() is not None:
                failure = f"the server exited with {server.returncode}"
                break
            answer = one_token(f"http://127.0.0.1:{port}")
            if answer != "":
                failure = answer
                break
            time.sleep(2)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, 15)
            server.wait(timeout=60)
    return failure, log.read_text(errors="replace").splitlines()[-LAST_LINES:]


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="vllm-smoke-") as work:
        failure, tail = smoke(Path(work))
    flags = " ".join(VLLM_ARGS)
    if failure:
        print("".join(f"    {line}\n" for line in tail), end="", file=sys.stderr)
        print(f"error: the CPU vLLM did not generate a token on this machine ({flags}): {failure}; "
              "the server's last lines are above", file=sys.stderr)
        sys.exit(1)
    print(f"--> The CPU vLLM generated a token on this machine ({flags})")


if __name__ == "__main__":
    main()
