"""bench.serving's Prometheus view of its run (bench/prometheus.py), against a stand-in for
Prometheus's API: the recording rules over the run's length, read as Prometheus answers them."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from bench import prometheus

ASKED: list[str] = []


@pytest.fixture(scope="module")
def api():
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            ASKED.append(parse_qs(urlparse(self.path).query)["query"][0])
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "dual_spark:decode_tokens_per_second:per_stream", "node": "spark-head", "model_name": "tiny"},
                 "values": [[1, "NaN"], [2, "30"], [3, "36"]]},
                {"metric": {"__name__": "dual_spark:spec_decode_acceptance_length:mean", "node": "spark-head", "model_name": "tiny"},
                 "values": [[1, "3.5"]]}]}}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_view_is_every_rule_over_the_run(api):
    view = prometheus.run_window(api, 41.2)
    assert ASKED[-1] == '{__name__=~"dual_spark:.+"}[42s]'
    assert view == {"url": api, "seconds": 42, "error": None, "rules": {
        "dual_spark:decode_tokens_per_second:per_stream": [{"labels": {"node": "spark-head", "model_name": "tiny"}, "mean": 33.0, "last": 36.0}],
        "dual_spark:spec_decode_acceptance_length:mean": [{"labels": {"node": "spark-head", "model_name": "tiny"}, "mean": 3.5, "last": 3.5}]}}
    assert prometheus.summary(view) == ("Prometheus over the run's 42 s (the rules' rates, averaged): decode 33.0 tok/s per stream, "
                                        "3.50 tokens per step")


def test_a_prometheus_that_does_not_answer_is_said_not_fatal():
    view = prometheus.run_window("http://127.0.0.1:9", 10, timeout=2)
    assert view["rules"] == {} and view["error"].startswith("no answer at http://127.0.0.1:9")
    assert prometheus.summary(view).startswith("Prometheus: no answer at")
