"""The collector of Spark metrics (files/dual_spark/metrics.py): its readings of nvidia-smi, sysfs,
/proc/meminfo and the deploy's own records on real output formats, tolerant of every reading
that is missing; and the textfile it writes, as the shipped archive runs it, accepted by the real
`promtool check metrics`; and `metrics rates` against a stand-in for Prometheus's API."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dual_spark import metrics

from tests.net import json_server
from tests.observability import promtool
from tests.programs import ARCHIVE

# nvidia-smi --query-gpu=index,name,power.draw,temperature.gpu,clocks.sm,utilization.gpu --format=csv,noheader,nounits
GB10 = ["0, NVIDIA GB10, 4.31, 42, 208, 0"]  # the lab's stand-in, from a GB10's formats
GB10_NOT_READ = ["0, NVIDIA GB10, [N/A], 42, [N/A], [Not Supported]"]
# A real H200 (driver 580.159) answered these fields with units (MACHINE-NOTES.md): read the same
H200_WITH_UNITS = ["0, NVIDIA H200, 105.64 W, 33, 345 MHz, 0 %", "1, NVIDIA H200, 98.10 W, 31, 345 MHz, 12 %"]
NVML_MISMATCH = ["Failed to initialize NVML: Driver/library version mismatch", "NVML library version: 580.95"]
NO_DEVICES = ["No devices were found"]
# nvidia-smi --query-gpu=index,clocks_event_reasons.active,clocks_event_reasons.{hw_slowdown,sw_thermal_slowdown,
# hw_thermal_slowdown,hw_power_brake_slowdown} --format=csv,noheader: each reason's own field, and the bitmask
IDLE = ["0, 0x0000000000000001, Not Active, Not Active, Not Active, Not Active"]
HOT = ["0, 0x0000000000000060, Not Active, Active, Active, Not Active"]
MASK_ONLY = ["0, 0x0000000000000048, [N/A], [N/A], [N/A], [N/A]"]  # hw_slowdown and hw_thermal_slowdown, by their bits
NOT_REPORTED = ["0, [N/A], [N/A], [N/A], [N/A], [N/A]"]
UNKNOWN_FIELD = ['Field "clocks_event_reasons.active" is not a valid field to query.']
MEMINFO = ("MemTotal:       127506841 kB\nMemFree:        121008128 kB\nMemAvailable:   123102412 kB\n"
           "Buffers:          262144 kB\nCached:         2097152 kB\n")


@pytest.mark.parametrize("lines, gpus, state", [
    (GB10, [{"index": "0", "name": "NVIDIA GB10", "power.draw": "4.31", "temperature.gpu": "42", "clocks.sm": "208",
             "utilization.gpu": "0"}], "ok"),
    (H200_WITH_UNITS, 2, "ok"),
    (GB10_NOT_READ, 1, "ok"),
    (NVML_MISMATCH, [], "Failed to initialize NVML: Driver/library version mismatch"),
    (NO_DEVICES, [], "No devices were found"),
    ([], [], "no output"),
])
def test_nvidia_smi_is_read_whatever_it_prints(lines, gpus, state):
    found, seen = metrics.gpu_readings(lines)
    assert seen == state
    assert (len(found) if isinstance(gpus, int) else found) == gpus


@pytest.mark.parametrize("lines, found", [
    (IDLE, {"0": {"hw_slowdown": 0, "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 0, "hw_power_brake_slowdown": 0}}),
    (HOT, {"0": {"hw_slowdown": 0, "sw_thermal_slowdown": 1, "hw_thermal_slowdown": 1, "hw_power_brake_slowdown": 0}}),
    (MASK_ONLY, {"0": {"hw_slowdown": 1, "sw_thermal_slowdown": 0, "hw_thermal_slowdown": 1, "hw_power_brake_slowdown": 0}}),
    (NOT_REPORTED, {"0": {}}),
    (UNKNOWN_FIELD, {}),
    (NO_DEVICES, {}),
])
def test_slowdowns_are_read_from_each_reasons_field_or_the_bitmask(lines, found):
    assert metrics.slowdowns(lines) == found


MOUNTINFO = ("22 1 8:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw\n"
             "31 22 8:3 / /srv/models\\040fast rw,relatime shared:2 - ext4 /dev/nvme1n1p1 rw\n"
             "40 22 0:40 / /srv/models\\040fast/tmp rw - tmpfs tmpfs rw\n")


@pytest.mark.parametrize("path, point", [
    ("/var/lib/dual-spark/model", "/"), ("/srv/models fast", "/srv/models fast"), ("/srv/models fast/deepseek", "/srv/models fast"),
    ("/srv/models fastest", "/"),  # a name that only begins like the mount point is not under it
])
def test_the_model_store_is_on_the_longest_mount_point_above_it(path, point):
    assert metrics.mount_point(MOUNTINFO, path) == point
    assert metrics.mount_point("", path) is None


@pytest.mark.parametrize("text, value", [("4.31", 4.31), ("105.64 W", 105.64), ("[N/A]", None), ("[Not Supported]", None),
                                         ("N/A", None), ("", None), ("nan", None), ("-1\n", -1.0), (None, None), ("Invalid", None)])
def test_a_reading_is_a_number_or_none(text, value):
    assert metrics.number(text) == value


def test_unified_memory_comes_from_meminfo():
    assert metrics.meminfo(MEMINFO) == {"MemTotal": 127506841 * 1024, "MemAvailable": 123102412 * 1024}
    assert metrics.meminfo("") == {} and metrics.meminfo("MemAvailable: lots kB\n") == {}


def sysfs(root: Path, netdevs: dict, rdma: dict) -> Path:
    """A sysfs tree: netdevs {name: {file: text}} (statistics/... as paths), RDMA devices
    {name: {port: {file: text}}} (counters/... as paths)."""
    for name, files in netdevs.items():
        for path, text in files.items():
            (root / "class/net" / name / path).parent.mkdir(parents=True, exist_ok=True)
            (root / "class/net" / name / path).write_text(text)
    for name, ports in rdma.items():
        for port, files in ports.items():
            for path, text in files.items():
                target = root / "class/infiniband" / name / "ports" / port / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(text)
    return root


CX7 = {"operstate": "up\n", "speed": "200000\n", "mtu": "9000\n", "statistics/tx_bytes": "1000\n", "statistics/rx_bytes": "2000\n",
       "statistics/rx_errors": "0\n", "statistics/tx_errors": "0\n", "statistics/rx_dropped": "3\n", "statistics/tx_dropped": "0\n"}
PORT = {"state": "4: ACTIVE\n", "counters/port_xmit_data": "250\n", "counters/port_rcv_data": "500\n", "counters/symbol_error": "0\n",
        "counters/link_downed": "1\n"}


def test_a_rail_is_read_from_its_netdev_and_its_rdma_port(tmp_path):
    root = sysfs(tmp_path, {"enp1s0f0np0": CX7}, {"rocep1s0f0": {"1": PORT}})
    reading = metrics.rail_readings(root, "enp1s0f0np0", "rocep1s0f0")
    assert reading["present"] and reading["up"] == 1.0 and reading["speed_mbps"] == 200000 and reading["mtu"] == 9000
    assert reading["bytes"] == {"transmit": 1000, "receive": 2000}
    port = reading["ports"]["1"]
    assert port["active"] == 1.0 and port["bytes"] == {"transmit": 1000, "receive": 2000}  # port_*_data counts 4-byte words
    assert port["errors"]["link_downed"] == 1 and port["errors"]["port_rcv_errors"] is None  # a counter sysfs lacks: left out


def test_a_rail_that_is_down_or_missing_reads_as_such(tmp_path):
    down = {**CX7, "operstate": "down\n", "speed": "-1\n"}
    root = sysfs(tmp_path, {"enp1s0f0np0": down}, {"rocep1s0f0": {"1": {"state": "1: DOWN\n"}}})
    reading = metrics.rail_readings(root, "enp1s0f0np0", "rocep1s0f0")
    assert reading["up"] == 0.0 and reading["speed_mbps"] is None and reading["ports"]["1"]["active"] == 0.0
    gone = metrics.rail_readings(root, "enP2p1s0f0np0", "roceP2p1s0f0")
    assert not gone["present"] and gone["up"] is None and gone["ports"] == {} and gone["bytes"] == {"transmit": None, "receive": None}


@pytest.mark.parametrize("text, record", [
    ('{"failed_starts": 0, "healthy": true}', {"failed_starts": 0, "healthy": True, "restarts": None, "last_start_seconds": None}),
    ('{"failed_starts": 3, "healthy": false, "restarts": 4, "last_start_seconds": 412.5}',
     {"failed_starts": 3, "healthy": False, "restarts": 4, "last_start_seconds": 412.5}),
    ('{"failed_starts": 0, "healthy": true, "restarts": -1, "last_start_seconds": "90"}',
     {"failed_starts": 0, "healthy": True, "restarts": None, "last_start_seconds": None}),
    ('{"failed_starts": 0, "healthy": true, "restarts": true, "last_start_seconds": -3}',
     {"failed_starts": 0, "healthy": True, "restarts": None, "last_start_seconds": None}),
    ("", None), ("{", None), ('["x"]', None), ('{"failed_starts": "2", "healthy": false}', None), (None, None),
    ('{"failed_starts": -1, "healthy": false}', None),
])
def test_the_watchdogs_record_is_read_or_left_out(text, record):
    assert metrics.watchdog_record(text) == record


def test_starts_are_counted_from_the_watchdogs_writes():
    """A start writes the record unhealthy, serving writes it healthy: each unhealthy write is a
    start, a healthy write after a healthy one is a start that served between two readings, and
    failed starts that jumped by more than one are starts too. The first reading is the baseline."""
    state = metrics.starts_seen({}, {"failed_starts": 0, "healthy": True}, 100.0)
    assert state["starts"] == 0
    for record, mtime, starts in [
        ({"failed_starts": 0, "healthy": True}, 100.0, 0),  # nothing written since
        ({"failed_starts": 0, "healthy": False}, 110.0, 1),  # a start
        ({"failed_starts": 0, "healthy": True}, 150.0, 1),  # it served
        ({"failed_starts": 0, "healthy": True}, 190.0, 2),  # another start that served between two readings
        ({"failed_starts": 1, "healthy": False}, 200.0, 3),  # a start after one that never served
        ({"failed_starts": 4, "healthy": False}, 300.0, 6),  # three more, two of them between readings
        (None, None, 6),  # the record is gone: nothing counted
    ]:
        state = metrics.starts_seen(state, record, mtime)
        assert state["starts"] == starts, (record, mtime)


def test_the_state_that_serves_becomes_labels():
    state = {"cluster": "c", "stack": "s", "profile": "adaptive", "image": "dual-spark/tony-overlay:abc",
             "model": {"repo": "deepseek-ai/DeepSeek-V4-Flash", "revision": "0" * 40}, "model_digest": "1a2b3c4d5e6f",
             "image_id": "sha256:" + "f" * 64, "since": "2026-12-01T10:00:00Z"}
    assert metrics.served_labels(json.dumps(state)) == {
        "profile": "adaptive", "image": "dual-spark/tony-overlay:abc", "image_id": "sha256:ffffffffffff", "model": "deepseek-ai/DeepSeek-V4-Flash",
        "revision": "0" * 40, "model_digest": "1a2b3c4d5e6f", "since": "2026-12-01T10:00:00Z"}
    assert metrics.served_labels(json.dumps({**state, "model": {"path": "/srv/m"}}))["model"] == "/srv/m"
    assert metrics.served_labels("") is None and metrics.served_labels("[]") is None


def collect(tmp_path: Path, nvidia_smi: list[str] | None, *extra: str, events: list[str] = IDLE) -> str:
    """The archive's `metrics collect --once` against a fake node under ``tmp_path``; the textfile.
    The fake nvidia-smi prints ``nvidia_smi`` for the readings, ``events`` for the slowdowns."""
    return collected(tmp_path, nvidia_smi, *extra, events=events).stdout


def collected(tmp_path: Path, nvidia_smi: list[str] | None, *extra: str, events: list[str] = IDLE) -> subprocess.CompletedProcess:
    """``collect``'s run: its stdout is the textfile, its stderr what the collector said."""
    out = tmp_path / "textfile/dual-spark.prom"
    out.parent.mkdir(exist_ok=True)
    smi = ["/nonexistent/nvidia-smi"]
    if nvidia_smi is not None:
        script = tmp_path / "nvidia-smi"
        echo = "".join
        script.write_text('#!/bin/sh\ncase "$*" in *clocks_event_reasons*)\n' + echo(f"echo '{line}'\n" for line in events)
                          + ";;\n*)\n" + echo(f"echo '{line}'\n" for line in nvidia_smi) + ";;\nesac\n")
        script.chmod(0o755)
        smi = [str(script)]
    done = subprocess.run([sys.executable, str(ARCHIVE), "metrics", "collect", "--out", str(out), "--role", "head", "--watchdog-state",
                           str(tmp_path / "serving/head-starts"), "--stack-dir", str(tmp_path / "stack"), "--state",
                           str(tmp_path / "state.json"), "--model-dir", "/var/lib/dual-spark/model", "--once", "--nvidia-smi", *smi,
                           "--sysfs", str(tmp_path / "sys"), "--proc", str(tmp_path / "proc"), *extra],
                          check=True, timeout=60, capture_output=True, text=True)
    assert not [path.name for path in out.parent.iterdir() if path.name != out.name]  # no temporary file left
    done.stdout = out.read_text()
    return done


def test_the_textfile_of_a_converged_head_holds_every_reading(tmp_path):
    sysfs(tmp_path / "sys", {"enp1s0f0np0": CX7, "enP2p1s0f0np0": {**CX7, "speed": "100000\n"}},
          {"rocep1s0f0": {"1": PORT}, "roceP2p1s0f0": {"1": PORT}})
    (tmp_path / "proc/1").mkdir(parents=True)
    (tmp_path / "proc/meminfo").write_text(MEMINFO)
    (tmp_path / "proc/1/mountinfo").write_text(MOUNTINFO)
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving/head-starts").write_text('{"failed_starts": 2, "healthy": false, "restarts": 3, "last_start_seconds": 412.5}')
    (tmp_path / "serving/planned-work").write_text('{"since": 1764590400, "until": 1764592200.5, "what": "profile fast"}')
    (tmp_path / "stack/served").mkdir(parents=True)
    (tmp_path / "stack/served/state.json").write_text(json.dumps({"profile": "fast", "image": "img:1", "model": {"path": "/srv/m"},
                                                                  "model_digest": "abc"}) + "\n")
    text = collect(tmp_path, GB10, "--rail", "enp1s0f0np0,rocep1s0f0", "--rail", "enP2p1s0f0np0,roceP2p1s0f0",
                   "--planned", str(tmp_path / "serving/planned-work"), events=HOT)
    promtool("check", "metrics", stdin=text)
    for sample in ['dual_spark_gpu_info{gpu="0",name="NVIDIA GB10"} 1', 'dual_spark_gpu_power_watts{gpu="0",name="NVIDIA GB10"} 4.31',
                   'dual_spark_gpu_slowdown_active{gpu="0",name="NVIDIA GB10",reason="hw_thermal_slowdown"} 1',
                   'dual_spark_gpu_slowdown_active{gpu="0",name="NVIDIA GB10",reason="hw_slowdown"} 0',
                   'dual_spark_model_store_info{model_dir="/var/lib/dual-spark/model",mountpoint="/"} 1',
                   'dual_spark_gpu_sm_clock_hertz{gpu="0",name="NVIDIA GB10"} 208000000',
                   'dual_spark_gpu_utilization_ratio{gpu="0",name="NVIDIA GB10"} 0',
                   f"dual_spark_unified_memory_available_bytes {123102412 * 1024}",
                   'dual_spark_rail_speed_mbps{rail="1",netdev="enP2p1s0f0np0"} 100000',
                   'dual_spark_rail_transmit_bytes_total{rail="0",netdev="enp1s0f0np0",path="rdma",port="1"} 1000',
                   'dual_spark_rail_roce_port_active{rail="0",netdev="enp1s0f0np0",rdma="rocep1s0f0",port="1"} 1',
                   'dual_spark_watchdog_failed_starts{role="head"} 2', 'dual_spark_watchdog_serving{role="head"} 0',
                   'dual_spark_vllm_container_restarts_total{role="head"} 3', 'dual_spark_vllm_last_start_seconds{role="head"} 412.5',
                   "dual_spark_planned_work_started_seconds 1764590400", "dual_spark_planned_work_expires_seconds 1764592200.5",
                   'dual_spark_serving_info{profile="fast",image="img:1",image_id="",model="/srv/m",revision="",model_digest="abc",since=""} 1']:
        assert sample + "\n" in text, sample
    assert "dual_spark_collector_errors" not in text


def test_a_node_with_nothing_to_read_still_writes_a_valid_file(tmp_path):
    """No nvidia-smi, no sysfs, no meminfo, no records: the file says so and guesses nothing."""
    text = collect(tmp_path, None, "--rail", "enp1s0f0np0,rocep1s0f0")
    promtool("check", "metrics", stdin=text)
    assert 'dual_spark_gpu_readable{state="absent"} 0' in text and 'dual_spark_collector_errors{reading="meminfo"} 1' in text
    assert 'dual_spark_collector_errors{reading="mounts"} 1' in text and "dual_spark_model_store_info" not in text
    assert "dual_spark_gpu_info" not in text and "dual_spark_gpu_slowdown_active" not in text
    assert "dual_spark_vllm_container_restarts_total" not in text
    assert 'dual_spark_rail_present{rail="0",netdev="enp1s0f0np0"} 0' in text
    assert "dual_spark_gpu_power_watts" not in text and "dual_spark_watchdog_failed_starts" not in text
    assert "dual_spark_serving_info" not in text and "dual_spark_planned_work" not in text


def test_a_failing_nvidia_smi_is_named_not_read(tmp_path):
    text = collect(tmp_path, NVML_MISMATCH)
    assert 'dual_spark_gpu_readable{state="Failed to initialize NVML: Driver/library version mismatch"} 0' in text
    assert 'dual_spark_collector_errors{reading="gpu"} 1' in text and "dual_spark_gpu_power_watts" not in text
    assert "dual_spark_gpu_info" not in text and "gpu slowdowns" not in text  # no GPU: no slowdowns asked for


def test_a_driver_without_the_slowdown_fields_keeps_the_gpus_readings(tmp_path):
    text = collect(tmp_path, GB10, events=UNKNOWN_FIELD)
    assert 'dual_spark_gpu_readable{state="ok"} 1' in text and 'dual_spark_gpu_info{gpu="0",name="NVIDIA GB10"} 1' in text
    assert 'dual_spark_collector_errors{reading="gpu slowdowns"} 1' in text and "dual_spark_gpu_slowdown_active" not in text


def test_the_collectors_record_carries_the_starts_it_has_seen(tmp_path):
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving/head-starts").write_text('{"failed_starts": 0, "healthy": false}')
    (tmp_path / "state.json").write_text(json.dumps({"mtime": 1.5, "healthy": True, "failed": 0, "starts": 7}))
    assert 'dual_spark_watchdog_starts_total{role="head"} 8\n' in collect(tmp_path, GB10)  # a start since the record
    assert json.loads((tmp_path / "state.json").read_text())["starts"] == 8 and not (tmp_path / "state.json.unusable").exists()


@pytest.mark.parametrize("record", [
    "{", "\xff\xfe", "[]", "null", json.dumps({"starts": 7}),  # not JSON, not bytes of text, not a record, not all of it
    json.dumps({"mtime": "yesterday", "healthy": True, "failed": 0, "starts": 7}),
    json.dumps({"mtime": 1.5, "healthy": 1, "failed": 0, "starts": 7}),
    json.dumps({"mtime": 1.5, "healthy": True, "failed": 0, "starts": "7"}),
    json.dumps({"mtime": 1.5, "healthy": True, "failed": -1, "starts": 7}),
    json.dumps({"mtime": 1.5, "healthy": True, "failed": 0, "starts": 7, "by": "someone else"}),
])
def test_a_record_it_cannot_use_is_set_aside_and_collection_goes_on(tmp_path, record):
    """A record that is not what the collector writes would fail it at every start, for ever: it
    is renamed FILE.unusable, the collector says so, and writes its textfile and a new record."""
    (tmp_path / "serving").mkdir()
    (tmp_path / "serving/head-starts").write_text('{"failed_starts": 0, "healthy": false}')
    (tmp_path / "state.json").write_bytes(record.encode("latin-1"))
    done = collected(tmp_path, GB10)
    assert 'dual_spark_watchdog_starts_total{role="head"} 0\n' in done.stdout  # a first reading: its baseline
    assert (tmp_path / "state.json.unusable").read_bytes() == record.encode("latin-1")
    assert f"{tmp_path / 'state.json'} is " in done.stderr and f"set aside as {tmp_path / 'state.json.unusable'}" in done.stderr
    assert metrics.usable(json.loads((tmp_path / "state.json").read_text()))


def test_a_record_that_is_a_directory_is_set_aside_too(tmp_path):
    (tmp_path / "state.json").mkdir()
    done = collected(tmp_path, GB10)
    assert (tmp_path / "state.json.unusable").is_dir() and "unreadable" in done.stderr
    assert metrics.usable(json.loads((tmp_path / "state.json").read_text()))


def test_a_label_value_is_escaped():
    found = metrics.Metrics()
    found.add("m", "gauge", "h", {"a": 'x"y\\z\nw'}, 1.0)
    assert 'm{a="x\\"y\\\\z\\nw"} 1\n' in found.text()


@pytest.fixture
def prometheus_api():
    """Prometheus's HTTP API: a range query of the recording rules and the alerts."""
    def answer(path: str) -> dict:
        if path.startswith("/api/v1/query?"):
            return {"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"__name__": "dual_spark:decode_tokens_per_second:per_stream", "node": "spark-head", "model_name": "tiny"},
                 "values": [[1, "30"], [2, "NaN"], [3, "40"]]},
                {"metric": {"__name__": "dual_spark:kv_cache_usage:ratio", "node": "spark-head", "model_name": "tiny"},
                 "values": [[1, "NaN"]]}]}}
        return {"status": "success", "data": {"alerts": [{"labels": {"alertname": "DualSparkRailSlow", "node": "spark-worker"},
                                                          "annotations": {"summary": "Rail 1 is slow"},
                                                          "state": "firing", "value": "1e+05"}]}}

    with json_server(answer) as url:
        yield url


def rates(url: str) -> dict:
    done = subprocess.run([sys.executable, str(ARCHIVE), "metrics", "rates", "--url", url, "--timeout", "5"], capture_output=True,
                          text=True, check=True, env={**os.environ, "no_proxy": "*"})
    return json.loads(done.stdout)


def test_rates_read_the_recording_rules_and_the_alerts(prometheus_api):
    reading = rates(prometheus_api)
    assert reading["ok"] and reading["error"] is None and reading["window_seconds"] == 300
    assert reading["series"] == [
        {"name": "dual_spark:decode_tokens_per_second:per_stream", "labels": {"node": "spark-head", "model_name": "tiny"}, "mean": 35.0,
         "last": 40.0},
        {"name": "dual_spark:kv_cache_usage:ratio", "labels": {"node": "spark-head", "model_name": "tiny"}, "mean": None, "last": None}]
    assert reading["alerts"] == [{"name": "DualSparkRailSlow", "state": "firing", "labels": {"node": "spark-worker"},
                                  "summary": "Rail 1 is slow"}]


def test_rates_say_when_prometheus_does_not_answer():
    reading = rates("http://127.0.0.1:9")
    assert not reading["ok"] and reading["error"].startswith("no answer at http://127.0.0.1:9")
