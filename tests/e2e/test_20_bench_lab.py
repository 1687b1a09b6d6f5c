"""The benchmarks' remote parts against the lab: fabric benchmark, nvidia-smi telemetry over
SSH, and the SSH tunnel to an API that listens on the head's loopback only."""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from bench.parsers import parse_nvidia_smi_csv
from bench.remote import LineStream, Target, connect, forward
from bench.serving import TELEMETRY_QUERY
from lab.config import DEPLOY_USER, LAB_DIR, NODES
from tests.e2e.conftest import LAB_ENV, REPO

pytestmark = pytest.mark.end_to_end


def ssh(node):
    return connect(Target(DEPLOY_USER, node.address, 22, str(LAB_DIR / "id_ed25519")), str(LAB_DIR / "known_hosts"))


def test_fabric_benchmark_measures_what_the_lab_has(converged, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.fabric", "--seconds", "1", "--out", str(tmp_path)], cwd=REPO,
        env=LAB_ENV, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    [raw] = tmp_path.glob("fabric-*.json")
    record = json.loads(raw.read_text())
    assert record["pair"] == [NODES["head"].hostname, NODES["worker"].hostname]  # the head and rank 1 by default
    assert [rail["netdevs"][0] for rail in record["rails"]] == ["enp1s0f0np0", "enP2p1s0f0np0"]
    for rail in record["rails"]:
        assert rail["ping"]["size"] == 8972 and rail["ping"]["received"] == rail["ping"]["sent"] == 5
        assert rail["iperf3_forward"]["received_gbps"] > 0 and rail["iperf3_forward"]["reverse"] is False
        assert rail["iperf3_reverse"]["received_gbps"] > 0 and rail["iperf3_reverse"]["reverse"] is True
        # The lab has the RDMA sysfs tree but no verbs device: perftest says so, and so does the record.
        assert rail["ib_write_bw"]["error"].startswith("no result table")
    assert f"all_reduce_perf is not on {NODES['head'].hostname}'s PATH" in record["nccl_all_reduce"]["skipped"]
    kept = {path.name for path in Path(record["raw_output_dir"]).iterdir()}
    assert {"ping-rail0.txt", "iperf3-rail1-reverse.txt", "ib_write_bw-rail0.txt"} <= kept


def test_telemetry_keeps_gb10_na_memory_as_none(converged):
    with ssh(NODES["head"]) as client:
        stream = LineStream(client, f"nvidia-smi --query-gpu={TELEMETRY_QUERY} --format=csv -l 1")
        time.sleep(3.5)
        rows = parse_nvidia_smi_csv(stream.stop())
    assert len(rows) >= 2
    assert all(row["name"] == "NVIDIA GB10" and row["memory.used"] is None and row["temperature.gpu"] == 42.0
               and row["power.draw"] == 4.31 for row in rows)


def test_tunnel_reaches_an_api_on_the_heads_loopback(converged):
    """A server on the head's loopback (a port beside the served API's) is reached only through the tunnel."""
    with ssh(NODES["head"]) as client:
        server = LineStream(client, "cd /etc/netplan && exec python3 -m http.server --bind 127.0.0.1 18888")
        try:
            with forward(client, "127.0.0.1", 18888) as port:
                deadline = time.monotonic() + 20
                while True:  # until the server is listening on the head's loopback
                    try:
                        response = requests.get(f"http://127.0.0.1:{port}/", timeout=10)
                        break
                    except requests.ConnectionError:
                        assert time.monotonic() < deadline, "no answer through the tunnel in 20 s"
                        time.sleep(0.3)
            with pytest.raises(requests.ConnectionError):
                requests.get(f"http://{NODES['head'].address}:18888/", timeout=2)
        finally:
            server.stop()
    assert response.status_code == 200 and "40-dual-spark.yaml" in response.text
