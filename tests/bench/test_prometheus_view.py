"""bench.serving's Prometheus view of its run (bench/prometheus.py), against a stand-in for
Prometheus's API: the recording rules over the run's length, read as Prometheus answers them."""

from urllib.parse import parse_qs, urlparse

import pytest

from bench import prometheus
from tests.net import json_server

ASKED: list[str] = []


@pytest.fixture(scope="module")
def api():
    def answer(path: str) -> dict:
        ASKED.append(parse_qs(urlparse(path).query)["query"][0])
        return {"status": "success", "data": {"resultType": "matrix", "result": [
            {"metric": {"__name__": "dual_spark:decode_tokens_per_second:per_stream", "node": "spark-head", "model_name": "tiny"},
             "values": [[1, "NaN"], [2, "30"], [3, "36"]]},
            {"metric": {"__name__": "dual_spark:spec_decode_acceptance_length:mean", "node": "spark-head", "model_name": "tiny"},
             "values": [[1, "3.5"]]}]}}

    with json_server(answer) as url:
        yield url


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
