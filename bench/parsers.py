"""Parsers for the real output of the tools the benchmarks run: ping, iperf3 (JSON),
perftest's ib_write_bw, nccl-tests' all_reduce_perf, nvidia-smi's CSV, and Prometheus text from vLLM.

None of them raises: output they cannot read gives a reading with ``error`` set and the lines
in ``unreadable``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

NCCL_TARGET_BUS_GBPS = 21.875
NCCL_TCP_FALLBACK_GBPS = 3.0
MIB = 1 << 20

PROMETHEUS_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)(\s+\S+)?\s*$")
CSV_FIELD = re.compile(r"([a-z][a-z0-9_.]*)(?: \[[^\]]+\])?")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


@dataclass
class Metrics:
    """Prometheus samples: ``totals`` sums each metric over its label sets; ``series`` keeps
    (labels, value) per metric; ``unreadable`` the lines that are neither samples nor comments."""

    totals: dict[str, float] = field(default_factory=dict)
    series: dict[str, list[tuple[dict[str, str], float]]] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)

    def get(self, name: str, default: float = 0.0) -> float:
        return self.totals.get(name, default)


def parse_prometheus(text: str) -> Metrics:
    metrics = Metrics()
    for line in _lines(text):
        if line.startswith("#"):
            continue
        match = PROMETHEUS_SAMPLE.match(line)
        try:
            value = float(match.group(3))
        except (AttributeError, ValueError):
            metrics.unreadable.append(line)
            continue
        name = match.group(1)
        labels = dict(LABEL.findall(match.group(2) or ""))
        metrics.totals[name] = metrics.totals.get(name, 0.0) + value
        metrics.series.setdefault(name, []).append((labels, value))
    return metrics


def parse_ping(text: str) -> dict:
    """iputils ping summary: {"sent": 3, "received": 3, "loss_pct": 0.0, "rtt_avg_ms": 0.051}."""
    result = {"sent": 0, "received": 0, "loss_pct": 100.0, "rtt_avg_ms": None, "error": None, "unreadable": []}
    counts = re.search(r"(\d+) packets transmitted, (\d+) (?:packets )?received.*?([\d.]+)% packet loss", text)
    if counts:
        result.update(sent=int(counts.group(1)), received=int(counts.group(2)), loss_pct=float(counts.group(3)))
    rtt = re.search(r"= [\d.]+/([\d.]+)/[\d.]+/[\d.]+ ms", text)
    if rtt:
        result["rtt_avg_ms"] = float(rtt.group(1))
    error = re.search(r"^ping: (.+)$", text, flags=re.M)
    if error:
        result["error"] = error.group(1).strip()
    elif not counts:
        result["error"] = "unreadable ping output"
        result["unreadable"] = _lines(text)
    return result


def parse_iperf3(text: str) -> dict:
    """iperf3 -J: sender and receiver Gb/s, retransmits, and whether it ran reversed."""
    try:
        data = json.loads(text)
        if "error" in data:
            return {"error": str(data["error"]), "unreadable": []}
        end, start = data["end"], data["start"]["test_start"]
        return {
            "sent_gbps": round(end["sum_sent"]["bits_per_second"] / 1e9, 3),
            "received_gbps": round(end["sum_received"]["bits_per_second"] / 1e9, 3),
            "retransmits": end["sum_sent"].get("retransmits"),
            "reverse": bool(start.get("reverse")),
            "streams": start.get("num_streams"),
            "error": None,
            "unreadable": [],
        }
    except (ValueError, KeyError, TypeError, AttributeError):
        return {"error": "unreadable iperf3 output", "unreadable": _lines(text)[:5]}


def parse_ib_write_bw(text: str) -> dict:
    """perftest ib_write_bw: device, GID index, MTU and the result rows, in Gb/s. perftest's
    "MB/sec" column is MiB/s (it divides by 0x100000); newer builds say "MiB/sec"."""
    result: dict = {"device": None, "gid_index": None, "mtu": None, "link_type": None, "rows": [],
                    "average_gbps": None, "error": None, "unreadable": []}
    for key, pattern in (("device", r"Device\s*:\s*(\S+)"), ("gid_index", r"GID index\s*:\s*(\d+)"),
                         ("mtu", r"Mtu\s*:\s*(\d+)"), ("link_type", r"Link type\s*:\s*(\S+)")):
        match = re.search(pattern, text)
        if match:
            result[key] = int(match.group(1)) if key in ("gid_index", "mtu") else match.group(1)
    header = re.search(r"#bytes\s+#iterations\s+BW peak\[(MB|MiB|Gb)/sec\]\s+BW average\[(?:MB|MiB|Gb)/sec\]", text)
    if not header:
        lines = [line.strip() for line in _lines(text)]
        result["error"] = "no result table" + (f": {lines[-1]}" if lines else "")
        result["unreadable"] = lines[-5:]
        return result
    to_gbps = 1.0 if header.group(1) == "Gb" else MIB * 8 / 1e9
    for match in re.finditer(r"^\s*(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", text[header.end():], flags=re.M):
        result["rows"].append({
            "bytes": int(match.group(1)), "iterations": int(match.group(2)),
            "peak_gbps": round(float(match.group(3)) * to_gbps, 2),
            "average_gbps": round(float(match.group(4)) * to_gbps, 2),
            "msg_rate_mpps": float(match.group(5)),
        })
    result["average_gbps"] = max((row["average_gbps"] for row in result["rows"]), default=None)
    if not result["rows"]:
        result["error"] = "no result rows"
        result["unreadable"] = _lines(text[header.end():])[:5]
    return result


def parse_all_reduce_perf(text: str) -> dict:
    """nccl-tests all_reduce_perf: per-size bus bandwidth, the average, and the two flags that
    matter on two Sparks: below the published target, and the ~2 GB/s of a TCP fallback."""
    rows = []
    for match in re.finditer(
        r"^\s+(\d+)\s+(\d+)\s+(\w+)\s+(\w+)\s+(-?\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+(\S+)",
        text, flags=re.M,
    ):
        rows.append({
            "bytes": int(match.group(1)), "type": match.group(3), "redop": match.group(4),
            "out_of_place_busbw_gbps": float(match.group(8)), "in_place_busbw_gbps": float(match.group(12)),
            "wrong": match.group(9),
        })
    average = re.search(r"Avg bus bandwidth\s*:\s*([\d.]+)", text)
    ranks = re.findall(r"Rank\s+\d+ Group\s+\d+ Pid\s+\d+ on\s+(\S+)", text)
    avg = float(average.group(1)) if average else None
    peak = max((max(r["out_of_place_busbw_gbps"], r["in_place_busbw_gbps"]) for r in rows), default=None)
    readable = bool(rows) and avg is not None
    return {
        "hosts": sorted(set(ranks)),
        "rows": rows,
        "average_busbw_gbps": avg,
        "peak_busbw_gbps": peak,
        "below_target": avg is not None and avg < NCCL_TARGET_BUS_GBPS,
        "tcp_fallback_suspected": peak is not None and peak < NCCL_TCP_FALLBACK_GBPS,
        "error": None if readable else "no result table",
        "unreadable": [] if readable else _lines(text)[-5:],
    }


def parse_nvidia_smi_csv(lines: list[str]) -> list[dict]:
    """``nvidia-smi --query-gpu=... --format=csv``: a header naming the fields with their units
    ("power.draw [W]"), then one row a sample ("66.53 W", "96 %", "[N/A]"). Each row becomes
    {field: value}: numbers without their unit, "[N/A]" and "Not Supported" (GB10 memory) as None,
    text as text. A repeated header is skipped; a line of another width than the header is dropped."""
    fields: list[str] = []
    rows = []
    for line in lines:
        values = [value.strip() for value in line.split(",")]
        header = csv_header(line)
        if header and (not fields or len(header) == len(fields)):
            fields = header
            continue
        if len(values) != len(fields):
            continue
        rows.append({name: csv_value(name, value) for name, value in zip(fields, values)})
    return rows


def csv_header(line: str) -> list[str] | None:
    """The field names of an nvidia-smi CSV header ("power.draw [W]" -> "power.draw"), None for another line."""
    matches = [CSV_FIELD.fullmatch(value.strip()) for value in line.split(",")]
    return [match.group(1) for match in matches] if all(matches) else None


def csv_value(name: str, value: str):
    """A CSV value: a number without its unit, None for [N/A] and Not Supported, else the text."""
    if value in ("[N/A]", "N/A", "[Not Supported]", "Not Supported", ""):
        return None
    number = re.fullmatch(r"(-?\d+(?:\.\d+)?)(?: \S+)?", value)
    if name in ("timestamp", "name", "pci.bus_id", "driver_version", "uuid") or not number:
        return value
    return float(number.group(1))
