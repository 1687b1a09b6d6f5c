"""health, the probe of the deploy and its status: one generated token through the API with its
key, and vLLM's metrics, against a stand-in for the API."""

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from dual_spark import health

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
    served = {"metrics": METRICS}

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
                self.reply(200, served["metrics"])
            elif self.headers["Authorization"] != f"Bearer {KEY}":
                self.reply(401, json.dumps({"error": "Unauthorized"}))
            else:
                self.reply(200, json.dumps({"data": [{"id": "tiny", "max_model_len": 512}]}))

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.reply(200, json.dumps({"usage": {"completion_tokens": 1}}))

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() in 0.05 s, not 0.5
    yield f"http://127.0.0.1:{server.server_address[1]}", served
    server.shutdown()


def test_a_generated_token_is_the_proof(api):
    url, _ = api
    assert health.probe(url, KEY, 5) == {"ok": True, "model": "tiny", "max_model_len": 512, "status": 200, "error": None}
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
