"""ready, verification's probe of the front door: vLLM behind it asked first, so that a vLLM down
is said at once instead of after the door's hold; else health's one-token probe through the door.
Against stand-ins: vLLM's API, and a door that holds every request."""

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


def answer(self, body: dict) -> None:
    data = json.dumps(body).encode()
    self.send_response(200)
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)


@pytest.fixture
def stand_ins():
    """vLLM (it generates), and a door that holds each request 30 s, counting what it was asked."""
    asked = []

    def held(self):
        asked.append(self.path)
        time.sleep(30)

    vllm, vllm_server = served({"do_GET": lambda self: answer(self, {"data": [{"id": "tiny", "max_model_len": 512}]}),
                                "do_POST": lambda self: (self.rfile.read(int(self.headers["Content-Length"])),
                                                         answer(self, {"usage": {"completion_tokens": 1}}))})
    door, door_server = served({"do_GET": held, "do_POST": held})
    yield vllm, door, asked
    vllm_server.shutdown()
    door_server.shutdown()


def ready(tmp_path, url: str, backend: str, timeout: int = 20) -> tuple[int, dict]:
    (tmp_path / "api-key").write_text(KEY + "\n")
    result = subprocess.run([sys.executable, str(ARCHIVE), "ready", "--url", url, "--backend", backend, "--key-file", str(tmp_path / "api-key"),
                             "--timeout", str(timeout)], capture_output=True, text=True, timeout=60)
    assert KEY not in result.stdout + result.stderr
    return result.returncode, json.loads(result.stdout)


def test_a_vllm_down_behind_the_door_is_said_at_once_and_the_door_is_not_asked(stand_ins, tmp_path):
    _, door, asked = stand_ins
    nothing = f"http://127.0.0.1:{free_port()}"
    code, reading = ready(tmp_path, door, nothing)
    assert code == 1 and not reading["ok"] and asked == []
    assert reading["error"].startswith(f"vLLM does not answer behind the front door at {nothing} (") and reading["error"].endswith(
        "it restarts or is down; the door holds clients' requests meanwhile")


def test_a_vllm_that_answers_leaves_the_verdict_to_the_door(stand_ins, tmp_path):
    vllm, door, asked = stand_ins
    assert ready(tmp_path, vllm, vllm) == (0, {"ok": True, "model": "tiny", "max_model_len": 512, "status": 200, "error": None, "busy": None})
    code, reading = ready(tmp_path, door, vllm, timeout=1)  # vLLM up, the door keeping the request: the door's failure
    assert code == 1 and asked == ["/v1/models"] and "timed out" in reading["error"]
