"""The deploy's recording rules and dashboards against a real vLLM: Debian's own Prometheus, run
with the flags of the deploy's drop-in (its retention) on a temporary store and a port of its own
on loopback, loads the rules the deploy writes and scrapes the CPU vLLM that tests/serving
already serves (ngram speculation, so the acceptance counters move).
After a few requests, every recording rule about vLLM and every query of every vLLM dashboard
panel returns data through Prometheus's own /api/v1/query; every `vllm:` name they use is in that
vLLM's live /metrics; no alert fires on a healthy server; and `metrics rates` (what
`tasks/status.py` runs on the head) reads them back."""

import json
import math
import re
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from layout import SCRAPE_JOBS, UNIT_FILES
from operations.observability import RULE_FILES, dashboards, objectives, observability_settings, rules_for
from tests.fake_host import site
from tests.net import free_port, wait_ready
from tests.observability import tool
from tests.programs import ARCHIVE
from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.end_to_end
INTERVAL = 1  # seconds between scrapes and rule evaluations here (the deploy's default is 15)
VLLM_NAME = re.compile(r"\bvllm:[a-z0-9_:]+")
# The objectives a site would set for this server: a CPU vLLM on two cores, timed beside the lab's
# session, takes far longer per token than a Spark (the defaults, 0.2 s and 10 s, are a Spark's).
OBJECTIVES = objectives(site("pair", settings={"slo_itl_seconds": 2.5, "slo_ttft_seconds": 40.0}).settings)


def command(directory: Path, port: int) -> list[str]:
    """The ExecStart of the deploy's drop-in for Prometheus (its flags: loopback, retention), with
    this test's binary, files and port."""
    dropin = observability_settings(site("pair"), "spark-head").files[UNIT_FILES["prometheus"]]
    [line] = [line for line in dropin.splitlines() if line.startswith("ExecStart=/")]
    flags = dict(arg.split("=", 1) for arg in shlex.split(line.removeprefix("ExecStart="))[1:])
    assert flags.pop("--web.listen-address") == "127.0.0.1:9090"
    flags |= {"--config.file": str(directory / "prometheus.yml"), "--storage.tsdb.path": str(directory / "data"),
              "--web.listen-address": f"127.0.0.1:{port}"}
    return [tool("prometheus"), *(f"{flag}={value}" for flag, value in flags.items())]


@pytest.fixture(scope="module")
def prometheus(vllm_server, tmp_path_factory):
    """Prometheus's URL, its rules the deploy's, scraping the test's vLLM as the deploy's scrapes the head's."""
    directory = tmp_path_factory.mktemp("prometheus")
    for name, text in rules_for(INTERVAL, 200000, 120, 1800, OBJECTIVES).items():
        (directory / name).write_text(text)
    target = vllm_server.removeprefix("http://")
    config = {"global": {"scrape_interval": f"{INTERVAL}s", "evaluation_interval": f"{INTERVAL}s"},
              "rule_files": list(RULE_FILES),
              "scrape_configs": [{"job_name": SCRAPE_JOBS["vllm"],
                                  "static_configs": [{"targets": [target], "labels": {"node": "spark-head", "rank": "0"}}]}]}
    (directory / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(directory / "prometheus.log", "w")
    server = subprocess.Popen(command(directory, port), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(server, f"{url}/-/ready", directory / "prometheus.log", 60)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def query(url: str, expr: str) -> list[dict]:
    answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


# The rules every request moves: finite and above 0 over a window that holds the requests.
MOVED = ("dual_spark:decode_tokens_per_second:per_stream", "dual_spark:generation_tokens_per_second:aggregate",
         "dual_spark:time_to_first_token_seconds:mean", "dual_spark:time_to_first_token_seconds:p95",
         "dual_spark:spec_decode_acceptance_length:mean", "dual_spark:spec_decode_drafts_per_second")


@pytest.fixture(scope="module")
def served(vllm_server, prometheus):
    """Once Prometheus has scraped vLLM, a few short rounds of requests, two at a time, spread over
    some seconds so that every rate window holds finished requests; then the rules evaluated over
    them (up to 30 s, until those the requests move have values)."""
    def ask(index: int) -> None:
        response = requests.post(f"{vllm_server}/v1/completions", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120,
                                 json={"model": "tiny", "prompt": f"count: 1 2 3 4 5 1 2 3 4 5 1 2 3 {index}", "max_tokens": 32,
                                       "ignore_eos": True, "temperature": 0})
        assert response.status_code == 200, response.text

    deadline = time.monotonic() + 30  # a first scrape before any request: a rate needs the counter's rise between two
    while not query(prometheus, f'up{{job="{SCRAPE_JOBS["vllm"]}"}} == 1'):
        assert time.monotonic() < deadline, "Prometheus never scraped vLLM"
        time.sleep(INTERVAL)
    for round_ in range(4):
        threads = [threading.Thread(target=ask, args=(round_ * 2 + i,)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        time.sleep(1)

    def moved() -> bool:
        values = [float(series["value"][1]) for name in MOVED for series in query(prometheus, name)]
        return len(values) >= len(MOVED) and all(math.isfinite(value) for value in values)

    deadline = time.monotonic() + 30  # a few scrapes and rule evaluations after the last request
    while not moved() and time.monotonic() < deadline:
        time.sleep(INTERVAL)
    return prometheus


def recorded(kind: str) -> list[str]:
    """The recording rules of group ``kind`` but those over the time before their window (an
    `offset`): this Prometheus is minutes old, the lab's has the history (test_48 reads them)."""
    groups = yaml.safe_load(rules_for(INTERVAL, 200000, 120, 1800, OBJECTIVES)["recording.yml"])["groups"]
    return [rule["record"] for group in groups if group["name"] == kind for rule in group["rules"] if " offset " not in rule["expr"]]


def vllm_panels() -> list[tuple[str, str, str]]:
    """(dashboard, panel, query) of every panel of the vLLM dashboards that reads vLLM; the front
    door's panels need the door, and the answers' panel the head's watch of them, which run on the
    lab only (test_48 reads them there)."""
    return [(name, panel["title"], target["expr"].replace("$node", ".+").replace("$model", ".+"))
            for name, board in dashboards().items() if name.startswith("vllm-")
            for panel in board["panels"] for target in panel["targets"]
            if not any(lab_only in target["expr"] for lab_only in ("dual_spark:door_", "dual_spark_answers_"))]


def test_every_vllm_recording_rule_returns_data(served):
    missing, values = [], {}
    for name in recorded("dual_spark_vllm"):
        result = query(served, name)
        if not result:
            missing.append(name)
        values[name] = [float(series["value"][1]) for series in result]
    print(json.dumps(values, indent=1))
    assert not missing, f"no data for {missing}"
    for name in MOVED:
        assert all(math.isfinite(value) and value > 0 for value in values[name]), (name, values[name])
    positions = query(served, "dual_spark:spec_decode_acceptance:per_position")
    assert {series["metric"]["position"] for series in positions} == {"0", "1", "2"}  # the server's three speculative tokens
    assert all(series["metric"]["node"] == "spark-head" and series["metric"]["model_name"] == "tiny" for series in positions)


def test_every_query_of_every_vllm_dashboard_panel_returns_data(served):
    empty = [(board, title, expr) for board, title, expr in vllm_panels() if not query(served, expr)]
    assert not empty, f"panels that would say 'No data': {empty}"


def test_every_vllm_name_used_is_in_the_live_metrics(vllm_server):
    live = {line.split("{")[0].split(" ")[0] for line in requests.get(f"{vllm_server}/metrics", timeout=10).text.splitlines()
            if line and not line.startswith("#")}
    used = set(VLLM_NAME.findall(json.dumps(rules_for(INTERVAL, 200000, 120, 1800, OBJECTIVES)))) | set(VLLM_NAME.findall(json.dumps(dashboards())))
    assert used and used <= live, used - live


def test_no_alert_fires_on_a_healthy_server(served):
    alerts = requests.get(f"{served}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    assert [alert["labels"]["alertname"] for alert in alerts if alert["state"] == "firing"] == ["DualSparkHeartbeat"]
    assert query(served, 'ALERTS{alertstate="firing", severity!="none"}') == []


def test_the_status_reads_the_rates_back(served):
    done = subprocess.run([sys.executable, str(ARCHIVE), "metrics", "rates", "--url", served, "--window", "60"], capture_output=True,
                          text=True, check=True, timeout=60)
    reading = json.loads(done.stdout)
    assert reading["ok"], reading
    names = {series["name"] for series in reading["series"] if series["mean"] is not None}
    assert {"dual_spark:decode_tokens_per_second:per_stream", "dual_spark:generation_tokens_per_second:aggregate",
            "dual_spark:kv_cache_usage:ratio"} <= names
    assert [alert["name"] for alert in reading["alerts"]] == ["DualSparkHeartbeat"]


def test_the_serving_benchmark_keeps_the_prometheus_view_of_its_run(served, vllm_server, tmp_path):
    """bench.serving with --prometheus: the recording rules over its run, beside its own figures."""
    done = subprocess.run([sys.executable, "-m", "bench.serving", "--url", vllm_server, "--model", "tiny", "--prompt-tokens", "300",
                           "--concurrency", "1,2", "--requests", "2", "--max-tokens", "48", "--profile", "cpu-tiny", "--prometheus", served,
                           "--out", str(tmp_path)], cwd=Path(__file__).resolve().parents[2],
                          env={"PATH": "/usr/bin:/bin", "VLLM_API_KEY": API_KEY}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    [raw] = tmp_path.glob("serving-cpu-tiny-*.json")
    view = json.loads(raw.read_text())["prometheus"]
    assert view["error"] is None and view["url"] == served and view["seconds"] >= 1
    decode = view["rules"]["dual_spark:decode_tokens_per_second:per_stream"]
    assert decode and decode[0]["mean"] > 0 and decode[0]["labels"] == {"node": "spark-head", "model_name": "tiny"}
    assert "Prometheus over the run's" in done.stdout and "decode" in done.stdout
