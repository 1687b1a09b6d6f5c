"""health, the probe of the deploy and its status: one generated token through the API with its
key, and vLLM's metrics, against a stand-in for the API."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest
from dual_spark import health

from tests.net import QuietServer
from tests.programs import ARCHIVE

KEY = "the-key"
METRICS = """# HELP vllm:spec_decode_num_drafts_total Drafts.
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 30.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="tiny"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 120.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 77.0
vllm:num_requests_running{engine="0",model_name="tiny"} 2.0
vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0
"""


@pytest.fixture(scope="module")
def api():
    """vLLM's API: it generates for the right key and refuses any other with 401."""
    served = {"metrics": METRICS, "hold": 0.0, "steps": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def reply(self, status: int, body: str):
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/metrics":
                served["steps"] += served["moving"] if "moving" in served else 0  # each look sees a step more when it moves
                self.reply(200, served["metrics"] + f"vllm:generation_tokens_total {served['steps']}.0\n")
            elif self.headers["Authorization"] != f"Bearer {KEY}":
                self.reply(401, json.dumps({"error": "Unauthorized"}))
            else:
                self.reply(200, json.dumps({"data": [{"id": "tiny", "max_model_len": 512}]}))

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            time.sleep(served["hold"])  # a request before the probe's holds the engine this long
            self.reply(200, json.dumps({"usage": {"completion_tokens": 1}}))

    server = QuietServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() in 0.05 s, not 0.5
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()


def test_a_generated_token_is_the_proof(api):
    url, _ = api
    assert health.probe(url, KEY, 5) == {"ok": True, "model": "tiny", "max_model_len": 512, "status": 200, "error": None, "busy": None}
    refused = health.probe(url, "another", 5)
    assert not refused["ok"] and refused["error"] == "/v1/models answered 401: the API key is not the one on the head"


def test_metrics_are_summed_over_their_label_sets(api):
    url, served = api
    assert health.metrics(url, 5) == {"spec": {"drafts": 40, "draft_tokens": 120, "accepted": 77}, "running": 2, "waiting": 0}
    served["metrics"] = "vllm:num_requests_running 1.0\n"
    try:
        assert health.metrics(url, 5) == {"spec": None, "running": 1, "waiting": None}  # a profile that does not speculate
    finally:
        served["metrics"] = METRICS


def test_the_program_prints_one_line_without_the_key_and_says_by_its_exit(api, tmp_path):
    url, _ = api
    key_file = tmp_path / "api-key"
    for key, code in ((KEY, 0), ("another", 1)):
        key_file.write_text(key + "\n")
        result = subprocess.run([sys.executable, str(ARCHIVE), "health", "--url", url, "--key-file", str(key_file), "--metrics"],
                                capture_output=True, text=True, timeout=30)
        assert result.returncode == code and key not in result.stdout
        reading = json.loads(result.stdout)
        assert reading["ok"] == (code == 0) and reading["metrics"]["running"] == 2


def test_a_key_file_that_is_a_link_is_refused_before_the_api_is_asked(api, tmp_path):
    url, _ = api
    (tmp_path / "real").write_text(KEY + "\n")
    (tmp_path / "api-key").symlink_to(tmp_path / "real")
    result = subprocess.run([sys.executable, str(ARCHIVE), "health", "--url", url, "--key-file", str(tmp_path / "api-key")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1 and result.stdout == "" and KEY not in result.stderr
    assert result.stderr.startswith(f"health: the API key file {tmp_path / 'api-key'} is a symbolic link. Fix: remove it")


@pytest.mark.parametrize("moving", [1, 0], ids=["busy", "hung"])
def test_no_token_while_the_engine_moves_is_busy_and_while_it_stands_still_is_not(api, tmp_path, moving):
    """A probe that gets no token in time fails either way (exit 1); the line says busy, with the
    requests running and waiting, only when the engine finished a step meanwhile."""
    url, served = api
    (tmp_path / "api-key").write_text(KEY + "\n")
    served.update(hold=3.0, moving=moving)
    try:
        result = subprocess.run([sys.executable, str(ARCHIVE), "health", "--url", url, "--key-file", str(tmp_path / "api-key"),
                                 "--timeout", "1"], capture_output=True, text=True, timeout=30)
    finally:
        served.update(hold=0.0)
        served.pop("moving")
    reading = json.loads(result.stdout)
    assert result.returncode == 1 and not reading["ok"] and "timed out" in reading["error"]
    assert reading["busy"] == ({"running": 2, "waiting": 0} if moving else None)
