"""What the deploy writes for Prometheus, Alertmanager and Grafana, checked by the real promtool
and amtool: the configuration and rules it renders for a pair and for four nodes; every alert made
to fire, and to stay silent, by series that stand for the faults it names (`promtool test rules`);
the recording rules computing what they say on known series; every name used where it is defined;
every dashboard's queries valid PromQL over the recording rules; Alertmanager's configuration,
its routes and its inhibitions against the alerts they name. One promtool run per fault or case, so
that a failure names it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from facts.alerting import AlertmanagerState, shown
from facts.combine import split
from files.dual_spark.silence import QUIET as SILENCED
from layout import (
    ALERTMANAGER_CONFIG,
    COLLECTOR_USER,
    GRAFANA_DATASOURCE_UID,
    ITL_BUCKETS,
    PROMETHEUS_DIR,
    TEXTFILE_DIR,
    TTFT_BUCKETS,
    UNIT_FILES,
)
from operations.observability import (
    HEARTBEAT,
    NOBODY,
    RECEIVER,
    alertmanager_config,
    alertmanager_timings,
    dashboards,
    grafana_files,
    observability_settings,
    rule_files,
    window,
)
from tests.fake_host import load, site
from tests.observability import amtool, promtool, tool

REPO = Path(__file__).resolve().parents[1]
VLLM_METRICS = REPO / "tests/bench/fixtures/vllm_metrics.txt"  # a CPU vLLM 0.32's /metrics, as the project pins it
# The front door's /metrics from Debian 12's HAProxy 2.6.12: the rendered door run as in tests/programs/test_door.py,
# after a request served once vLLM started, one refused past the bound, one held out while drained, vLLM's own 500
DOOR_METRICS = REPO / "tests/programs/fixtures/door_metrics.txt"
# The door's own counts (files/door/counts.lua) as the rendered door served them at /counts, clients deploy and laptop
# (tests/programs/test_door.py checks that the live answer has the same series)
DOOR_COUNTS = REPO / "tests/programs/fixtures/door_counts.txt"
INTERVAL = 15  # the default metrics_interval_seconds: the series below step by it
RECORDED = re.compile(r"\bdual_spark:[a-z0-9_:]+")
VLLM_NAME = re.compile(r"\bvllm:[a-z0-9_:]+")
HAPROXY_SELECTOR = re.compile(r"\b(haproxy_[a-z_]+)\{([^}]*)\}")
DOOR_COUNT = re.compile(r"\bdual_spark_door_[a-z_]+")


def written(tmp: Path, name: str) -> Path:
    """The head's Prometheus files of tests/sites/<name>.toml, written under tmp/<name>/."""
    files = observability_settings(site(name), "spark-head").files
    out = tmp / name
    out.mkdir()
    for path, text in files.items():
        if path.startswith(PROMETHEUS_DIR + "/"):
            (out / Path(path).name).write_text(text)
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("prometheus")
    return {name: written(tmp, name) for name in ("pair", "four")}


def rules() -> dict[str, dict]:
    return {name: yaml.safe_load(text) for name, text in rule_files(site("pair")).items()}


def recorded_names() -> set[str]:
    return {rule["record"] for file in rules().values() for group in file["groups"] for rule in group["rules"] if "record" in rule}


def test_promtool_takes_the_configuration_and_rules_of_a_pair_and_of_four_nodes(rendered):
    output = promtool("check", "config", *(str(path / "prometheus.yml") for path in rendered.values()))
    assert output.count("SUCCESS: 3 rule files found") == 2
    config = yaml.safe_load((rendered["four"] / "prometheus.yml").read_text())
    nodes = next(job for job in config["scrape_configs"] if job["job_name"] == "node")["static_configs"]
    assert [entry["targets"] for entry in nodes] == [[f"10.0.0.{rank + 1}:9100"] for rank in range(4)]  # rail 0, never the LAN
    vllm = next(job for job in config["scrape_configs"] if job["job_name"] == "vllm")["static_configs"]
    assert vllm == [{"targets": ["127.0.0.1:8889"], "labels": {"node": "spark-head", "rank": "0"}}]  # rank 0 alone, behind the door
    door = next(job for job in config["scrape_configs"] if job["job_name"] == "door")["static_configs"]
    assert door == [{"targets": ["127.0.0.1:8405"], "labels": {"node": "spark-head"}}]
    counts = next(job for job in config["scrape_configs"] if job["job_name"] == "door_counts")  # the door's Lua, beside HAProxy's exporter
    assert counts["metrics_path"] == "/counts" and counts["static_configs"] == door


def test_prometheus_listens_on_loopback_with_bounded_retention():
    settings = observability_settings(site("pair", {"prometheus_retention_days": 30, "prometheus_retention_gib": 20}), "spark-head")
    start = [line for line in settings.files[UNIT_FILES["prometheus"]].splitlines() if line.startswith("ExecStart=/")]
    assert len(start) == 1 and "--web.listen-address=127.0.0.1:9090" in start[0]
    assert "--storage.tsdb.retention.time=30d" in start[0] and "--storage.tsdb.retention.size=20GB" in start[0]
    worker = observability_settings(site("pair"), "spark-worker").files
    assert UNIT_FILES["prometheus"] not in worker and not any(path.startswith(PROMETHEUS_DIR) for path in worker)
    assert "--web.listen-address=10.0.0.2:9100" in worker[UNIT_FILES["node_exporter"]]  # its rail 0 address


def unit_settings(text: str) -> dict[str, list[str]]:
    """A unit file's [Service] keys, each with its values in order."""
    found: dict[str, list[str]] = {}
    for line in text.split("[Service]", 1)[1].split("\n[", 1)[0].splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


@pytest.mark.parametrize("hostname", ["spark-head", "spark-worker"])
def test_the_collector_runs_as_its_own_user_and_may_write_only_what_it_writes(hostname):
    """The collector's sandbox (its user, ProtectSystem=strict, ReadWritePaths=) against what its
    command line says it writes: the textfile and its own record, both in its own directory, which
    the node exporter reads. systemd enforces the sandbox on a Spark; the lab's systemctl does not,
    so this test holds the two together."""
    settings = observability_settings(site("pair"), hostname)
    unit = unit_settings(settings.files[UNIT_FILES["collector"]])
    command = unit["ExecStart"][-1].split()
    written = {Path(command[command.index(flag) + 1]).parent for flag in ("--out", "--state")}
    assert unit["User"] == [COLLECTOR_USER] and unit["Group"] == [COLLECTOR_USER] and "root" not in unit["User"]
    assert unit["ProtectSystem"] == ["strict"] and unit["NoNewPrivileges"] == ["true"] and unit["CapabilityBoundingSet"] == [""]
    assert {Path(path) for path in unit["ReadWritePaths"]} == written == {Path(TEXTFILE_DIR)}
    assert "docker" not in settings.files[UNIT_FILES["collector"]].lower()  # Docker's socket is root's in all but name
    exporter = unit_settings(settings.files[UNIT_FILES["node_exporter"]])["ExecStart"][-1]
    assert f"--collector.textfile.directory={TEXTFILE_DIR}" in exporter.split()


def test_the_watch_of_the_answers_runs_on_the_head_alone_as_the_collectors_user_with_the_key_as_a_credential():
    """Its sandbox is the collector's, with loopback its only network: it writes its textfile in
    the collector's directory alone, reads the key from the credential systemd hands it (the key's
    path in no argument, its value in no file the deploy writes), and asks vLLM behind the door."""
    pair = site("pair")
    assert UNIT_FILES["answers"] not in observability_settings(pair, "spark-worker").files
    unit = unit_settings(observability_settings(pair, "spark-head").files[UNIT_FILES["answers"]])
    command = unit["ExecStart"][-1].split()
    assert unit["User"] == unit["Group"] == [COLLECTOR_USER] and unit["CapabilityBoundingSet"] == [""]
    assert unit["ProtectSystem"] == ["strict"] and unit["ReadWritePaths"] == [TEXTFILE_DIR]
    assert Path(command[command.index("--out") + 1]).parent == Path(TEXTFILE_DIR)
    assert unit["LoadCredential"] == ["api-key:/var/lib/dual-spark/api-key"] and command[command.index("--key-file") + 1] == "%d/api-key"
    assert unit["IPAddressAllow"] == ["localhost"] and unit["IPAddressDeny"] == ["any"]
    assert command[command.index("--url") + 1] == f"http://127.0.0.1:{pair.settings.vllm_port}"
    watched = [command[i + 1] for i, word in enumerate(command) if word == "--canary"]
    assert watched == sorted(name for name, canary in pair.canaries.items() if canary.watch) and watched


def labels_of(series: str) -> dict[str, str]:
    name, _, rest = series.partition("{")
    return {"__name__": name, **dict(re.findall(r'(\w+)="([^"]*)"', rest))}


def annotations(alert: dict, labels: dict) -> dict:
    """An alert's annotations as Prometheus fills its templates for these labels, and its value as
    ``labels["$value"]`` says Prometheus shows it (through the template's function, if any)."""
    def filled(match: re.Match) -> str:
        return labels.get(match.group(1), "") if match.group(1) else labels["$value"]

    return {key: re.sub(r"{{ \$labels\.(\w+) }}|{{ \$value(?: \| \w+)? }}", filled, text) for key, text in alert.get("annotations", {}).items()}


HEAD, WORKER = {"node": "spark-head"}, {"node": "spark-worker"}
HEAD_NODE, WORKER_NODE = {**HEAD, "job": "node", "instance": "x:9100"}, {**WORKER, "job": "node", "instance": "x:9100"}
GB10 = {"gpu": "0", "name": "NVIDIA GB10"}
ROOT = {"mountpoint": "/", "device": "/dev/nvme0n1p2", "fstype": "ext4"}
STORE = {"model_dir": "/var/lib/dual-spark/model", "mountpoint": "/"}
# The node exporter's `file` label of the textfile: its path (node exporter 1.6 on), or its name (before)
TEXTFILE_LABEL = {HEAD["node"]: {"file": "/var/lib/dual-spark-metrics/dual-spark.prom"}, WORKER["node"]: {"file": "dual-spark.prom"}}
VLLM = {**HEAD, "job": "vllm", "instance": "127.0.0.1:8888"}
MODEL = {**HEAD, "model_name": "tiny"}
DOOR = {**HEAD, "job": "door", "instance": "127.0.0.1:8405"}
COUNTS = {**HEAD, "job": "door_counts", "instance": "127.0.0.1:8405"}
API, BACKEND, SERVER = {**DOOR, "proxy": "api"}, {**DOOR, "proxy": "vllm"}, {**DOOR, "proxy": "vllm", "server": "vllm"}


def s(name: str, labels: dict, values: str) -> dict:
    inside = ",".join(f'{key}="{value}"' for key, value in labels.items())
    return {"series": f"{name}{{{inside}}}", "values": values}


def serving(minutes: int = 20) -> list[dict]:
    """A healthy head: its API up, two requests running, tokens and drafts moving, half the draft
    tokens accepted, a third of the KV cache in use; both nodes' exporters and rails fine."""
    steps = minutes * 60 // INTERVAL
    engine = {**MODEL, "job": "vllm", "instance": "127.0.0.1:8888", "engine": "0"}
    series = [s("up", VLLM, f"1x{steps}"), s("vllm:num_requests_running", engine, f"2x{steps}"),
              s("vllm:num_requests_waiting", engine, f"0x{steps}"), s("vllm:generation_tokens_total", engine, f"0+400x{steps}"),
              s("vllm:kv_cache_usage_perc", engine, f"0.3x{steps}"), s("vllm:spec_decode_num_drafts_total", engine, f"0+100x{steps}"),
              s("vllm:spec_decode_num_draft_tokens_total", engine, f"0+300x{steps}"),
              s("vllm:spec_decode_num_accepted_tokens_total", engine, f"0+150x{steps}")]
    for node in (HEAD, WORKER):
        target = {**node, "job": "node", "instance": "x:9100"}
        # Healthy, and nothing that may fire: the head's clock 0.2 s ahead, a hardware slowdown one
        # reading in four, 10% of the memory left (vLLM takes 80-85%), an EFI partition that is full
        # but holds no model, rx_dropped rising (frames no one listens for), an old error counter
        # that does not rise; and on the head a reading that failed once.
        ahead = 0.2 if node is HEAD else 0
        series += [s("up", target, f"1x{steps}"), s("node_time_seconds", target, f"{ahead}+{INTERVAL}x{steps}"),
                   s("node_textfile_mtime_seconds", {**target, **TEXTFILE_LABEL[node["node"]]}, f"0+{INTERVAL}x{steps}"),
                   s("node_textfile_scrape_error", target, f"0x{steps}"),
                   s("dual_spark_gpu_readable", {**target, "state": "ok"}, f"1x{steps}"), s("dual_spark_gpu_info", {**target, **GB10}, f"1x{steps}"),
                   s("dual_spark_gpu_slowdown_active", {**target, **GB10, "reason": "hw_slowdown"}, " ".join(["0 0 0 1"] * (steps // 4))),
                   s("dual_spark_gpu_slowdown_active", {**target, **GB10, "reason": "hw_thermal_slowdown"}, f"0x{steps}"),
                   s("dual_spark_unified_memory_total_bytes", target, f"128000000000x{steps}"),
                   s("dual_spark_unified_memory_available_bytes", target, f"12800000000x{steps}"),
                   s("node_filesystem_avail_bytes", {**target, **ROOT}, f"1000000000000x{steps}"),
                   s("node_filesystem_size_bytes", {**target, **ROOT}, f"4000000000000x{steps}"),
                   s("node_filesystem_avail_bytes", {**target, "mountpoint": "/boot/efi", "device": "/dev/nvme0n1p1", "fstype": "vfat"},
                     f"1000000x{steps}"),
                   s("node_filesystem_size_bytes", {**target, "mountpoint": "/boot/efi", "device": "/dev/nvme0n1p1", "fstype": "vfat"},
                     f"1000000000x{steps}"),
                   s("dual_spark_model_store_info", {**target, **STORE}, f"1x{steps}"),
                   s("dual_spark_watchdog_failed_starts", {**target, "role": "head" if node is HEAD else "worker"}, f"0x{steps}"),
                   s("dual_spark_watchdog_starts_total", {**target, "role": "head" if node is HEAD else "worker"}, f"1x{steps}"),
                   s("dual_spark_vllm_container_restarts_total", {**target, "role": "head" if node is HEAD else "worker"}, f"0x{steps}")]
        if node is HEAD:  # the head's last start served 90 s after it began: a heal is expected within 1.5 x 90 + 120 = 255 s
            series.append(s("dual_spark_vllm_last_start_seconds", {**target, "role": "head"}, f"90x{steps}"))
        for rail, netdev in enumerate(("enp1s0f0np0", "enP2p1s0f0np0")):
            labels = {**target, "rail": str(rail), "netdev": netdev}
            series += [s("dual_spark_rail_up", labels, f"1x{steps}"), s("dual_spark_rail_present", labels, f"1x{steps}"),
                       s("dual_spark_rail_speed_mbps", labels, f"200000x{steps}"),
                       s("dual_spark_rail_roce_port_active", {**labels, "rdma": "rocep1s0f0", "port": "1"}, f"1x{steps}"),
                       s("dual_spark_rail_errors_total", {**labels, "path": "netdev", "counter": "rx_dropped"}, f"0+3x{steps}"),
                       s("dual_spark_rail_errors_total", {**labels, "path": "rdma", "port": "1", "counter": "symbol_error"}, f"5x{steps}")]
    return [*series, *door(steps), s("dual_spark_collector_errors", {**HEAD, "job": "node", "instance": "x:9100", "reading": "rail 1"},
                                     f"_x30 1 _x{steps - 31}")]


def door(steps: int) -> list[dict]:
    """The front door of a healthy head, in HAProxy's names: two requests per scrape, each answered 2xx
    by vLLM, two in flight, none tried again or refused."""
    return [s("up", DOOR, f"1x{steps}"), s("haproxy_frontend_http_requests_total", API, f"0+2x{steps}"),
            s("haproxy_frontend_http_responses_total", {**API, "code": "2xx"}, f"0+2x{steps}"),
            s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"}, f"0x{steps}"),
            s("haproxy_server_http_responses_total", {**SERVER, "code": "5xx"}, f"0x{steps}"),
            s("haproxy_backend_retry_warnings_total", BACKEND, f"0x{steps}"),
            s("haproxy_backend_current_sessions", BACKEND, f"2x{steps}"), s("haproxy_server_current_sessions", SERVER, f"2x{steps}"),
            s("haproxy_backend_max_connect_time_seconds", BACKEND, f"0.001x{steps}")]


def cut(series: list[dict], labels: dict, after: int = 20) -> list[dict]:
    """``series`` with those of ``labels`` (but ``up``) ending after ``after`` steps, as a failed scrape
    ends them (a staleness marker): a node gone."""
    def ended(values: str) -> str:
        first, _, steps = values.rpartition("x") if " " not in values else ("", "", "")
        kept = f"{first}x{after}" if first else " ".join(values.split()[:after + 1])
        total = int(steps) if first else len(values.split()) - 1
        return f"{kept} stale _x{total - after - 1}"

    return [{**item, "values": ended(item["values"])} if labels_of(item["series"]).items() >= labels.items()
            and not item["series"].startswith("up{") else item for item in series]


def replaced(series: list[dict], *changes: dict) -> list[dict]:
    """``series`` with each of ``changes`` in place of the series of the same name and labels."""
    by_name = {change["series"]: change for change in changes}
    return [by_name.get(item["series"], item) for item in series] + [c for c in changes if c["series"] not in {i["series"] for i in series}]


def engine_labels(**more) -> dict:
    return {**MODEL, "job": "vllm", "instance": "127.0.0.1:8888", "engine": "0", **more}


TIMES = [5, 6, 7, 8, 8.5, 9, 10, 10.5, 11, 12, 14, 16]  # when the alerts are judged (minutes)
# Each fault: the series that show it, and per alert the times (minutes) it must be silent and firing
# (with the labels it fires with). Every other alert is silent before, during and after it (QUIET).
# The worker's vLLM killed at 10 min: the head generates nothing more, its watchdog ends it after
# two failed probes (its API down from 10:45), and the pair serves again at 12:45 (a new head: its
# counters start again from zero).
KILLED_WORKER = replaced(
    serving(),
    s("vllm:generation_tokens_total", engine_labels(), "0+400x40 16000 16000 _x8 0+400x28"),
    s("vllm:num_requests_running", engine_labels(), "2x42 _x8 2x28"),
    s("up", VLLM, "1x42 0x7 1x28"),
    s("dual_spark_watchdog_starts_total", {**WORKER, "job": "node", "instance": "x:9100", "role": "worker"}, "1x40 2x39"),
)
# An engine that hangs with requests in it while its API answers (a rank waiting on a dead one).
HUNG = replaced(serving(), s("vllm:generation_tokens_total", engine_labels(), "0+400x40 16000x40"))
# The head's vLLM restarted for a change from 5:00 to 10:00: the door answers nothing meanwhile, holds
# the requests (eight waiting for vLLM, each tried again every second) and serves them when it is
# back, the longest after 300 s; none is refused.
HELD = replaced(
    serving(),
    s("haproxy_frontend_http_responses_total", {**API, "code": "2xx"}, "0+2x20 40x19 82+2x39"),
    s("haproxy_backend_retry_warnings_total", BACKEND, "0x20 120+120x19 2400x39"),
    s("haproxy_server_current_sessions", SERVER, "2x20 0x19 2x39"),
    s("haproxy_backend_current_sessions", BACKEND, "2x20 8x19 2x39"),
    s("haproxy_backend_max_connect_time_seconds", BACKEND, "0.001x40 300x39"),
)
# A long prompt prefilled from 10:00: no token and no prompt counted yet, the KV cache filling chunk by chunk.
PREFILL = replaced(serving(), s("vllm:generation_tokens_total", engine_labels(), "0+400x40 16000x40"),
                   s("vllm:kv_cache_usage_perc", engine_labels(), "0.3x40 0.3+0.005x39"))
PLANNED = {**HEAD, "job": "node", "instance": "x:9100"}


def planned(values: str) -> dict:
    """The head's mark of planned work, as its collector exports it: when it stops counting."""
    return s("dual_spark_planned_work_expires_seconds", PLANNED, values)


def api_down(severity: str, value: str) -> dict:
    return {**HEAD, "severity": severity, "$value": value}


# A profile switch of seven minutes: the run marks planned work at 4:45 (for 40 min, unless it ends),
# stops the head's vLLM at 5:00 (its series end, the door holds the requests), its first start fails
# twice (the deploy had removed the record, so no measured start until it serves), and it serves again
# at 12:00; the run removes its mark after 12:15.
PLANNED_RESTART = replaced(
    cut(HELD, {**MODEL, "job": "vllm"}, after=19),
    s("up", VLLM, "1x19 0x28 1x32"),
    planned("_x19 2685x30 stale"),
    s("dual_spark_watchdog_failed_starts", {**PLANNED, "role": "head"}, "0x19 stale _x3 0x8 1x8 2x8 0x32"),
    s("dual_spark_vllm_last_start_seconds", {**PLANNED, "role": "head"}, "90x19 stale _x27 420x32"),
    s("vllm:num_requests_running", engine_labels(), "2x19 stale _x27 2x32"),
    s("vllm:generation_tokens_total", engine_labels(), "0+400x19 stale _x27 0+400x32"),
)
# The heartbeat fires at every time of every fault, a healthy cluster's too.
ALWAYS = {"DualSparkHeartbeat": ([], [(time, [{"$value": "1"}]) for time in TIMES])}
FAULTS = {
    "a healthy cluster": (serving(), ALWAYS),
    # The worker's vLLM killed at 10:00 heals by 12:30: a warning while within its expected time.
    "a killed worker": (KILLED_WORKER, {
        "DualSparkApiDown": ([9, 10.5, 14, 16], [(12, [api_down("warning", "1m 30s")])]),
    }),
    "an engine that hangs": (HUNG, {
        "DualSparkNotGenerating": ([9, 12], [(14, [{**MODEL, "$value": "2"}])]),
    }),
    "a long prefill with no token yet": (PREFILL, {"DualSparkNotGenerating": (TIMES, [])}),
    "a planned restart of seven minutes": (PLANNED_RESTART, {
        "DualSparkApiDown": (TIMES, []), "DualSparkNotGenerating": (TIMES, []), "DualSparkWatchdogRestartLoop": (TIMES, []),
        "DualSparkDoorRefusing": (TIMES, []),
    }),
    # The head's vLLM down from 5:00 to 8:00, well within the 255 s a heal is expected to take.
    "a heal within its expected time": (replaced(serving(), s("up", VLLM, "1x19 0x12 1x48")), {
        "DualSparkApiDown": ([5, 8.5, 9, 10, 16], [(6, [api_down("warning", "1m 15s")]), (7, [api_down("warning", "2m 15s")])]),
    }),
    # The head's vLLM down from 5:00 for good: a warning until 255 s, then a page.
    "a heal past its expected time": (replaced(serving(), s("up", VLLM, "1x19 0x60")), {
        "DualSparkApiDown": ([5], [(6, [api_down("warning", "1m 15s")]), (9, [api_down("warning", "4m 15s")]),
                                   (10, [api_down("critical", "5m 15s")]), (16, [api_down("critical", "11m 15s")])]),
    }),
    # A run that died at 5:00 with vLLM stopped: its mark stops counting at 7:00, and the alerts come.
    "a planned mark left by a run that died": (replaced(serving(), s("up", VLLM, "1x19 0x60"), planned("_x19 420x60")), {
        "DualSparkApiDown": ([5, 6, 7], [(8.5, [api_down("warning", "3m 45s")]), (10, [api_down("critical", "5m 15s")])]),
    }),
    "a rail at 100G": (replaced(serving(), s("dual_spark_rail_speed_mbps", {**WORKER, "job": "node", "instance": "x:9100", "rail": "1",
                                                                            "netdev": "enP2p1s0f0np0"}, "200000x20 100000x60")), {
        "DualSparkRailSlow": ([5], [(8, [{**WORKER, "job": "node", "instance": "x:9100", "rail": "1", "netdev": "enP2p1s0f0np0"}])]),
    }),
    "a rail down": (replaced(serving(), s("dual_spark_rail_up", {**HEAD, "job": "node", "instance": "x:9100", "rail": "0",
                                                                 "netdev": "enp1s0f0np0"}, "1x20 0x60")), {
        "DualSparkRailDown": ([5], [(8, [{**HEAD, "job": "node", "instance": "x:9100", "rail": "0", "netdev": "enp1s0f0np0"}])]),
    }),
    "a restart loop": (replaced(serving(), s("dual_spark_watchdog_failed_starts", {**WORKER, "job": "node", "instance": "x:9100",
                                                                                   "role": "worker"}, "0x20 1x4 2x8 3x60")), {
        "DualSparkWatchdogRestartLoop": ([5, 6], [(8.5, [{**WORKER, "job": "node", "instance": "x:9100", "role": "worker"}])]),
    }),
    # vLLM that serves, then dies, every 75 s from 5 min: each start serves (no backoff), and Docker
    # counts each restart of its container: six by 11:15.
    "vLLM dying after it serves, again and again": (replaced(serving(), s("dual_spark_vllm_container_restarts_total",
                                                                          {**WORKER, "job": "node", "instance": "x:9100", "role": "worker"},
                                                                          "0x19 1x4 2x4 3x4 4x4 5x4 6x60")), {
        "DualSparkVllmFlapping": ([5, 8, 11], [(14, [{**WORKER, "role": "worker"}]), (16, [{**WORKER, "role": "worker"}])]),
        "DualSparkWatchdogRestartLoop": ([5, 8, 11, 14, 16], []),  # each start served: not a loop that never serves
    }),
    # Seven deliberate changes, one every 75 s (profiles tried, rollbacks): seven starts, each in a
    # new container, so Docker's count of restarts stays 0.
    "seven changes in nine minutes": (replaced(serving(), s("dual_spark_watchdog_starts_total",
                                                            {**WORKER, "job": "node", "instance": "x:9100", "role": "worker"},
                                                            "1x19 2x4 3x4 4x4 5x4 6x4 7x4 8x60")), {
        "DualSparkWatchdogRestartLoop": ([6, 11, 14, 16], []),
        "DualSparkVllmFlapping": ([6, 11, 14, 16], []),
    }),
    # Everything its exporter served ends with it: only NodeDown says so (its textfile, GPU and rails
    # are not judged stale or missing on a node no one can read).
    # The head's watch of the answers compares the fabric canary every scrape: from 5:00 it differs
    # from token 5 (asked twice); at 10:00 it agrees again.
    "answers changed while serving": (replaced(serving(), s("dual_spark_answers_first_difference_tokens", {**HEAD_NODE, "canary": "fabric"},
                                                            "_x20 5x20 stale")), {
        "DualSparkAnswersChanged": ([10.5, 11, 16], [(5, [{**HEAD, "canary": "fabric", "$value": "5"}]),
                                                     (8, [{**HEAD, "canary": "fabric", "$value": "5"}])]),
    }),
    "a node gone": (replaced(cut(serving(), WORKER_NODE), s("up", WORKER_NODE, "1x20 0x60")), {
        "DualSparkNodeDown": ([5], [(7, [WORKER_NODE])]),
    }),
    # The file's age on the node's own clock: its mtime stops at 300 s while the node's time goes on.
    "a collector that stopped": (replaced(serving(), s("node_textfile_mtime_seconds", {**HEAD_NODE, **TEXTFILE_LABEL["spark-head"]},
                                                       "0+15x20 300x60")), {
        "DualSparkCollectorStale": ([7], [(10, [{**HEAD_NODE, "$value": "5m 0s"}])]),
    }),
    "a collector that never wrote its file": (replaced(serving(), s("node_textfile_mtime_seconds", {**WORKER_NODE, **TEXTFILE_LABEL["spark-worker"]},
                                                                    "_x80")), {
        "DualSparkCollectorStale": ([], [(5, [{**WORKER_NODE, "$value": "+Inf"}]), (10, [{**WORKER_NODE, "$value": "+Inf"}])]),
    }),
    # The worker's clock falls ten minutes behind at 10:15, and its collector writes by it: the file is
    # as fresh as ever by the node's clock, where the head's time() against its mtime says 10 min old.
    "a worker's clock ten minutes behind": (replaced(serving(), s("node_time_seconds", WORKER_NODE, "0+15x40 15+15x39"),
                                                     s("node_textfile_mtime_seconds", {**WORKER_NODE, **TEXTFILE_LABEL["spark-worker"]},
                                                       "0+15x40 15+15x39")), {
        "DualSparkClockSkew": ([5, 6, 10, 12], [(14, [{**WORKER_NODE, "$value": "-10m 0s"}]), (16, [{**WORKER_NODE, "$value": "-10m 0s"}])]),
    }),
    "a textfile the node exporter cannot parse": (replaced(serving(), s("node_textfile_scrape_error", WORKER_NODE, "0x20 1x60"),
                                                           s("node_textfile_mtime_seconds", {**WORKER_NODE, **TEXTFILE_LABEL["spark-worker"]},
                                                             "0+15x20 stale")), {
        "DualSparkTextfileScrapeError": ([5], [(7, [{**WORKER_NODE, "$value": "1"}])]),  # not stale as well: one fault, one alert
    }),
    "a reading that keeps failing": (replaced(serving(), s("dual_spark_collector_errors", {**HEAD_NODE, "reading": "meminfo"}, "_x21 1x59")), {
        "DualSparkCollectorErrors": ([5], [(7, [{**HEAD_NODE, "reading": "meminfo", "$value": "8"}])]),
    }),
    # nvidia-smi prints "No devices were found" from 5:15: the GPU's readings end, the collector says
    # so (its "gpu" error is this alert's, not CollectorErrors').
    "a GPU nvidia-smi no longer reads": (replaced(serving(), s("dual_spark_gpu_readable", {**WORKER_NODE, "state": "ok"}, "1x20 stale"),
                                                  s("dual_spark_gpu_readable", {**WORKER_NODE, "state": "No devices were found"}, "_x21 0x59"),
                                                  s("dual_spark_gpu_info", {**WORKER_NODE, **GB10}, "1x20 stale"),
                                                  s("dual_spark_gpu_slowdown_active", {**WORKER_NODE, **GB10, "reason": "hw_thermal_slowdown"},
                                                    "0x20 stale"),
                                                  s("dual_spark_collector_errors", {**WORKER_NODE, "reading": "gpu"}, "_x21 1x59")), {
        "DualSparkGpuUnreadable": ([5], [(7, [{**WORKER_NODE, "state": "No devices were found", "$value": "0"}])]),
    }),
    # A worker with two GPUs: the second vanishes from nvidia-smi's list at 5:15, the first still reads.
    "a GPU that vanishes from the readings": (replaced(serving(), s("dual_spark_gpu_info", {**WORKER_NODE, "gpu": "1", "name": "NVIDIA GB10"},
                                                                    "1x20 stale")), {
        "DualSparkGpuMissing": ([5], [(7, [{**WORKER, "$value": "1"}]), (16, [{**WORKER, "$value": "1"}])]),
    }),
    "a GPU slowed down by heat": (replaced(serving(), s("dual_spark_gpu_slowdown_active", {**HEAD_NODE, **GB10, "reason": "hw_thermal_slowdown"},
                                                        "0x20 1x60")), {
        "DualSparkGpuThrottled": ([6, 7], [(10, [{**HEAD_NODE, **GB10, "reason": "hw_thermal_slowdown", "$value": "95.24%"}])]),
    }),
    "unified memory nearly gone": (replaced(serving(), s("dual_spark_unified_memory_available_bytes", HEAD_NODE, "12800000000x20 3840000000x60")), {
        "DualSparkUnifiedMemoryLow": ([6], [(8, [{**HEAD_NODE, "$value": "3%"}])]),
    }),
    "the model store filling": (replaced(serving(), s("node_filesystem_avail_bytes", {**WORKER_NODE, **ROOT}, "1000000000000x20 200000000000x60")), {
        "DualSparkModelStoreFilling": ([5], [(7, [{**WORKER, **STORE, "$value": "5%"}])]),
    }),
    "a rail counting errors": (replaced(serving(), s("dual_spark_rail_errors_total", {**WORKER_NODE, "rail": "1", "netdev": "enP2p1s0f0np0",
                                                                                       "path": "rdma", "port": "1", "counter": "symbol_error"},
                                                     "5x20 5+2x60")), {
        "DualSparkRailErrors": ([5], [(7, [{**WORKER_NODE, "rail": "1", "netdev": "enP2p1s0f0np0", "path": "rdma", "port": "1",
                                            "counter": "symbol_error", "$value": "14.25"}])]),
    }),
    "a full KV cache with requests waiting": (replaced(serving(), s("vllm:kv_cache_usage_perc", engine_labels(), "0.3x20 0.99x60"),
                                                       s("vllm:num_requests_waiting", engine_labels(), "0x30 3x60")), {
        "DualSparkKvCacheFull": ([6, 8], [(11, [MODEL])]),  # full from 5 min, but nothing waits until 7.5
    }),
    "speculation that accepts nothing": (replaced(serving(), s("vllm:spec_decode_num_accepted_tokens_total", engine_labels(),
                                                               "0+150x20 3000x60")), {
        "DualSparkSpeculationCollapsed": ([8], [(12, [MODEL])]),
    }),
    # Four requests end every scrape, 5% at their token limit; from 5:00 every one runs to it. The
    # share of the last ten minutes is judged against the six hours before, which exist from 10:15.
    "answers running away from 5:00": (replaced(serving(), s("vllm:request_success_total", engine_labels(finished_reason="stop"), "0+3.8x20 76x59"),
                                                s("vllm:request_success_total", engine_labels(finished_reason="length"), "0+0.2x20 4+4x59")), {
        "DualSparkAnswersRunaway": ([5, 8, 10], [(at, [{**MODEL, "$value": value}]) for at, value in
                                                 ((10.5, "57.25%"), (11, "62%"), (12, "71.5%"), (14, "90.5%"), (16, "100%"))]),
    }),
    # A client whose every answer runs to its limit by design (a benchmark with ignore_eos): its own baseline.
    "answers that always end at their limit": (replaced(serving(), s("vllm:request_success_total", engine_labels(finished_reason="length"),
                                                                     "0+4x80")), {"DualSparkAnswersRunaway": (TIMES, [])}),
    "a restart of five minutes, its requests held at the door": (HELD, {"DualSparkDoorRefusing": (TIMES, [])}),
    # From 5:00 a request a scrape waited its whole bound and is answered 503 by the door.
    "the door refusing requests": (replaced(serving(), s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"}, "0x20 0+1x60")), {
        "DualSparkDoorRefusing": ([5, 6, 7], [(8, [{**HEAD, "$value": "4"}]), (16, [{**HEAD, "$value": "4"}])]),
    }),
    # A heal: at 5:15 the eight requests in flight fail at once, three with vLLM's own error, five (long
    # prompts, not held whole) with the door's 502; then it serves again.
    "a heal failing the requests in flight once": (replaced(serving(), s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"},
                                                                         "0x20 8x60"),
                                                            s("haproxy_server_http_responses_total", {**SERVER, "code": "5xx"}, "0x20 3x60")), {
        "DualSparkDoorRefusing": (TIMES, []),
    }),
    # vLLM answers a 5xx a scrape from 5:00, which the door passes on: vLLM's, not the door's.
    "vLLM's own errors passed on": (replaced(serving(), s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"}, "0x20 0+1x60"),
                                             s("haproxy_server_http_responses_total", {**SERVER, "code": "5xx"}, "0x20 0+1x60")), {
        "DualSparkDoorRefusing": (TIMES, []),
    }),
    # HAProxy stopped at 5:00: its scrape fails, every series of the door ends.
    "the door down": (replaced(cut(serving(), DOOR), s("up", DOOR, "1x20 0x60")), {
        "DualSparkDoorDown": ([5], [(7, [{**DOOR, "$value": "0"}])]),
    }),
}
QUIET = [6, 11, 16]  # when every alert a fault does not name must be silent (before, during and after it)


def alert_tests(alert_rules: dict, faults: tuple[str, ...] = tuple(FAULTS)) -> dict:
    """promtool's test file: for each fault, every alert silent or firing at every time listed."""
    alerts: dict[str, list[dict]] = {}
    for group in alert_rules["groups"]:
        for rule in group["rules"]:
            alerts.setdefault(rule["alert"], []).append(rule)
    tests = []
    for fault in faults:
        series, expected = FAULTS[fault]
        assert set(expected) <= set(alerts), fault
        cases = []
        for time in TIMES:
            for name, same in alerts.items():
                silent, firing = expected.get(name, ALWAYS.get(name, (QUIET, [])))
                fires = next((labels for at, labels in firing if at == time), None)
                if fires is None and time not in silent:
                    continue
                exp = [expected_alert(same, labels) for labels in fires or []]
                cases.append({"eval_time": f"{int(time * 60)}s", "alertname": name, "exp_alerts": exp})
        tests.append({"name": fault, "interval": f"{INTERVAL}s", "input_series": series, "alert_rule_test": cases})
    # promtool evaluates the groups at each step in a random order unless told: the recordings first,
    # as an alert reading one sees it once Prometheus has evaluated both (one interval later at most).
    order = [group["name"] for name in ("recording.yml", "alerts.yml") for group in rules()[name]["groups"]]
    return {"rule_files": ["recording.yml", "alerts.yml"], "evaluation_interval": f"{INTERVAL}s", "group_eval_order": order, "tests": tests}


def expected_alert(same: list[dict], labels: dict) -> dict:
    """The alert promtool must find: of the rules of one name (one per severity), the one whose
    severity ``labels`` names (or the only one), with its labels and annotations filled."""
    rule = next(rule for rule in same if labels.get("severity", rule["labels"]["severity"]) == rule["labels"]["severity"])
    return {"exp_labels": {**{k: v for k, v in labels.items() if k != "$value"}, **rule.get("labels", {})},
            "exp_annotations": annotations(rule, labels)}


def recording_tests() -> dict:
    """The recording rules on known series: one request of 101 tokens, 2 s of decode, finishes every
    15 s; 4 drafts of 3 tokens per 15 s, 3 first and 1 second positions accepted; two rails' counters;
    a head with two GPUs and a worker whose nvidia-smi lists none; the front door's counters."""
    labels = engine_labels()
    steps = 40
    series = [s("vllm:request_generation_tokens_sum", labels, f"0+101x{steps}"), s("vllm:request_generation_tokens_count", labels, f"0+1x{steps}"),
              s("vllm:request_decode_time_seconds_sum", labels, f"0+2x{steps}"), s("vllm:generation_tokens_total", labels, f"0+150x{steps}"),
              s("vllm:time_to_first_token_seconds_sum", labels, f"0+0.5x{steps}"), s("vllm:time_to_first_token_seconds_count", labels, f"0+1x{steps}"),
              s("vllm:spec_decode_num_drafts_total", labels, f"0+4x{steps}"), s("vllm:spec_decode_num_draft_tokens_total", labels, f"0+12x{steps}"),
              s("vllm:spec_decode_num_accepted_tokens_total", labels, f"0+4x{steps}"),
              s("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**labels, "position": "0"}, f"0+3x{steps}"),
              s("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**labels, "position": "1"}, f"0+1x{steps}"),
              s("vllm:spec_decode_num_accepted_tokens_per_pos_total", {**labels, "position": "2"}, f"0+0x{steps}"),
              s("dual_spark_rail_transmit_bytes_total", {**WORKER, "job": "node", "rail": "0", "netdev": "enp1s0f0np0", "path": "rdma",
                                                          "port": "1"}, f"0+{15 * 10**9}x{steps}"),
              s("dual_spark_gpu_readable", {**HEAD_NODE, "state": "ok"}, f"1x{steps}"),
              s("dual_spark_gpu_info", {**HEAD_NODE, **GB10}, f"1x{steps}"), s("dual_spark_gpu_info", {**HEAD_NODE, **GB10, "gpu": "1"}, f"1x{steps}"),
              s("dual_spark_gpu_readable", {**WORKER_NODE, "state": "No devices were found"}, f"0x{steps}"),
              s("haproxy_frontend_http_requests_total", API, f"0+30x{steps}"),
              s("haproxy_frontend_http_responses_total", {**API, "code": "2xx"}, f"0+15x{steps}"),
              s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"}, f"0+15x{steps}"),
              s("haproxy_server_http_responses_total", {**SERVER, "code": "5xx"}, f"0+7.5x{steps}"),
              s("haproxy_backend_retry_warnings_total", BACKEND, f"0+30x{steps}"),
              s("haproxy_backend_current_sessions", BACKEND, f"5x{steps}"), s("haproxy_server_current_sessions", SERVER, f"2x{steps}"),
              s("haproxy_backend_max_connect_time_seconds", BACKEND, f"4.5x{steps}"),
              s("dual_spark_door_held_requests", COUNTS, f"3x{steps}"), s("dual_spark_door_held_longest_seconds", COUNTS, f"40x{steps}"),
              s("dual_spark_door_held_seconds_sum", COUNTS, f"0+45x{steps}"), s("dual_spark_door_held_seconds_count", COUNTS, f"0+3x{steps}"),
              s("dual_spark_door_client_requests_total", {**COUNTS, "client": "laptop", "code": "2xx"}, f"0+15x{steps}"),
              s("dual_spark_door_client_requests_total", {**COUNTS, "client": "laptop", "code": "5xx"}, f"0+1.5x{steps}"),
              s("dual_spark_door_client_requests_total", {**COUNTS, "client": "deploy", "code": "2xx"}, f"0+3x{steps}"),
              s("dual_spark_door_client_prompt_tokens_total", {**COUNTS, "client": "laptop"}, f"0+1500x{steps}"),
              s("dual_spark_door_client_completion_tokens_total", {**COUNTS, "client": "laptop"}, f"0+300x{steps}"),
              s("dual_spark_door_client_answers_without_usage_total", {**COUNTS, "client": "laptop"}, f"0+1.5x{steps}")]
    group = {**MODEL}

    def expect(expr: str, value: float, labels: dict = group) -> dict:
        inside = ",".join(f'{k}="{v}"' for k, v in {"__name__": expr, **labels}.items())
        return {"expr": expr, "eval_time": "5m", "exp_samples": [{"labels": "{" + inside + "}", "value": value}]}

    tests = [
        expect("dual_spark:decode_tokens_per_second:per_stream", 50),  # 100 tokens after the first in 2 s
        expect("dual_spark:generation_tokens_per_second:aggregate", 10),
        expect("dual_spark:time_to_first_token_seconds:mean", 0.5),
        expect("dual_spark:spec_decode_acceptance:ratio", 1 / 3),
        expect("dual_spark:spec_decode_acceptance_length:mean", 2),
        {"expr": "dual_spark:spec_decode_acceptance:per_position", "eval_time": "5m", "exp_samples": [
            {"labels": f'{{__name__="dual_spark:spec_decode_acceptance:per_position",node="spark-head",model_name="tiny",position="{position}"}}',
             "value": value}
            for position, value in (("0", 0.75), ("1", 0.25), ("2", 0))]},
        expect("dual_spark:rail_transmit_bytes_per_second", 10**9, {**WORKER, "rail": "0", "netdev": "enp1s0f0np0", "path": "rdma"}),
        {"expr": "dual_spark:gpus:count", "eval_time": "5m", "exp_samples": [  # none listed: 0, not nothing
            {"labels": '{__name__="dual_spark:gpus:count",node="spark-head"}', "value": 2},
            {"labels": '{__name__="dual_spark:gpus:count",node="spark-worker"}', "value": 0}]},
        # The door: 2 requests a second, half answered 2xx and half 5xx, half of those by vLLM; 2
        # retries a second (two requests waiting, each tried every second); five at the door, two at vLLM.
        expect("dual_spark:door_requests_per_second", 2, HEAD),
        {"expr": "dual_spark:door_responses_per_second", "eval_time": "5m", "exp_samples": [
            {"labels": f'{{__name__="dual_spark:door_responses_per_second",node="spark-head",code="{code}"}}', "value": 1}
            for code in ("2xx", "5xx")]},
        expect("dual_spark:door_refused_per_second", 0.5, HEAD),
        expect("dual_spark:door_vllm_errors_per_second", 0.5, HEAD),
        expect("dual_spark:door_retries_per_second", 2, HEAD),
        expect("dual_spark:door_requests_in_flight", 2, HEAD),
        expect("dual_spark:door_requests_waiting_for_vllm", 3, HEAD),
        expect("dual_spark:door_wait_seconds:max", 4.5, HEAD),
        # The door's own counts: three held now, the longest for 40 s; a hold of 15 s ends every 5 s;
        # laptop gets one answer a second (0.1 of them 5xx), 100 prompt and 20 completion tokens a
        # second, one stream in ten without usage; deploy one answer in 5 s.
        expect("dual_spark:door_held_requests", 3, HEAD),
        expect("dual_spark:door_held_longest_seconds", 40, HEAD),
        expect("dual_spark:door_holds_per_second", 0.2, HEAD),
        expect("dual_spark:door_held_seconds:mean", 15, HEAD),
        {"expr": "dual_spark:door_client_requests_per_second", "eval_time": "5m", "exp_samples": [
            {"labels": f'{{__name__="dual_spark:door_client_requests_per_second",node="spark-head",client="{client}",code="{code}"}}',
             "value": value} for client, code, value in (("laptop", "2xx", 1), ("laptop", "5xx", 0.1), ("deploy", "2xx", 0.2))]},
        expect("dual_spark:door_client_prompt_tokens_per_second", 100, {**HEAD, "client": "laptop"}),
        expect("dual_spark:door_client_completion_tokens_per_second", 20, {**HEAD, "client": "laptop"}),
        expect("dual_spark:door_client_answers_without_usage_per_second", 0.1, {**HEAD, "client": "laptop"}),
    ]
    return {"rule_files": ["recording.yml"], "evaluation_interval": f"{INTERVAL}s",
            "tests": [{"name": "the recording rules", "interval": f"{INTERVAL}s", "input_series": series, "promql_expr_test": tests}]}


def test_every_alert_has_a_fault_that_fires_it(rendered):
    alert_rules = yaml.safe_load((rendered["pair"] / "alerts.yml").read_text())
    fired = {name for _, expected in FAULTS.values() for name in expected}
    assert fired == {rule["alert"] for group in alert_rules["groups"] for rule in group["rules"]}, "an alert no fault fires"


@pytest.mark.parametrize("fault", FAULTS)
def test_every_alert_fires_on_its_fault_and_stays_silent_otherwise(rendered, tmp_path, fault):
    """A killed worker (the head stops generating, then its API is down until the pair heals), a
    rail at 100G, a rail down, a restart loop, vLLM dying again and again after it serves (and
    deliberate changes as often, which are no loop), a node gone, a collector stopped or never
    written, a clock behind, a textfile that does not parse, a reading that keeps failing, a GPU
    unread or gone, a GPU slowed by heat, memory or the model store running out, a rail counting
    errors, a full KV cache with requests waiting, speculation that accepts nothing; and a healthy
    cluster, where none fires. One promtool run per fault."""
    for name in ("recording.yml", "alerts.yml"):
        shutil.copy(rendered["pair"] / name, tmp_path)
    alert_rules = yaml.safe_load((tmp_path / "alerts.yml").read_text())
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(alert_tests(alert_rules, (fault,)), sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", "alerts_test.yml", cwd=tmp_path)


def test_the_recording_rules_compute_what_they_name(rendered, tmp_path):
    shutil.copy(rendered["pair"] / "recording.yml", tmp_path)
    (tmp_path / "recording_test.yml").write_text(yaml.safe_dump(recording_tests(), sort_keys=False))
    assert "SUCCESS" in promtool("test", "rules", "recording_test.yml", cwd=tmp_path)


def test_an_alert_that_stays_silent_fails_its_test(rendered, tmp_path):
    """The test above can fail: the same faults against rules whose RailSlow threshold was lost."""
    for name in ("recording.yml", "alerts.yml"):
        (tmp_path / name).write_text((rendered["pair"] / name).read_text().replace("< 200000", "< 100000"))
    alert_rules = yaml.safe_load((tmp_path / "alerts.yml").read_text())
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(alert_tests(alert_rules, ("a rail at 100G",)), sort_keys=False))
    done = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "DualSparkRailSlow" in done.stdout + done.stderr


def test_a_stale_alert_across_clocks_fails_its_test(rendered, tmp_path):
    """The clock test can fail: the textfile's age taken on the head's clock, as it was."""
    ours = "node_time_seconds - ignoring (file) node_textfile_mtime_seconds"
    assert ours in (rendered["pair"] / "alerts.yml").read_text()
    for name in ("recording.yml", "alerts.yml"):
        (tmp_path / name).write_text((rendered["pair"] / name).read_text().replace(ours, "time() - node_textfile_mtime_seconds"))
    alert_rules = yaml.safe_load((tmp_path / "alerts.yml").read_text())
    (tmp_path / "alerts_test.yml").write_text(yaml.safe_dump(alert_tests(alert_rules, ("a worker's clock ten minutes behind",)),
                                                             sort_keys=False))
    done = subprocess.run([tool("promtool"), "test", "rules", "alerts_test.yml"], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode != 0 and "DualSparkCollectorStale" in done.stdout + done.stderr


def test_every_runbook_is_a_section_of_the_docs_and_shows_the_value():
    """Each alert's runbook_url names a heading of the page it points into (GitHub's anchor of
    it), and the alert's description shows its $value."""
    alerts = [rule for file in rules().values() for group in file["groups"] for rule in group["rules"]
              if "runbook_url" in rule.get("annotations", {})]
    assert len(alerts) >= 10
    for alert in alerts:
        page, _, anchor = alert["annotations"]["runbook_url"].partition("#")
        headings = re.findall(r"^#+ (.+)$", (REPO / page).read_text(), flags=re.M)
        assert anchor in {re.sub(r"[^a-z0-9 -]", "", heading.lower()).replace(" ", "-") for heading in headings}, alert["alert"]
        assert "$value" in alert["annotations"]["description"], alert["alert"]


def test_the_rates_span_four_scrapes():
    assert window(15) == "60s" and window(30) == "120s" and window(5) == "60s"


def test_every_name_used_is_recorded_or_exported():
    """The dashboards, the alerts and `tasks/status.py` use the recording rules' names, each
    defined once; the rules use only names the pinned vLLM's /metrics has, of HAProxy's only the
    series the door's own exporter serves, and of the door's counts only those its Lua serves."""
    recorded = recorded_names()
    records = [rule["record"] for group in rules()["recording.yml"]["groups"] for rule in group["rules"]]
    assert len(records) == len(set(records))
    used = set(RECORDED.findall(json.dumps(dashboards()))) | set(RECORDED.findall(json.dumps(rules()["alerts.yml"])))
    used |= set(RECORDED.findall((REPO / "checks/status.py").read_text()))
    assert used and used <= recorded, used - recorded
    exported = {line.split("{")[0].split(" ")[0] for line in VLLM_METRICS.read_text().splitlines() if not line.startswith("#")}
    named = set(VLLM_NAME.findall(json.dumps(rules())))
    assert named and named <= exported, named - exported
    door = [labels_of(line.split(" ")[0]) for line in DOOR_METRICS.read_text().splitlines() if not line.startswith("#")]
    selectors = HAPROXY_SELECTOR.findall(rule_files(site("pair"))["recording.yml"])
    assert selectors
    for name, inside in selectors:  # each name, with the proxy, server and code it selects, is a series HAProxy serves
        wanted = {"__name__": name, **dict(re.findall(r'(\w+)="([^"]*)"', inside))}
        assert any(series.items() >= wanted.items() for series in door), wanted
    counted = {labels_of(line.split(" ")[0])["__name__"] for line in DOOR_COUNTS.read_text().splitlines() if not line.startswith("#")}
    named = set(DOOR_COUNT.findall(rule_files(site("pair"))["recording.yml"]))
    assert named and named <= counted, named - counted  # and each is one the door's Lua serves


def test_every_dashboard_query_is_valid_promql_over_the_rules(tmp_path):
    """Each panel's query, its variable as Grafana fills it for every node, checked by promtool as a
    rule's expression; each names the provisioned datasource; vLLM's panels read the recording
    rules, never vLLM's own names."""
    queries = []
    for name, board in dashboards().items():
        assert board["uid"].startswith("dual-spark-") and not board["editable"]
        ids = [panel["id"] for panel in board["panels"]]
        assert len(ids) == len(set(ids))
        for panel in board["panels"]:
            assert panel["datasource"]["uid"] == GRAFANA_DATASOURCE_UID, (name, panel["title"])
            for target in panel["targets"]:
                assert target["datasource"]["uid"] == GRAFANA_DATASOURCE_UID
                assert not VLLM_NAME.search(target["expr"]), (name, panel["title"])
                queries.append(target["expr"].replace("$node", ".+").replace("$model", ".+"))
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": [
        {"record": f"dashboard:query_{index}", "expr": query} for index, query in enumerate(queries)]}]}))
    assert f"SUCCESS: {len(queries)} rules found" in promtool("check", "rules", str(tmp_path / "queries.yml"))


def test_grafana_is_provisioned_with_the_datasource_and_the_dashboards():
    cluster = site("pair", {"grafana_image": "grafana/grafana-oss@sha256:" + "a" * 64})
    files = grafana_files(cluster, "/etc/dual-spark/grafana")
    datasource = yaml.safe_load(files["/etc/dual-spark/grafana/provisioning/datasources/dual-spark.yaml"])["datasources"][0]
    assert datasource["uid"] == GRAFANA_DATASOURCE_UID and datasource["jsonData"]["timeInterval"] == f"{INTERVAL}s"
    assert datasource["url"] == "http://127.0.0.1:9090"
    stack = yaml.safe_load(files["/etc/dual-spark/grafana/compose.yaml"])["services"]["grafana"]
    assert stack["image"].endswith("@sha256:" + "a" * 64) and stack["environment"]["GF_SERVER_HTTP_ADDR"] == "127.0.0.1"
    assert stack["environment"]["GF_AUTH_DISABLE_LOGIN_FORM"] == "true" and stack["network_mode"] == "host"
    # no account to log in with: no form, no basic auth, no admin made at the first start (admin/admin)
    assert stack["environment"]["GF_AUTH_BASIC_ENABLED"] == "false" and stack["environment"]["GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION"] == "true"
    assert stack["environment"]["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer"
    assert {Path(path).name for path in files if path.endswith(".json")} == set(dashboards())
    assert not any(path.startswith("/etc/dual-spark/grafana") for path in observability_settings(site("pair"), "spark-head").files)


HOOKS = ["https://hooks.example.com/services/T0/B1?token=s3cr3t", "http://10.9.0.5:8080/alerts", "https://alerts.example.org/hook/abc123"]


def alertmanager_files(tmp: Path, name: str, settings: dict | None = None) -> Path:
    """alertmanager.yml of tests/sites/<name>.toml with ``settings``, written in tmp."""
    path = tmp / f"{name}-{len((settings or {}).get('alert_webhooks', []))}.yml"
    path.write_text(observability_settings(site(name, settings), "spark-head").files[ALERTMANAGER_CONFIG])
    return path


def test_amtool_takes_the_alertmanager_configuration_of_a_pair_and_of_four_nodes(tmp_path):
    """With the site's webhooks and with none (the alerts stay on the head)."""
    configs = [alertmanager_files(tmp_path, name, settings) for name in ("pair", "four") for settings in ({}, {"alert_webhooks": HOOKS})]
    output = amtool("check-config", *map(str, configs))
    assert output.count("SUCCESS") == 4 and output.count(" - 2 inhibit rules") == 4, output


def test_amtool_refuses_a_configuration_that_routes_to_no_receiver(tmp_path):
    """The check above can fail: the receiver the route names, lost."""
    config = alertmanager_files(tmp_path, "pair", {"alert_webhooks": HOOKS})
    config.write_text(config.read_text().replace(f"- name: {RECEIVER}", "- name: elsewhere"))
    done = subprocess.run([tool("amtool"), "check-config", str(config)], capture_output=True, text=True)
    assert done.returncode != 0 and "undefined receiver" in done.stdout + done.stderr


def alert_names() -> set[str]:
    return {rule["alert"] for name in ("alerts.yml", "objectives.yml") for group in rules()[name]["groups"] for rule in group["rules"]
            if "alert" in rule}


def test_the_alerts_a_planned_restart_would_set_off_wait_for_its_mark_and_are_those_its_silence_matches():
    """A rule that waits for the mark of planned work (``unless ... planned_work:active``) carries
    the label the work's silence in Alertmanager matches (files/dual_spark/silence.py QUIET), and
    no other rule does: the two never disagree on which alerts planned work quiets."""
    name, value = SILENCED
    alerts = [rule for file in ("alerts.yml", "objectives.yml") for group in rules()[file]["groups"] for rule in group["rules"]
              if "alert" in rule]
    waiting = {rule["alert"] for rule in alerts if "dual_spark:planned_work:active" in rule["expr"]}
    labelled = {rule["alert"] for rule in alerts if rule["labels"].get(name) == value}
    assert waiting == labelled
    assert {"DualSparkApiDown", "DualSparkNotGenerating", "DualSparkDoorRefusing"} <= waiting


@pytest.mark.parametrize("webhooks", [HOOKS, []], ids=["webhooks", "none"])
def test_every_alert_is_routed_to_the_site_and_the_heartbeat_repeats_often(tmp_path, webhooks):
    """amtool's own routing of every alert the rules make, by its name and a node's: the site's
    receiver (its webhooks), or with none the one that sends nothing. The heartbeat has a route of
    its own that repeats it every twenty scrapes, where another alert repeats every four hours."""
    config = alertmanager_files(tmp_path, "pair", {"alert_webhooks": webhooks})
    receiver = RECEIVER if webhooks else NOBODY
    for name in sorted(alert_names()):
        assert amtool("config", "routes", "test", f"--config.file={config}", f"--verify.receivers={receiver}", f"alertname={name}",
                      "node=spark-worker").split() == [receiver], name
    route = yaml.safe_load(config.read_text())["route"]
    [heartbeat] = route["routes"]
    assert heartbeat["matchers"] == [f'alertname="{HEARTBEAT}"'] and HEARTBEAT in alert_names()
    assert heartbeat["repeat_interval"] == heartbeat["group_interval"] == alertmanager_timings(INTERVAL)["heartbeat"] == "5m"
    assert route["repeat_interval"] == "4h" and route["group_by"] == ["alertname", "node", "severity"]
    assert {hook["url"] for receiver in yaml.safe_load(config.read_text())["receivers"] for hook in receiver.get("webhook_configs", [])} \
        == set(webhooks)


MATCHER = re.compile(r'(\w+)(=~|=)"([^"]*)"')


def matched(matchers: list[str], names: set[str]) -> set[str]:
    """The alert names of ``names`` a list of Alertmanager matchers on alertname selects."""
    [(label, op, value)] = [MATCHER.fullmatch(matcher).groups() for matcher in matchers]
    assert label == "alertname"
    return {name for name in names if (re.fullmatch(value, name) if op == "=~" else name == value)}


@pytest.mark.parametrize("name", ["pair", "four"])
def test_a_node_gone_inhibits_alerts_of_real_names_that_carry_the_labels_it_compares(name):
    """amtool cannot test an inhibition offline. What it rests on is checked instead: every name a
    matcher selects is an alert of the rules (a regex selects each alert it lists, and only those),
    and every label ``equal`` compares is on each of them as promtool saw it fire above (FAULTS):
    the node gone silences its rails' alerts and the API's, nothing else."""
    names = alert_names()
    inhibit = yaml.safe_load(observability_settings(site(name), "spark-head").files[ALERTMANAGER_CONFIG])["inhibit_rules"]
    fired: dict[str, list[dict]] = {}
    for _, expected in FAULTS.values():
        for alert, (_, firing) in expected.items():
            fired.setdefault(alert, []).extend(labels for _, found in firing for labels in found)
    silenced = set()
    for rule in inhibit:
        sources, targets = matched(rule["source_matchers"], names), matched(rule["target_matchers"], names)
        listed = set(re.findall(r"DualSpark\w+", " ".join(rule["source_matchers"] + rule["target_matchers"])))
        assert sources == {"DualSparkNodeDown"} and listed == sources | targets, rule
        for alert in sources | targets:
            assert fired.get(alert) and all(set(rule.get("equal", [])) <= set(labels) for labels in fired[alert]), (alert, rule)
        silenced |= targets
    assert silenced == {"DualSparkRailDown", "DualSparkRailSlow", "DualSparkRailErrors", "DualSparkApiDown"}
    rails = next(rule for rule in inhibit if "DualSparkRailDown" in matched(rule["target_matchers"], names))
    assert rails.get("equal") == (None if site(name).settings.topology == "direct" else ["node"])  # a pair's rails are one cable


def test_alertmanager_listens_on_loopback_without_a_cluster_and_prometheus_sends_it_the_alerts():
    settings = observability_settings(site("pair", {"alertmanager_port": 19093}), "spark-head")
    [start] = [line for line in settings.files[UNIT_FILES["alertmanager"]].splitlines() if line.startswith("ExecStart=/")]
    flags = dict(flag.split("=", 1) for flag in start.split()[1:])
    assert flags["--web.listen-address"] == "127.0.0.1:19093" and flags["--cluster.listen-address"] == ""  # no gossip listener
    assert flags["--config.file"] == ALERTMANAGER_CONFIG
    config = yaml.safe_load(settings.files[f"{PROMETHEUS_DIR}/prometheus.yml"])
    assert config["alerting"] == {"alertmanagers": [{"static_configs": [{"targets": ["127.0.0.1:19093"]}]}]}
    worker = observability_settings(site("pair"), "spark-worker").files
    assert UNIT_FILES["alertmanager"] not in worker and ALERTMANAGER_CONFIG not in worker


def test_the_diff_shows_each_webhook_to_its_host_as_sed_cuts_it_on_the_head(tmp_path):
    """facts/alerting.py's expression, run by the real sed as the head runs it, cuts the rendered
    configuration exactly as the deploy's side does (an unchanged file shows no diff), and no token,
    path or query is left in either."""
    text = alertmanager_config(site("pair", {"alert_webhooks": HOOKS}))
    path = tmp_path / "alertmanager.yml"
    path.write_text(text)
    command = AlertmanagerState().command().get_raw_value().replace(ALERTMANAGER_CONFIG, str(path))
    output = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()
    assert split(output)["shown"] == shown(text).splitlines()
    for secret in ("s3cr3t", "services", "alerts\n", "hook/abc123"):
        assert secret not in shown(text) + "\n"
    assert shown(text).count("/(not shown)") == 3 and "https://hooks.example.com/(not shown)" in shown(text)


def test_no_case_of_alertmanager_prints_a_webhook_past_its_host():
    """What the run prints of alertmanager.yml (its diff, its lines) in every operation case."""
    cases = sorted((REPO / "tests/operations/observability.alertmanager_running").glob("[!_]*.json"))
    assert len(cases) >= 5
    for path in cases:
        case = load(path)
        printed = "\n".join(case.get("printed", [])) + (case.get("noop") or "")
        for url in site(case["site"], case.get("settings")).settings.alert_webhooks:
            host, _, rest = url.split("://", 1)[1].partition("/")
            assert f"{host}/{rest}" not in printed and (len(rest) < 8 or rest not in printed), (path.name, url)
        assert "s3cr3t" not in json.dumps(case.get("printed", [])) and "n3w" not in json.dumps(case.get("printed", []))


OBJECTIVE_STEPS = 600  # two and a half hours of scrapes: long windows need history
OBJECTIVE_TIMES = [30, 59, 61, 63, 70, 90, 125, 145]  # when the objectives' alerts are judged (minutes)
# promtool evaluates the objectives each minute, not each scrape: every time judged is a whole minute
# and no objective alert waits (`for`), so each 15 s gives the same answers there, four times slower.
OBJECTIVE_EVALUATION = 60
ENGINE = {**MODEL, "job": "vllm", "instance": "127.0.0.1:8888", "engine": "0"}


def traffic(door_2xx: str = "0+10x600", door_5xx: str = "0+0.02x600", vllm_error: str = "0x600", ttft_fast: str = "0+9.8x600", itl_fast: str = "0+990x600") -> list[dict]:
    """Ten requests a scrape through the door and into vLLM, a thousand tokens; the counters of the
    bad ones (and the door's 2xx) as given. By default 0.2% fail, 2% wait over 10 s for a first token, 1% of tokens are late."""
    every = f"0+10x{OBJECTIVE_STEPS}"
    return [s("haproxy_frontend_http_responses_total", {**API, "code": "2xx"}, door_2xx),
            s("haproxy_frontend_http_responses_total", {**API, "code": "5xx"}, door_5xx),
            s("vllm:request_success_total", {**ENGINE, "finished_reason": "stop"}, every),
            s("vllm:request_success_total", {**ENGINE, "finished_reason": "error"}, vllm_error),
            s("vllm:time_to_first_token_seconds_bucket", {**ENGINE, "le": "10.0"}, ttft_fast),
            s("vllm:time_to_first_token_seconds_count", ENGINE, every),
            s("vllm:inter_token_latency_seconds_bucket", {**ENGINE, "le": "0.2"}, itl_fast),
            s("vllm:inter_token_latency_seconds_count", ENGINE, f"0+1000x{OBJECTIVE_STEPS}")]


def fired(at: list[int], value: str, labels: dict = HEAD) -> dict:
    return {time: [{**labels, "$value": value}] for time in at}


UNCHECKED = [63, 70, 90, 125, 145]
# Each case: its series, and per alert the times it fires (with its labels and $value), or None where
# it may or may not (a long window half over the fault: its value is no round figure). Every other
# alert of objectives.yml is silent at every time.
OBJECTIVE_CASES = {
    "clients served within every objective": (traffic(), {}),
    "no request at all": ([s(item["series"].split("{")[0], labels_of(item["series"]) | {}, f"0x{OBJECTIVE_STEPS}")
                           for item in traffic()], {}),
    # From 60 min the door answers every request 5xx: the page waits until the last hour holds 14.4%
    # of failures (8.6 min). The ticket fires at once: with an hour of history, a minute of it is
    # already over the 1% of the last three days (and six hours) that its slower branch allows.
    "the door refusing every request from the hour": (traffic(door_2xx="0+10x240 2400x359", door_5xx="0x240 10+10x359"), {
        "DualSparkErrorBudgetBurn": {70: None, 90: None} | fired([125, 145], "100%"),
        "DualSparkErrorBudgetSlowBurn": dict.fromkeys([61, *UNCHECKED]),
    }),
    # Every request of one minute fails: no page (the ticket, as above, sees a minute of an hour's history).
    "a one-minute burst of failures": (traffic(door_2xx="0+10x240 2400x4 2410+10x354", door_5xx="0x240 10+10x3 40x355"), {
        "DualSparkErrorBudgetSlowBurn": dict.fromkeys([61, *UNCHECKED]),
    }),
    "vLLM ending half its requests in error, inside 200 streams": (traffic(vllm_error="0+10x600"), {
        "DualSparkErrorBudgetBurn": fired(OBJECTIVE_TIMES, "50%"),
        "DualSparkErrorBudgetSlowBurn": fired(OBJECTIVE_TIMES, "50%"),
    }),
    "a steady 5% failing": (traffic(door_2xx="0+9.5x600", door_5xx="0+0.5x600"), {
        "DualSparkErrorBudgetSlowBurn": fired(OBJECTIVE_TIMES, "5%"),
    }),
    "a fifth of first tokens and of tokens late": (traffic(ttft_fast="0+8x600", itl_fast="0+800x600"), {
        "DualSparkTtftBudgetSlowBurn": fired(OBJECTIVE_TIMES, "20%", MODEL),
        "DualSparkItlBudgetSlowBurn": fired(OBJECTIVE_TIMES, "20%", MODEL),
    }),
    # From 60 min every first token waits over 10 s and every token is late: the page fires once the
    # last hour is three quarters late, or the last six hours 30% (90 min); the ticket once the whole
    # history (under three days) is 5% late, within minutes.
    "everything late from the hour": (traffic(ttft_fast="0+9.8x240 2352x359", itl_fast="0+990x240 237600x359"), {
        "DualSparkTtftBudgetBurn": {90: None} | fired([125, 145], "100%", MODEL),
        "DualSparkItlBudgetBurn": {90: None} | fired([125, 145], "100%", MODEL),
        "DualSparkTtftBudgetSlowBurn": dict.fromkeys(UNCHECKED),
        "DualSparkItlBudgetSlowBurn": dict.fromkeys(UNCHECKED),
    }),
}


def objective_tests(objective_rules: dict, cases: tuple[str, ...]) -> dict:
    """promtool's test file for objectives.yml: each of ``cases``, every alert judged at every time."""
    alerts = {rule["alert"]: rule for group in objective_rules["groups"] for rule in group["rules"] if "alert" in rule}
    tests = []
    for case in cases:
        series, expected = OBJECTIVE_CASES[case]
        assert set(expected) <= set(alerts), case
        judged = []
        for time in OBJECTIVE_TIMES:
            for name, alert in alerts.items():
                firing = expected.get(name, {}).get(time, [])
                if firing is None:
                    continue
                exp = [{"exp_labels": {**{k: v for k, v in labels.items() if k != "$value"}, **alert["labels"]},
                        "exp_annotations": annotations(alert, labels)} for labels in firing]
                judged.append({"eval_time": f"{time}m", "alertname": name, "exp_alerts": exp})
        tests.append({"name": case, "interval": f"{INTERVAL}s", "input_series": series, "alert_rule_test": judged})
    assert not any("for" in alert for alert in alerts.values()), "an objective alert waits: judge it each scrape"
    return {"rule_files": ["objectives.yml"], "evaluation_interval": f"{OBJECTIVE_EVALUATION}s", "tests": tests}


def objectives_judged(objectives: str, cases: tuple[str, ...], tmp_path: Path) -> subprocess.CompletedProcess:
    """promtool's judgement of ``cases`` against the rule file ``objectives``."""
    (tmp_path / "objectives.yml").write_text(objectives)
    tests = objective_tests(yaml.safe_load(objectives), cases)
    (tmp_path / "objectives_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run([tool("promtool"), "test", "rules", "objectives_test.yml"], cwd=tmp_path, capture_output=True, text=True, timeout=120)


def test_every_objective_alert_has_a_case(rendered):
    objective_rules = yaml.safe_load((rendered["pair"] / "objectives.yml").read_text())
    names = {rule["alert"] for group in objective_rules["groups"] for rule in group["rules"] if "alert" in rule}
    assert names == {name for _, expected in OBJECTIVE_CASES.values() for name, times in expected.items()
                     if any(times.values())}, "an objective alert no case fires"


@pytest.mark.parametrize("case", OBJECTIVE_CASES)
def test_every_objective_alert_fires_when_its_budget_burns_and_only_then(rendered, tmp_path, case):
    """The burn-rate alerts against clients served well, no traffic, the door refusing everything,
    a minute's burst (which pages nothing), vLLM's own errors, a steady trickle of failures (a
    ticket, not a page), and first tokens and tokens late, steadily or all of a sudden. One
    promtool run per case."""
    done = objectives_judged((rendered["pair"] / "objectives.yml").read_text(), (case,), tmp_path)
    assert done.returncode == 0 and "SUCCESS" in done.stdout, done.stdout + done.stderr


def test_an_objective_alert_that_stays_silent_fails_its_test(rendered, tmp_path):
    """The test above can fail: a steady 5% failing against rules whose error budget was taken as 10%."""
    objectives = (rendered["pair"] / "objectives.yml").read_text()
    assert "* 0.01\n" in objectives
    done = objectives_judged(objectives.replace("* 0.01\n", "* 0.1\n"), ("a steady 5% failing",), tmp_path)
    assert done.returncode != 0 and "DualSparkErrorBudgetSlowBurn" in done.stdout + done.stderr


def test_an_objective_is_a_bucket_bound_of_the_served_vllm():
    """The bounds the site may choose are the pinned vLLM's own buckets, and the rule reads that bucket."""
    for histogram, bounds in (("time_to_first_token_seconds", TTFT_BUCKETS), ("inter_token_latency_seconds", ITL_BUCKETS)):
        exported = re.findall(rf'^vllm:{histogram}_bucket{{.*le="([^"]+)"', VLLM_METRICS.read_text(), flags=re.M)
        assert [repr(bound) for bound in bounds] + ["+Inf"] == exported, histogram
    text = rule_files(site("pair", {"slo_ttft_seconds": 2.5, "slo_itl_seconds": 0.1}))["objectives.yml"]
    assert 'time_to_first_token_seconds_bucket{le="2.5"}' in text and 'inter_token_latency_seconds_bucket{le="0.1"}' in text
