"""Observability on the lab pair, for real: the deploy installs Debian's Prometheus and node
exporter from the nodes' (offline) package mirror and configures them; after a short benchmark,
every recording rule and every query of every dashboard panel returns data from the lab's real
Prometheus, every `vllm:` name they use is in the lab vLLM's /metrics, and the textfile metrics
read the lab's emulated GB10 and rails. A worker's vLLM killed (again and again, for as long as
the alert takes to fire) is seen: its alert goes pending, fires, and clears once the pair heals.
A real browser (Debian's headless Chromium) renders Prometheus's graph of decode tok/s through
the tunnel. A second converge changes nothing, --dry shows a change's diff, and the key is in no
file Prometheus or the collector reads or writes. Grafana is not run here (no registry has it).
The module runs before test_50's faults, whose restarts in the last hour would fire the
restart-loop alert it expects silent.

The lab's site scrapes every lab.config.METRICS_INTERVAL seconds (the deploy's default is 15), so
that alerts fire within half a minute."""

import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from bench.remote import forward, head_of
from lab import faults
from lab import site as lab_site
from lab.config import HEAD, METRICS_INTERVAL, NODES, WORKER
from lab.processes import in_node
from layout import COLLECTOR_STATE, TEXTFILE
from operations.observability import dashboards, rule_files
from site_config import load_site
from tests.e2e.conftest import REPO, SITE, pyinfra, serving_after, site_variant
from tests.e2e.test_10_converge import changed_operations

pytestmark = pytest.mark.end_to_end
ARTIFACTS = Path(os.environ.get("SPARKLAB_ARTIFACTS", "/tmp/dual-spark-artifacts"))
VLLM_NAME = re.compile(r"\bvllm:[a-z0-9_:]+")
API_KEY_FILE = "/var/lib/dual-spark/api-key"


@pytest.fixture(scope="module")
def prometheus(converged):
    """The head's Prometheus through an SSH tunnel, as an owner reaches it."""
    cluster = load_site(SITE)
    with head_of(cluster) as client, forward(client, "127.0.0.1", cluster.settings.prometheus_port) as port:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while requests.get(f"{url}/-/ready", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "Prometheus not ready"
            time.sleep(1)
        yield url


def query(url: str, expr: str) -> list[dict]:
    answer = requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert answer["status"] == "success", (expr, answer)
    return answer["data"]["result"]


def listening(node, port: int) -> list[str]:
    lines = in_node(node.dir, "ss", "-Hltn", f"sport = :{port}", capture_output=True).stdout.splitlines()
    return sorted(line.split()[3].rsplit(":", 1)[0] for line in lines if len(line.split()) >= 4)


def active(node, unit: str) -> str:
    return in_node(node.dir, "systemctl", "is-active", unit, capture_output=True, check=False).stdout.strip()


def test_prometheus_listens_on_loopback_and_each_exporter_on_its_rail(converged):
    assert re.search(r"Run Prometheus on the head \(127\.0\.0\.1:9090, 15 days or 8 GiB\)", converged.stdout), converged.stdout
    for node in NODES.values():
        assert active(node, "prometheus-node-exporter") == "active" and active(node, "dual-spark-metrics") == "active", node.name
        assert listening(node, 9100) == [f"10.0.0.{1 if node is HEAD else 2}"], node.name  # never the management LAN
    assert active(HEAD, "prometheus") == "active" and listening(HEAD, 9090) == ["127.0.0.1"]
    assert active(WORKER, "prometheus") != "active"
    assert "--storage.tsdb.retention.size=8GB" in (HEAD.root / "etc/systemd/system/prometheus.service.d/50-dual-spark.conf").read_text()


def test_every_target_is_up(prometheus):
    deadline = time.monotonic() + 60
    while True:
        targets = requests.get(f"{prometheus}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        health = {(target["labels"]["job"], target["labels"]["node"]): target["health"] for target in targets}
        if set(health.values()) == {"up"} or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert health == {("prometheus", "spark-head"): "up", ("vllm", "spark-head"): "up", ("door", "spark-head"): "up",
                      ("door_counts", "spark-head"): "up",
                      ("node", "spark-head"): "up", ("node", "spark-worker"): "up"}, targets


@pytest.fixture(scope="module")
def benchmarked(prometheus, tmp_path_factory):
    """A short bench.serving run through the site (it records Prometheus's view of its run); then
    the rules evaluated over it."""
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run([sys.executable, "-m", "bench.serving", "--site", str(SITE), "--prompt-tokens", "300",
                           "--concurrency", "1,2", "--requests", "1", "--max-tokens", "64", "--out", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    time.sleep(3 * METRICS_INTERVAL)
    [raw] = out.glob("serving-*.json")
    return json.loads(raw.read_text()), done.stdout


def test_every_recording_rule_and_every_panel_query_returns_data(prometheus, benchmarked):
    recorded = [rule["record"] for group in yaml.safe_load(rule_files(load_site(SITE))["recording.yml"])["groups"] for rule in group["rules"]]
    empty = [name for name in recorded if not query(prometheus, name)]
    assert not empty, f"recording rules without data: {empty}"
    panels = [(board, panel["title"], target["expr"].replace("$node", ".+").replace("$model", ".+")) for board, spec in dashboards().items()
              for panel in spec["panels"] for target in panel["targets"]]
    empty = [(board, title) for board, title, expr in panels if not query(prometheus, expr)]
    assert not empty, f"panels that would say 'No data': {empty}"
    nodes = {series["metric"]["node"] for series in query(prometheus, "dual_spark:rail_transmit_bytes_per_second")}
    assert nodes == {"spark-head", "spark-worker"}


def test_the_benchmark_kept_prometheus_view_of_its_run(benchmarked):
    record, stdout = benchmarked
    view = record["prometheus"]
    assert view["error"] is None and view["rules"]["dual_spark:decode_tokens_per_second:per_stream"][0]["mean"] > 0, view
    assert "Prometheus over the run's" in stdout


def test_every_vllm_name_used_is_in_the_lab_vllms_metrics(converged):
    text = in_node(HEAD.dir, "python3", "-c", "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8888/metrics').read().decode())",
                   capture_output=True).stdout
    live = {line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and not line.startswith("#")}
    used = set(VLLM_NAME.findall(json.dumps(rule_files(load_site(SITE))))) | set(VLLM_NAME.findall(json.dumps(dashboards())))
    assert used and used <= live, used - live


def test_the_textfile_reads_the_emulated_gpu_memory_rails_and_state(prometheus, benchmarked):
    power = {series["metric"]["node"]: (series["metric"]["name"], float(series["value"][1]))
             for series in query(prometheus, "dual_spark_gpu_power_watts")}
    assert power == {"spark-head": ("NVIDIA GB10", 4.31), "spark-worker": ("NVIDIA GB10", 4.31)}  # lab/factory/usr/bin/nvidia-smi
    memory = query(prometheus, "dual_spark_unified_memory_available_bytes")
    assert {round(float(series["value"][1]) / 2**30, 1) for series in memory} == {117.4}  # lab/hardware.py's MemAvailable
    speeds = query(prometheus, "dual_spark_rail_speed_mbps")
    assert sorted((s["metric"]["node"], s["metric"]["netdev"], float(s["value"][1])) for s in speeds) == sorted(
        (node, netdev, 200000.0) for node in ("spark-head", "spark-worker") for netdev in ("enp1s0f0np0", "enP2p1s0f0np0"))
    assert {s["metric"]["node"] for s in query(prometheus, 'dual_spark_rail_roce_port_active == 1')} == {"spark-head", "spark-worker"}
    # The ranks' traffic crosses rail 0 as TCP (the lab's vLLM talks gloo): the netdev counts it, and
    # the RDMA port, which would carry NCCL's on a Spark, counts none. The lab cannot show RoCE traffic.
    assert query(prometheus, 'dual_spark:rail_transmit_bytes_per_second{rail="0", path="netdev"} > 0')
    rdma = query(prometheus, 'dual_spark:rail_transmit_bytes_per_second{rail="0", path="rdma"}')
    assert rdma and all(float(series["value"][1]) == 0 for series in rdma), rdma
    [info] = query(prometheus, 'dual_spark_serving_info{node="spark-head"}')
    assert info["metric"]["profile"] == "adaptive" and info["metric"]["model"] == "/srv/lab-models/tiny-llama"
    assert query(prometheus, "dual_spark_collector_errors") == []


def test_the_collector_started_on_a_record_it_never_wrote_sets_it_aside_and_keeps_writing(converged):
    """The worker's collector restarted on a record of starts that is not its own (a hand, a full
    disk): it sets the record aside, says so, and goes on writing its textfile; no crash loop."""
    record, textfile = WORKER.root / COLLECTOR_STATE.lstrip("/"), WORKER.root / TEXTFILE.lstrip("/")
    aside = record.with_name(f"{record.name}.unusable")
    aside.unlink(missing_ok=True)
    in_node(WORKER.dir, "systemctl", "stop", "dual-spark-metrics")
    record.write_text('{"starts": "seven"}')  # in place: its owner and mode stay
    restarted = time.time()
    in_node(WORKER.dir, "systemctl", "start", "dual-spark-metrics")
    deadline = time.monotonic() + 6 * METRICS_INTERVAL
    while not (aside.exists() and textfile.stat().st_mtime > restarted + METRICS_INTERVAL):
        assert time.monotonic() < deadline, f"the collector wrote no textfile past its restart (set aside: {aside.exists()})"
        time.sleep(1)
    assert aside.read_text() == '{"starts": "seven"}' and active(WORKER, "dual-spark-metrics") == "active"
    assert json.loads(record.read_text())["starts"] >= 0  # its own record again


def test_status_shows_the_last_five_minutes_and_no_alert(benchmarked):
    result = pyinfra("-y", task="tasks/status.py")
    assert result.returncode == 0, result.stdout
    assert re.search(r"spark-head\s+metrics \(last 5 min\)\s+PASS\s+decode [\d.]+ tok/s per stream", result.stdout), result.stdout
    assert re.search(r"spark-head\s+alerts\s+PASS\s+none firing", result.stdout), result.stdout


def test_a_killed_worker_is_seen_pending_then_firing_then_cleared(prometheus, benchmarked):
    """The worker's vLLM killed, and killed again each time its watchdog starts it, until the
    alert on the head's API (down for 4 scrapes) has gone pending and fired: the lab's pair heals
    a single kill in less than that (test_50 times it). Left alone, the pair serves again, and
    the alert clears."""
    assert serving_after(60) < 60
    seen, healed = [], threading.Event()

    def watch() -> None:
        while not healed.wait(1):
            states = [alert["state"] for alert in requests.get(f"{prometheus}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
                      if alert["labels"]["alertname"] == "DualSparkApiDown"]
            seen.extend(state for state in states if not seen or seen[-1] != state)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        assert faults.kill(WORKER, "vllm serve")
        deadline = time.monotonic() + 240
        while "firing" not in seen:
            assert time.monotonic() < deadline, f"DualSparkApiDown went {seen} in four minutes of the worker's vLLM killed"
            time.sleep(2)
            faults.kill(WORKER, "vllm serve")
        print(f"the API down alert fired; the pair serves again {serving_after(600):.0f} s later")
    finally:
        healed.set()
        watcher.join()
    assert seen[:2] == ["pending", "firing"], f"DualSparkApiDown went {seen} while the pair was down"
    deadline = time.monotonic() + 120
    while query(prometheus, 'ALERTS{alertname="DualSparkApiDown"}'):
        assert time.monotonic() < deadline, "DualSparkApiDown still pending or firing two minutes after the pair serves"
        time.sleep(2)
    starts = query(prometheus, 'dual_spark_watchdog_starts_total{node="spark-worker"}')
    assert starts and float(starts[0]["value"][1]) >= 1
    restarts = query(prometheus, 'dual_spark_vllm_container_restarts_total{node="spark-worker"}')  # Docker's count: not a deploy's
    assert restarts and float(restarts[0]["value"][1]) >= 1, restarts


def containers() -> dict[str, str]:
    """Each node's vLLM container, its ID and start: another after any restart."""
    return {node.hostname: in_node(node.dir, "docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}}", "dual-spark-vllm",
                                   capture_output=True).stdout.strip() for node in NODES.values()}


def firing_answers(prometheus: str) -> dict[str, str]:
    """The canaries DualSparkAnswersChanged fires for, with the token each changed from."""
    firing = {alert["metric"]["canary"] for alert in query(prometheus, 'ALERTS{alertname="DualSparkAnswersChanged", alertstate="firing"}')}
    tokens = {found["metric"]["canary"]: found["value"][1] for found in query(prometheus, "dual_spark_answers_first_difference_tokens")}
    return {name: tokens.get(name, "?") for name in firing}


def test_answers_that_change_while_serving_fire_an_alert_and_restart_nothing(prometheus, benchmarked):
    """The lab's fault switched on under the running vLLM (its file written in the head's
    container): every answer goes wrong from token 3 while the API stays green. The head's watch
    of the answers, asked for a round now (its restart), finds each watched canary changed twice
    in a row; the alert fires for each, with the token; nothing restarts. The fault gone, the next
    round agrees and the alert clears."""
    assert serving_after(120) < 120
    assert active(HEAD, "dual-spark-answers") == "active"
    before = containers()
    log = HEAD.root / "var/log/sparklab-units/dual-spark-answers.service.log"
    in_node(HEAD.dir, "docker", "exec", "dual-spark-vllm", "sh", "-c", f"echo shift:3 > {lab_site.ANSWER_FAULT_FILE}")
    try:
        in_node(HEAD.dir, "systemctl", "restart", "dual-spark-answers")
        deadline = time.monotonic() + 120
        while firing_answers(prometheus) != {"code": "3", "fabric": "3"}:
            assert time.monotonic() < deadline, f"answers changed, and in two minutes the alert fired for {firing_answers(prometheus)}; " \
                                                f"the watch said: {log.read_text()[-2000:] if log.exists() else 'nothing'}"
            time.sleep(2)
    finally:
        in_node(HEAD.dir, "docker", "exec", "dual-spark-vllm", "rm", "-f", lab_site.ANSWER_FAULT_FILE)
    assert "answers: answers changed while serving: code from token 3, fabric from token 3" in log.read_text()
    assert query(prometheus, 'up{job="vllm"} == 1'), "the API went down: the fault was to keep it green"
    in_node(HEAD.dir, "systemctl", "restart", "dual-spark-answers")
    deadline = time.monotonic() + 120
    while query(prometheus, 'ALERTS{alertname="DualSparkAnswersChanged"}'):
        assert time.monotonic() < deadline, "DualSparkAnswersChanged still firing two minutes after the answers came right"
        time.sleep(2)
    assert containers() == before, "a change of the answers restarted vLLM: a person decides, not the watch"


def test_a_real_browser_shows_the_decode_series(prometheus, benchmarked):
    """Debian's headless Chromium opens Prometheus's graph of decode tok/s per stream through the
    tunnel (the classic UI: Debian's package has no React one); the rendered legend names the
    series and its node (the screenshot is kept as an artefact)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "no chromium: scripts/test installs Debian's"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    url = f"{prometheus}/classic/graph?g0.expr=dual_spark%3Adecode_tokens_per_second%3Aper_stream&g0.tab=0&g0.range_input=15m"
    browse = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--window-size=1400,900",
              "--virtual-time-budget=15000"]
    dom = subprocess.run([*browse, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr
    assert "dual_spark:decode_tokens_per_second:per_stream" in dom.stdout and "spark-head" in dom.stdout, dom.stdout[-3000:]
    shot = ARTIFACTS / "prometheus-decode-per-stream.png"
    subprocess.run([*browse, f"--screenshot={shot}", url], capture_output=True, text=True, timeout=120, check=True)
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")


def test_a_second_converge_changes_nothing_and_dry_shows_a_change(converged, tmp_path):
    again = pyinfra("-y")
    assert again.returncode == 0 and changed_operations(again.stdout) == 0, again.stdout
    before = (HEAD.root / "etc/systemd/system/prometheus.service.d/50-dual-spark.conf").read_text()
    longer = site_variant(tmp_path, prometheus_retention_days=30)
    dry = pyinfra("--dry", site=longer)
    assert dry.returncode == 0, dry.stdout
    assert "--storage.tsdb.retention.time=30d" in dry.stdout and "Will restart prometheus: its drop-in changed" in dry.stdout
    assert (HEAD.root / "etc/systemd/system/prometheus.service.d/50-dual-spark.conf").read_text() == before


def test_the_key_is_in_no_file_of_prometheus_or_the_collector(converged):
    key = (HEAD.root / API_KEY_FILE.lstrip("/")).read_text().strip()
    assert key and key not in converged.stdout
    for node in NODES.values():
        for folder in ("etc/prometheus", "var/lib/prometheus/node-exporter", "etc/systemd/system", "var/log/sparklab-units"):
            for path in (node.root / folder).rglob("*"):
                if path.is_file() and not path.is_symlink():
                    assert key not in path.read_text(errors="replace"), path
