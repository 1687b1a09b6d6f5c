"""The benchmark parsers on the real output formats of each tool (tests/bench/fixtures/)."""

from pathlib import Path

import pytest

from bench.parsers import (
    parse_all_reduce_perf,
    parse_ib_write_bw,
    parse_iperf3,
    parse_nvidia_smi_csv,
    parse_ping,
    parse_prometheus,
)

FIXTURES = Path(__file__).parent / "fixtures"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_ping_jumbo_summary():
    assert parse_ping(fixture("ping_jumbo.txt")) == {
        "sent": 3, "received": 3, "loss_pct": 0.0, "rtt_avg_ms": 0.054, "error": None, "unreadable": []}


def test_ping_local_mtu_error():
    text = ("PING 10.0.0.2 (10.0.0.2) from 10.0.0.1 enp1s0f0np0: 8972(9000) bytes of data.\n"
            "ping: local error: message too long, mtu=1500\n\n--- 10.0.0.2 ping statistics ---\n"
            "1 packets transmitted, 0 received, +1 errors, 100% packet loss, time 0ms\n")
    assert parse_ping(text) == {"sent": 1, "received": 0, "loss_pct": 100.0, "rtt_avg_ms": None,
                                "error": "local error: message too long, mtu=1500", "unreadable": []}


def test_iperf3_forward_two_streams():
    result = parse_iperf3(fixture("iperf3_forward.json"))
    assert result["streams"] == 2 and result["reverse"] is False and result["error"] is None
    assert result["sent_gbps"] > 1 and result["received_gbps"] > 1


def test_iperf3_reverse():
    result = parse_iperf3(fixture("iperf3_reverse.json"))
    assert result["reverse"] is True and result["received_gbps"] > 1


def test_iperf3_error_is_reported():
    assert parse_iperf3(fixture("iperf3_refused.json"))["error"].startswith("unable to connect to server")


@pytest.mark.parametrize("name, peak, average", [
    ("ib_write_bw_gbits.txt", 109.21, 108.97),
    # perftest's "MB/sec" is MiB/s: 13018.77 x 2^20 B/s = 109.21 Gb/s (read as 10^6 B it would be 4.6% low)
    ("ib_write_bw_mbytes.txt", 109.21, 108.97),
    ("ib_write_bw_mibytes.txt", 109.21, 108.97),  # newer perftest names the unit MiB/sec
])
def test_ib_write_bw(name, peak, average):
    result = parse_ib_write_bw(fixture(name))
    assert (result["device"], result["gid_index"], result["mtu"], result["link_type"]) == ("rocep1s0f0", 3, 4096, "Ethernet")
    assert result["rows"] == [{"bytes": 65536, "iterations": 5000, "peak_gbps": peak, "average_gbps": average,
                               "msg_rate_mpps": 0.207843}]
    assert result["average_gbps"] == average and result["error"] is None


def test_ib_write_bw_without_results():
    assert parse_ib_write_bw(" Did not detect devices \n Unable to find the Infiniband/RoCE device\n")["error"] == (
        "no result table: Unable to find the Infiniband/RoCE device")


def test_all_reduce_over_rdma():
    result = parse_all_reduce_perf(fixture("all_reduce_perf_rdma.txt"))
    assert result["hosts"] == ["spark-head", "spark-worker"]
    assert len(result["rows"]) == 15 and result["rows"][-1]["bytes"] == 1073741824
    assert result["peak_busbw_gbps"] == 21.73 and result["average_busbw_gbps"] == 6.356
    assert result["below_target"] is True and result["tcp_fallback_suspected"] is False


def test_all_reduce_tcp_fallback_is_flagged():
    result = parse_all_reduce_perf(fixture("all_reduce_perf_tcp_fallback.txt"))
    assert result["peak_busbw_gbps"] == 2.05
    assert result["tcp_fallback_suspected"] is True and result["below_target"] is True


def test_prometheus_sums_label_sets():
    text = fixture("vllm_metrics.txt")
    metrics = parse_prometheus(text)
    assert metrics.get("vllm:spec_decode_num_drafts_total") == 2.0
    assert metrics.get("vllm:spec_decode_num_accepted_tokens_per_pos_total") == 2.0  # positions 0, 1, 2: 2 + 0 + 0
    assert metrics.get("vllm:generation_tokens_total") == 20.0
    assert metrics.unreadable == []


def test_nvidia_smi_csv_with_units_and_gb10_na_memory():
    """--format=csv as a GB10 writes it: units in the header and the values, memory [N/A]."""
    rows = parse_nvidia_smi_csv([
        "timestamp, name, utilization.gpu [%], memory.used [MiB], temperature.gpu, power.draw [W], clocks.current.sm [MHz]",
        "2026/07/19 12:04:52.344, NVIDIA GB10, 96 %, [N/A], 56, 66.53 W, 2476 MHz",
        "timestamp, name, utilization.gpu [%], memory.used [MiB], temperature.gpu, power.draw [W], clocks.current.sm [MHz]",
        "2026/07/19 12:04:53.344, NVIDIA GB10, 0 %, Not Supported, 57, 13.50 W, 2398 MHz",
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver",
    ])
    assert rows == [
        {"timestamp": "2026/07/19 12:04:52.344", "name": "NVIDIA GB10", "utilization.gpu": 96.0, "memory.used": None,
         "temperature.gpu": 56.0, "power.draw": 66.53, "clocks.current.sm": 2476.0},
        {"timestamp": "2026/07/19 12:04:53.344", "name": "NVIDIA GB10", "utilization.gpu": 0.0, "memory.used": None,
         "temperature.gpu": 57.0, "power.draw": 13.5, "clocks.current.sm": 2398.0},
    ]


def test_nvidia_smi_csv_keeps_what_is_not_a_number_as_text():
    rows = parse_nvidia_smi_csv(["power.draw [W], temperature.gpu", "., 1.2.3 C"])
    assert rows == [{"power.draw": ".", "temperature.gpu": "1.2.3 C"}]


def test_nvidia_smi_csv_without_a_header_reads_nothing():
    assert parse_nvidia_smi_csv(["2026/07/19 12:04:52.344, NVIDIA GB10, 96 %"]) == []
