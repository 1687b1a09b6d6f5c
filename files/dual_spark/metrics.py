"""Spark metrics the exporters lack, as node-exporter textfile metrics, and the head's Prometheus
read back for `tasks/status.py`.

    metrics collect --out FILE --role ROLE --watchdog-state FILE --stack-dir DIR --state FILE
                    --model-dir DIR [--planned FILE] [--rail NETDEV,RDMA ...] [--interval SECONDS] [--once]
        Every --interval seconds, write FILE (atomically: a temporary file beside it, renamed):
        each GPU nvidia-smi lists, its power, temperature, SM clock and utilisation and the
        slowdowns it reports (a GB10 reads [N/A] for its memory, so the unified memory comes from
        /proc/meminfo's MemAvailable), the mount point holding the model store (as the node
        exporter names it), each rail's link state, speed, MTU and byte and error counters (the
        netdev's and, where sysfs has them, its RDMA port's), the watchdog's backoff record (with
        the restarts of the vLLM container it counts and the last start's time to serve) and the
        starts seen in it, the deploy's mark of planned work (--planned), and the state that
        serves (profile, image, model revision) as an info metric. A reading that fails is left
        out, never guessed; dual_spark_collector_errors says which. Its own record (--state) that
        it cannot use is set aside, never a reason to stop. It runs as a user of its own: it reads
        what others may read, writes FILE's directory only, and needs neither root nor Docker.
    metrics ready --url URL [--wait SECONDS] [--after WHAT]
        Wait until Prometheus answers /-/ready; fail saying where to look when it does not.
    metrics rates --url URL [--window SECONDS]
        One JSON line: every series the deploy's recording rules (dual_spark:*) recorded over the
        last --window seconds (its mean and last value), and the alerts pending or firing; or
        why Prometheus did not answer.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from . import planned
from .atomic import write_atomically

GPU_FIELDS = ("index", "name", "power.draw", "temperature.gpu", "clocks.sm", "utilization.gpu")
# nvidia-smi's field -> (metric, help, factor to the metric's base unit)
GPU_METRICS = {
    "power.draw": ("dual_spark_gpu_power_watts", "Power drawn by the GPU (nvidia-smi power.draw).", 1.0),
    "temperature.gpu": ("dual_spark_gpu_temperature_celsius", "GPU temperature (nvidia-smi temperature.gpu).", 1.0),
    "clocks.sm": ("dual_spark_gpu_sm_clock_hertz", "GPU SM clock (nvidia-smi clocks.sm).", 1e6),
    "utilization.gpu": ("dual_spark_gpu_utilization_ratio", "GPU utilisation, 0 to 1 (nvidia-smi utilization.gpu).", 0.01),
}
# The clock event reasons nvidia-smi reports that slow a GPU down for a fault (not idleness, an
# application clock, or the power cap a GPU under load meets), by their field names, and each one's
# bit in clocks_event_reasons.active (NVML's nvmlClocksEventReason*).
SLOWDOWNS = {"hw_slowdown": 0x8, "sw_thermal_slowdown": 0x20, "hw_thermal_slowdown": 0x40, "hw_power_brake_slowdown": 0x80}
EVENT_FIELDS = ("index", "clocks_event_reasons.active", *(f"clocks_event_reasons.{reason}" for reason in SLOWDOWNS))
NOT_READ = {"", "[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]"}
# sysfs counters of a netdev (statistics/) and of an RDMA port (counters/); port_*_data counts 4-byte words
NETDEV_BYTES = {"transmit": "tx_bytes", "receive": "rx_bytes"}
NETDEV_ERRORS = ("rx_errors", "tx_errors", "rx_dropped", "tx_dropped")
RDMA_BYTES = {"transmit": "port_xmit_data", "receive": "port_rcv_data"}
RDMA_ERRORS = ("symbol_error", "port_rcv_errors", "link_downed", "link_error_recovery", "port_xmit_discards",
               "local_link_integrity_errors", "excessive_buffer_overrun_errors")
BYTES_HELP = "Bytes {} on the rail, by path: its netdev's (TCP: NCCL's and vLLM's sockets) or its RDMA port's (RoCE)."
DONE = {"transmit": "transmitted", "receive": "received"}
ERRORS_HELP = "Error counters of the rail's netdev and its RDMA port, by path and counter."


class Metrics:
    """Samples of the textfile, each family once with its HELP and TYPE."""

    def __init__(self):
        self.families: dict[str, tuple[str, str, list[tuple[dict, float]]]] = {}

    def add(self, name: str, kind: str, help_text: str, labels: dict, value: float | None) -> None:
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return
        self.families.setdefault(name, (kind, help_text, []))[2].append((labels, float(value)))

    def text(self) -> str:
        lines = []
        for name, (kind, help_text, samples) in self.families.items():
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
            for labels, value in samples:
                inside = ",".join(f'{key}="{escape(str(text))}"' for key, text in labels.items())
                lines.append(f"{name}{{{inside}}} {shown(value)}" if inside else f"{name} {shown(value)}")
        return "\n".join(lines) + "\n"


def shown(value: float) -> str:
    """A sample's value in its shortest exact spelling: 4.31, 1000, 1.7e+09."""
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def number(text: str | None) -> float | None:
    """A reading as a number: None for nvidia-smi's and sysfs's ways of saying there is none."""
    if text is None or text.strip() in NOT_READ:
        return None
    try:
        value = float(text.strip().split()[0])
    except (ValueError, IndexError):
        return None
    return value if math.isfinite(value) else None


def gpu_readings(lines: list[str]) -> tuple[list[dict], str]:
    """nvidia-smi's CSV (GPU_FIELDS, noheader, nounits) as one dict per GPU, and its state: "ok",
    or the line it printed instead of values ("No devices were found", "Failed to initialize
    NVML: Driver/library version mismatch")."""
    gpus, other = [], []
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) == len(GPU_FIELDS) and fields[0].isdecimal():
            gpus.append(dict(zip(GPU_FIELDS, fields)))
        elif line.strip():
            other.append(line.strip())
    return gpus, "ok" if gpus else (other[0] if other else "no output")


def slowdowns(lines: list[str]) -> dict[str, dict[str, float]]:
    """nvidia-smi's CSV (EVENT_FIELDS, noheader) as each GPU's SLOWDOWNS, 1 active and 0 not: a
    reason's own field ("Active", "Not Active"), else its bit of the bitmask ("0x0000000000000048");
    a reason neither says ([N/A]) is left out."""
    found = {}
    for line in lines:
        fields = [field.strip() for field in line.split(",")]
        if len(fields) != len(EVENT_FIELDS) or not fields[0].isdecimal():
            continue
        values = dict(zip(EVENT_FIELDS, fields))
        try:
            mask = int(values["clocks_event_reasons.active"], 16)
        except ValueError:
            mask = None
        reasons = {}
        for reason, bit in SLOWDOWNS.items():
            text = values[f"clocks_event_reasons.{reason}"]
            if text in ("Active", "Not Active"):
                reasons[reason] = float(text == "Active")
            elif mask is not None:
                reasons[reason] = float(bool(mask & bit))
        found[fields[0]] = reasons
    return found


def query(command: list[str], fields: tuple[str, ...], units: bool = True) -> list[str]:
    """nvidia-smi's CSV lines for ``fields``, one per GPU (its other lines as printed)."""
    done = subprocess.run([*command, f"--query-gpu={','.join(fields)}", "--format=csv,noheader" + (",nounits" if units else "")],
                          capture_output=True, text=True, timeout=20)
    return done.stdout.splitlines() if done.returncode == 0 else [*done.stdout.splitlines(), *done.stderr.splitlines()]


def read_gpus(command: list[str], metrics: Metrics, errors: list[str]) -> None:
    try:
        gpus, state = gpu_readings(query(command, GPU_FIELDS))
    except FileNotFoundError:
        gpus, state = [], "absent"
    except (OSError, subprocess.SubprocessError) as error:
        gpus, state = [], f"failed: {error}"
    metrics.add("dual_spark_gpu_readable", "gauge", "1 when nvidia-smi read the GPUs; state says what it printed otherwise.",
                {"state": state[:200]}, 1.0 if state == "ok" else 0.0)
    if state not in ("ok", "absent"):
        errors.append("gpu")
    for gpu in gpus:
        labels = {"gpu": gpu["index"], "name": gpu["name"]}
        metrics.add("dual_spark_gpu_info", "gauge", "A GPU nvidia-smi listed.", labels, 1.0)
        for field, (name, help_text, factor) in GPU_METRICS.items():
            value = number(gpu[field])
            metrics.add(name, "gauge", help_text, labels, value * factor if value is not None else None)
    if gpus:
        read_slowdowns(command, {gpu["index"]: gpu["name"] for gpu in gpus}, metrics, errors)


def read_slowdowns(command: list[str], names: dict[str, str], metrics: Metrics, errors: list[str]) -> None:
    """The slowdowns of the GPUs ``names`` lists (index -> name), in a query of their own: a driver
    that lacks the fields fails this query, never the readings above."""
    try:
        found = slowdowns(query(command, EVENT_FIELDS, units=False))
    except (OSError, subprocess.SubprocessError):
        found = {}
    if not found:
        errors.append("gpu slowdowns")
    for index, reasons in found.items():
        for reason, value in reasons.items():
            metrics.add("dual_spark_gpu_slowdown_active", "gauge", "1 while nvidia-smi reports this clock event reason active.",
                        {"gpu": index, "name": names.get(index, ""), "reason": reason}, value)


def meminfo(text: str) -> dict[str, float]:
    """/proc/meminfo's MemTotal and MemAvailable in bytes (GB10's GPU memory is the host's)."""
    found = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("MemTotal", "MemAvailable"):
            value = number(rest)
            if value is not None:
                found[key] = value * 1024
    return found


def read_file(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):  # a netdev that is down answers its speed with EINVAL
        return None


def rail_readings(sysfs: Path, netdev: str, rdma: str) -> dict:
    """What sysfs says of one rail: its netdev (state, speed, MTU, counters) and its RDMA device's
    ports (state, counters). Absent where sysfs has no such file."""
    net = sysfs / "class/net" / netdev
    state = read_file(net / "operstate")
    reading = {
        "present": net.is_dir(),
        "up": None if state is None else float(state.strip() == "up"),
        "speed_mbps": number(read_file(net / "speed")),
        "mtu": number(read_file(net / "mtu")),
        "bytes": {direction: number(read_file(net / "statistics" / name)) for direction, name in NETDEV_BYTES.items()},
        "errors": {name: number(read_file(net / "statistics" / name)) for name in NETDEV_ERRORS},
        "ports": {},
    }
    if reading["speed_mbps"] is not None and reading["speed_mbps"] < 0:  # -1: no link, speed unknown
        reading["speed_mbps"] = None
    ports = sysfs / "class/infiniband" / rdma / "ports"
    for port in sorted(ports.iterdir()) if ports.is_dir() else []:
        port_state = read_file(port / "state")
        counters = port / "counters"
        reading["ports"][port.name] = {
            "active": None if port_state is None else float("ACTIVE" in port_state),
            "bytes": {direction: (value * 4 if (value := number(read_file(counters / name))) is not None else None)
                      for direction, name in RDMA_BYTES.items()},
            "errors": {name: number(read_file(counters / name)) for name in RDMA_ERRORS},
        }
    return reading


def add_rail(metrics: Metrics, index: int, netdev: str, rdma: str, reading: dict) -> None:
    rail = {"rail": str(index), "netdev": netdev}
    metrics.add("dual_spark_rail_info", "gauge", "A rail of this node: its netdev and RDMA device.", {**rail, "rdma": rdma}, 1.0)
    metrics.add("dual_spark_rail_present", "gauge", "1 when the rail's netdev exists.", rail, float(reading["present"]))
    metrics.add("dual_spark_rail_up", "gauge", "1 when the rail's netdev is up (operstate).", rail, reading["up"])
    metrics.add("dual_spark_rail_speed_mbps", "gauge", "The rail's link speed in Mb/s (sysfs speed).", rail, reading["speed_mbps"])
    metrics.add("dual_spark_rail_mtu_bytes", "gauge", "The rail's MTU.", rail, reading["mtu"])
    for direction, value in reading["bytes"].items():
        metrics.add(f"dual_spark_rail_{direction}_bytes_total", "counter", BYTES_HELP.format(DONE[direction]),
                    {**rail, "path": "netdev"}, value)
    for name, value in reading["errors"].items():
        metrics.add("dual_spark_rail_errors_total", "counter", ERRORS_HELP, {**rail, "path": "netdev", "counter": name}, value)
    for port, found in reading["ports"].items():
        labels = {**rail, "rdma": rdma, "port": port}
        metrics.add("dual_spark_rail_roce_port_active", "gauge", "1 when the rail's RDMA port is ACTIVE.", labels, found["active"])
        for direction, value in found["bytes"].items():
            metrics.add(f"dual_spark_rail_{direction}_bytes_total", "counter", BYTES_HELP.format(DONE[direction]),
                        {**rail, "path": "rdma", "port": port}, value)
        for name, value in found["errors"].items():
            metrics.add("dual_spark_rail_errors_total", "counter", ERRORS_HELP, {**rail, "path": "rdma", "port": port, "counter": name},
                        value)


def mount_point(mountinfo: str, path: str) -> str | None:
    """The mount point holding ``path`` in a mount table (/proc/PID/mountinfo, whose fifth field is
    the mount point with octal escapes: "\\040" for a space): the longest that is ``path`` or above it."""
    held = None
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda match: chr(int(match.group(1), 8)), fields[4])
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (held is None or len(point) > len(held)):
            held = point
    return held


def read_model_store(proc: Path, model_dir: str, metrics: Metrics, errors: list[str]) -> None:
    """The mount point of the model store as the node exporter names it: from PID 1's mount table,
    which it reads (its own, where that is hidden), not this sandbox's."""
    table = read_file(proc / "1/mountinfo") or read_file(proc / "self/mountinfo") or ""
    point = mount_point(table, os.path.realpath(model_dir))
    if point is None:
        errors.append("mounts")
    metrics.add("dual_spark_model_store_info", "gauge", "The model store and the mount point holding it.",
                {"model_dir": model_dir, "mountpoint": point}, None if point is None else 1.0)


def count(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def watchdog_record(text: str | None) -> dict | None:
    """The watchdog's backoff record (watchdog.py's `{role}-starts`): {"failed_starts", "healthy",
    "restarts", "last_start_seconds"}, restarts None where the record has no count of them, the
    last start's time to serve None where none was measured (a worker's, or no start served yet)."""
    try:
        record = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(record, dict) or count(record.get("failed_starts")) is None or not isinstance(record.get("healthy"), bool):
        return None
    took = record.get("last_start_seconds")
    took = float(took) if isinstance(took, (int, float)) and not isinstance(took, bool) and math.isfinite(took) and took >= 0 else None
    return {"failed_starts": record["failed_starts"], "healthy": record["healthy"], "restarts": count(record.get("restarts")),
            "last_start_seconds": took}


def starts_seen(previous: dict, record: dict | None, mtime: float | None) -> dict:
    """The count of vLLM starts seen in the watchdog's record, carried from one reading to the next.
    Each start writes the record unhealthy (its backoff); a start that serves writes it healthy
    again. A new write that is unhealthy is a start; a healthy one after a healthy one is a start
    that served between two readings; failed starts that jumped by more than one are starts too."""
    seen = {"mtime": previous.get("mtime"), "healthy": previous.get("healthy"), "failed": previous.get("failed", 0),
            "starts": previous.get("starts", 0)}
    if record is None or mtime is None or mtime == seen["mtime"]:
        return seen
    if seen["mtime"] is not None:
        jumped = max(0, record["failed_starts"] - seen["failed"] - 1)
        if not record["healthy"] or seen["healthy"]:
            seen["starts"] += 1 + jumped
    return {**seen, "mtime": mtime, "healthy": record["healthy"], "failed": record["failed_starts"]}


def served_labels(text: str | None) -> dict | None:
    """The state that serves (operations/records.py's state.json) as the info metric's labels."""
    try:
        state = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(state, dict):
        return None
    model = state.get("model") if isinstance(state.get("model"), dict) else {}
    return {"profile": str(state.get("profile", "")), "image": str(state.get("image", "")),
            "image_id": str(state.get("image_id", ""))[:19], "model": str(model.get("repo") or model.get("path") or ""),
            "revision": str(model.get("revision") or ""), "model_digest": str(state.get("model_digest", "")),
            "since": str(state.get("since", ""))}


def collect(args, state: dict) -> tuple[str, dict]:
    """One reading of everything: the textfile's text and the carried state."""
    metrics, errors = Metrics(), []
    read_gpus(args.nvidia_smi, metrics, errors)
    memory = meminfo(read_file(Path(args.proc) / "meminfo") or "")
    metrics.add("dual_spark_unified_memory_total_bytes", "gauge", "Memory the CPU and GPU share (MemTotal).", {},
                memory.get("MemTotal"))
    metrics.add("dual_spark_unified_memory_available_bytes", "gauge", "Memory the CPU and GPU can still take (MemAvailable).", {},
                memory.get("MemAvailable"))
    if not memory:
        errors.append("meminfo")
    read_model_store(Path(args.proc), args.model_dir, metrics, errors)
    for index, rail in enumerate(args.rail):
        netdev, _, rdma = rail.partition(",")
        try:
            add_rail(metrics, index, netdev, rdma, rail_readings(Path(args.sysfs), netdev, rdma))
        except OSError:
            errors.append(f"rail {index}")
    path = Path(args.watchdog_state)
    record = watchdog_record(read_file(path))
    try:
        mtime = path.stat().st_mtime
    except OSError:
        mtime = None
    state = starts_seen(state, record, mtime)
    role = {"role": args.role}
    if record is not None:
        metrics.add("dual_spark_watchdog_failed_starts", "gauge", "Starts in a row that never served (the watchdog's backoff).",
                    role, record["failed_starts"])
        metrics.add("dual_spark_watchdog_serving", "gauge", "1 when this side's last start served (or joined).", role,
                    float(record["healthy"]))
        metrics.add("dual_spark_watchdog_record_timestamp_seconds", "gauge", "When the watchdog last wrote its record.", role, mtime)
    metrics.add("dual_spark_watchdog_starts_total", "counter", "vLLM starts seen in the watchdog's record by this collector.", role,
                state["starts"])
    if record is not None and record["restarts"] is not None:
        metrics.add("dual_spark_vllm_container_restarts_total", "counter",
                    "Docker's restarts of the vLLM container (a deploy's change makes a new one, from 0).", role, record["restarts"])
    if record is not None:
        metrics.add("dual_spark_vllm_last_start_seconds", "gauge", "How long the last start that served took, from the watchdog's start.",
                    role, record["last_start_seconds"])
    mark = planned.read(Path(args.planned)) if args.planned else None
    if mark is not None:
        metrics.add("dual_spark_planned_work_started_seconds", "gauge", "When the deploy's planned work began (this node's clock).", {},
                    mark["since"])
        metrics.add("dual_spark_planned_work_expires_seconds", "gauge", "When the mark of planned work stops counting if no end comes.",
                    {}, mark["until"])
    served = served_labels(read_file(Path(args.stack_dir) / "served/state.json"))
    if served is not None:
        metrics.add("dual_spark_serving_info", "gauge", "The state that serves, as the last first token recorded it.", served, 1.0)
    for reading in errors:
        metrics.add("dual_spark_collector_errors", "gauge", "1 for each reading that failed this time.", {"reading": reading}, 1.0)
    return metrics.text(), state


def usable(state) -> bool:
    """Whether ``state`` is what this collector writes: starts_seen's record."""
    return (isinstance(state, dict) and set(state) == {"mtime", "healthy", "failed", "starts"}
            and (state["mtime"] is None or (isinstance(state["mtime"], (int, float)) and not isinstance(state["mtime"], bool)))
            and (state["healthy"] is None or isinstance(state["healthy"], bool))
            and count(state["failed"]) is not None and count(state["starts"]) is not None)


def load_state(path: Path) -> dict:
    """The collector's own record, or {} (a first reading). One it cannot use (not JSON, other
    types, not what it wrote) is set aside as FILE.unusable, said on stderr: collection goes on."""
    try:
        state = json.loads(path.read_text())
        if usable(state):
            return state
        why = "not a record of the starts it has seen"
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as error:
        why = f"unreadable ({error})"
    aside = path.with_name(path.name + ".unusable")
    try:
        os.replace(path, aside)
        done = f"set aside as {aside}"
    except OSError as error:
        done = f"not set aside ({error})"
    print(f"dual-spark metrics: {path} is {why}: {done}; starts are counted from now", file=sys.stderr, flush=True)
    return {}


def collect_loop(args) -> None:
    out, state_file = Path(args.out), Path(args.state)
    state = load_state(state_file)
    while True:
        started = time.monotonic()
        try:
            text, state = collect(args, state)
            write_atomically(out, text)
            state_file.parent.mkdir(parents=True, exist_ok=True)
            write_atomically(state_file, json.dumps(state))
        except OSError as error:
            print(f"dual-spark metrics: {error}", file=sys.stderr, flush=True)
        if args.once:
            return
        time.sleep(max(0.0, args.interval - (time.monotonic() - started)))


def fetch(url: str, timeout: float) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def series_means(matrix: list[dict]) -> list[dict]:
    """Each series of a range query: its name, labels, mean and last value (NaN samples left out)."""
    found = []
    for series in matrix:
        labels = dict(series.get("metric", {}))
        values = [float(value) for _, value in series.get("values", [])]
        finite = [value for value in values if math.isfinite(value)]
        found.append({"name": labels.pop("__name__", ""), "labels": labels,
                      "mean": sum(finite) / len(finite) if finite else None, "last": finite[-1] if finite else None})
    return sorted(found, key=lambda series: (series["name"], sorted(series["labels"].items())))


def rates(args) -> None:
    reading = {"ok": False, "url": args.url, "window_seconds": args.window, "series": [], "alerts": [], "error": None}
    selector = urllib.parse.quote(f'{{__name__=~"dual_spark:.+"}}[{int(args.window)}s]')
    try:
        answer = fetch(f"{args.url}/api/v1/query?query={selector}", args.timeout)
        reading["series"] = series_means(answer["data"]["result"])
        alerts = fetch(f"{args.url}/api/v1/alerts", args.timeout)["data"]["alerts"]
        reading["alerts"] = sorted(({"name": alert["labels"].get("alertname", ""), "state": alert["state"],
                                     "labels": {k: v for k, v in alert["labels"].items() if k != "alertname"},
                                     "summary": alert.get("annotations", {}).get("summary", "")} for alert in alerts),
                                   key=lambda alert: (alert["name"], sorted(alert["labels"].items())))
        reading["ok"] = True
    except (OSError, ValueError, KeyError, TypeError) as error:
        reading["error"] = f"no answer at {args.url}: {error}"
    print(json.dumps(reading))


def ready(args) -> None:
    deadline = time.monotonic() + args.wait
    while True:
        try:
            with urllib.request.urlopen(f"{args.url}/-/ready", timeout=5):
                return
        except (OSError, ValueError) as error:
            if time.monotonic() >= deadline:
                sys.exit(f"Prometheus did not answer {args.url}/-/ready {args.wait:.0f} s after {args.after} ({error}): "
                         "`journalctl -u prometheus` on the head says why")
        time.sleep(1)


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("collect")
    c.add_argument("--out", required=True, help="the textfile (*.prom) in the node exporter's textfile directory")
    c.add_argument("--role", required=True)
    c.add_argument("--watchdog-state", required=True, help="the watchdog's backoff record")
    c.add_argument("--stack-dir", required=True, help="where served/state.json is")
    c.add_argument("--state", required=True, help="this collector's own record (the starts it has seen)")
    c.add_argument("--model-dir", required=True, help="the model store, whose file system the node exporter watches")
    c.add_argument("--planned", help="the mark of a deploy's planned work (planned.py), exported while there is one")
    c.add_argument("--rail", action="append", default=[], help="NETDEV,RDMA of each rail, rail 0 first")
    c.add_argument("--interval", type=float, default=15)
    c.add_argument("--once", action="store_true")
    c.add_argument("--nvidia-smi", nargs="+", default=["nvidia-smi"], help=argparse.SUPPRESS)
    c.add_argument("--sysfs", default="/sys", help=argparse.SUPPRESS)
    c.add_argument("--proc", default="/proc", help=argparse.SUPPRESS)
    r = commands.add_parser("rates")
    r.add_argument("--url", required=True)
    r.add_argument("--window", type=float, default=300)
    r.add_argument("--timeout", type=float, default=10)
    w = commands.add_parser("ready")
    w.add_argument("--url", required=True)
    w.add_argument("--wait", type=float, default=60)
    w.add_argument("--after", default="its start", help="what it waits after, for the message")
    args = parser.parse_args(argv)
    {"collect": collect_loop, "rates": rates, "ready": ready}[args.command](args)
