"""ready, verification's probe of the front door: health's one-token probe through the door, the
engine's counters read from vLLM behind it, never through the door, which holds every request
while vLLM restarts. Against stand-ins: vLLM's API and /metrics, and a door that holds every
request."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from tests.net import QuietServer, free_port
from tests.programs import ARCHIVE

KEY = "the-key"


def served(handler: dict) -> tuple[str, QuietServer]:
    server = QuietServer(("127.0.0.1", 0), type("Handler", (BaseHTTPRequestHandler,), {"log_message": lambda self, *args: None, **handler}))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}", server


def answer(self, body: dict | str) -> None:
    data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture
def stand_ins():
    """vLLM (it generates; its /metrics says a request runs, each read one more token), and a
    door that holds each request 30 s, counting what it was asked."""
    asked, tokens = [], [0]

    def held(self):
        asked.append(self.path)
        time.sleep(30)

    def get(self):
        if self.path == "/metrics":
            tokens[0] += 1
            answer(self, f"vllm:num_requests_running 1\nvllm:generation_tokens_total {tokens[0]}\n")
        else:
            answer(self, {"data": [{"id": "tiny", "max_model_len": 512}]})

    vllm, vllm_server = served({"do_GET": get, "do_POST": lambda self: (self.rfile.read(int(self.headers["Content-Length"])),
                                                                        answer(self, {"usage": {"completion_tokens": 1}}))})
    door, door_server = served({"do_GET": held, "do_POST": held})
    yield vllm, door, asked
    vllm_server.shutdown()
    door_server.shutdown()


def ready(tmp_path, url: str, backend: str, timeout: int = 20) -> tuple[int, dict, float]:
    (tmp_path / "api-key").write_text(KEY + "\n")
    started = time.monotonic()
    result = subprocess.run([sys.executable, str(ARCHIVE), "ready", "--url", url, "--backend", backend, "--key-file", str(tmp_path / "api-key"),
                             "--timeout", str(timeout)], capture_output=True, text=True, timeout=60)
    assert KEY not in result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout), time.monotonic() - started


def test_a_door_that_serves_is_ready(stand_ins, tmp_path):
    vllm, _, _ = stand_ins
    code, reading, _ = ready(tmp_path, vllm, vllm)
    assert (code, reading) == (0, {"ok": True, "model": "tiny", "max_model_len": 512, "status": 200, "error": None, "busy": None})


def test_a_door_that_holds_the_probe_is_waited_for_once_and_the_engine_read_behind_it(stand_ins, tmp_path):
    """The door keeps the probe past its timeout: the one wait is the probe's, and busy comes
    from vLLM's own counters (it finished steps on a running request meanwhile)."""
    vllm, door, asked = stand_ins
    code, reading, took = ready(tmp_path, door, vllm, timeout=2)
    assert code == 1 and asked == ["/v1/models"] and "timed out" in reading["error"]
    assert reading["busy"] == {"running": 1, "waiting": 0} and took < 10


def test_a_vllm_down_behind_the_door_costs_the_probe_alone(stand_ins, tmp_path):
    _, door, asked = stand_ins
    code, reading, took = ready(tmp_path, door, f"http://127.0.0.1:{free_port()}", timeout=2)
    assert code == 1 and asked == ["/v1/models"] and reading["busy"] is None and took < 10
