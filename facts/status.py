"""A serving node at a glance, in one round trip: its vLLM container, its watchdog, the last
lines of its log, memory, the links and RDMA ports, and on the head the API's one-token probe with vLLM's
metrics. The slow parts (the probe, Docker, nvidia-smi, Python) run at the same time."""

from __future__ import annotations

import json
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import combined, split
from facts.fabric import Links, NetLinks, Rdma, RdmaDevices
from facts.gpu import GpuMemory, Memory
from facts.serving import CONTAINER, Container, container_command, container_reading, record_sections, records_reading
from facts.verify import api_reading

RATES_WINDOW = 300  # seconds of the recording rules the status shows: the last five minutes


class Watchdog(TypedDict):
    live: dict | None
    starts: dict | None
    planned: dict | None  # planned work marked on the head (files/dual_spark/planned.py's reading)
    unreadable: list[str]


class Status(TypedDict):
    now: str | None
    container: Container | None
    watchdog: Watchdog
    log: list[str]
    memory: Memory
    links: Links
    rdma: Rdma
    api: dict | None
    records: dict[str, dict | None]
    prometheus: dict | None
    door: dict | None
    unreadable: list[str]


class ServingStatus(FactBase[Status]):
    """
    ``now`` is the node's clock (UTC), against which the container's start reads as an uptime;
    ``watchdog`` what `watchdog status` (of the ``programs`` archive) printed: the live state on the
    fabric (None when none answers), the backoff record and, where ``planned`` names its file (the
    head), the planned work a deploy run marked; ``log`` the container's last
    ``log_lines`` lines; ``api`` (on the head, where ``api`` names the URL and key file) what
    `health --metrics` read; ``records`` the states that served, recorded in ``stack_dir``
    (ServingState's); ``prometheus`` (on the head, where ``prometheus`` names its URL) what
    `metrics rates` read: the recording rules of the last five minutes and the alerts; ``door``
    (on the head, where ``door`` names its socket, and ``door_counts`` the URL of its counts) what
    `door state` read: the front door's view of vLLM and the requests it holds, ``{"ok": False,
    "error": ...}`` without a door.

    .. code:: python

        {"now": "2026-11-29T21:40:02Z", "container": {...ServingState's...},
         "watchdog": {"live": {"role": "head", "session": "9f2c...", "state": "serving", "joined": None},
                      "starts": {"failed_starts": 0, "healthy": True, "last_start_seconds": 41.0}, "planned": None,
                      "unreadable": []},
         "log": ["(APIServer pid=1) INFO ..."], "memory": {...GpuMemory...}, "links": {...NetLinks...},
         "rdma": {...RdmaDevices...}, "api": {"ok": True, "model": "tiny", "max_model_len": 512, "metrics": {"spec": {"drafts": 40, ...}, ...}, ...},
         "records": {"served": {...}, "rollback": None},
         "prometheus": {"ok": True, "series": [{"name": "dual_spark:decode_tokens_per_second:per_stream", "labels": {...},
                                                "mean": 34.5, "last": 35.1}, ...], "alerts": [], ...},
         "door": {"ok": True, "status": "no check", "in_flight": 0, "requests": 212, "retried": 3, ...}, "unreadable": []}
    """

    @staticmethod
    def default() -> Status:
        return {"now": None, "container": None, "watchdog": {"live": None, "starts": None, "planned": None, "unreadable": []}, "log": [],
                "memory": GpuMemory.default(), "links": NetLinks.default(),
                "rdma": RdmaDevices.default(), "api": None, "records": {"served": None, "rollback": None}, "prometheus": None,
                "door": None, "unreadable": []}

    def command(self, programs: str, rail_ip: str, port: int, state_file: str, log_lines: int, stack_dir: str,
                api: dict | None = None, prometheus: str | None = None, door: str | None = None, door_counts: str | None = None,
                planned: str | None = None) -> StringCommand:
        background = {
            "container": container_command(),
            "watchdog": StringCommand("python3", QuoteString(programs), "watchdog", "status", "--ip", rail_ip, "--port", str(port),
                                      "--state", QuoteString(state_file), *(("--planned", QuoteString(planned)) if planned else ()), "2>&1"),
            "log": StringCommand("docker", "logs", "--tail", str(log_lines), CONTAINER, "2>&1", "|", "tail", "-n", str(log_lines)),
            "memory": GpuMemory().command(),
        }
        if api:
            background["api"] = StringCommand("python3", QuoteString(programs), "health", "--url", QuoteString(api["url"]),
                                              "--key-file", QuoteString(api["key_file"]), "--timeout", "10", "--metrics",
                                              "2>/dev/null")
        if prometheus:
            background["prometheus"] = StringCommand("python3", QuoteString(programs), "metrics", "rates", "--url", QuoteString(prometheus),
                                                     "--window", str(RATES_WINDOW), "--timeout", "5", "2>/dev/null")
        if door:
            background["door"] = StringCommand("python3", QuoteString(programs), "door", "state", "--socket", QuoteString(door),
                                               *(("--counts", QuoteString(door_counts)) if door_counts else ()), "2>&1")
        return combined({"now": StringCommand("date", "-u", "+%Y-%m-%dT%H:%M:%SZ"), "links": NetLinks().command(),
                         "rdma": RdmaDevices().command(), **record_sections(stack_dir)}, background)

    def process(self, output: list[str]) -> Status:
        sections = split(output)
        container, unreadable = container_reading(sections.get("container", []))
        records, bad = records_reading(sections)
        now = [line.strip() for line in sections.get("now", []) if line.strip()]
        return {
            "now": now[-1] if now else None,
            "container": container,
            "watchdog": watchdog_reading(sections.get("watchdog", [])),
            "log": [line for line in sections.get("log", []) if line.strip()] if container else [],
            "memory": GpuMemory().process(sections.get("memory", [])),
            "links": NetLinks().process(sections.get("links", [])),
            "rdma": RdmaDevices().process(sections.get("rdma", [])),
            "api": api_reading(sections.get("api")),
            "records": records,
            "prometheus": prometheus_reading(sections["prometheus"]) if "prometheus" in sections else None,
            "door": door_reading(sections["door"]) if "door" in sections else None,
            "unreadable": sections[""] + unreadable + bad,
        }


def prometheus_reading(lines: list[str]) -> dict:
    """What `metrics rates` printed; a reading that says why when it printed nothing readable."""
    found = [line for line in lines if line.strip()]
    try:
        value = json.loads(found[-1])
        if isinstance(value, dict) and isinstance(value.get("series"), list) and isinstance(value.get("alerts"), list):
            return value
    except (ValueError, IndexError):
        pass
    return {"ok": False, "series": [], "alerts": [], "error": "`metrics rates` printed nothing readable" + (f": {found[-1][:200]}" if found else "")}


def watchdog_reading(lines: list[str]) -> Watchdog:
    found = [line for line in lines if line.strip()]
    try:
        value = json.loads(found[-1])
        return {"live": value["live"], "starts": value["starts"], "planned": value.get("planned"), "unreadable": []}
    except (ValueError, IndexError, KeyError, TypeError):
        return {"live": None, "starts": None, "planned": None, "unreadable": found}


def door_reading(lines: list[str]) -> dict:
    """What `door state` printed: the door's view of vLLM; a reading that says why otherwise."""
    found = [line for line in lines if line.strip()]
    try:
        value = json.loads(found[-1])["door"]
    except (ValueError, IndexError, KeyError, TypeError):
        return {"ok": False, "error": "`door state` printed nothing readable" + (f": {found[-1][:200]}" if found else "")}
    if value is None:
        return {"ok": False, "error": "no front door answers on this node (its runtime API's socket is missing)"}
    return {"ok": True, **value} if isinstance(value, dict) else {"ok": False, "error": f"`door state` printed {value!r}"}
