"""A serving node at a glance, in one round trip: its vLLM container, its watchdog, the last
lines of its log, memory, the links and RDMA ports, and on the head the API's one-token probe with vLLM's
metrics. The slow parts (the probe, Docker, nvidia-smi, Python) run at the same time."""

from __future__ import annotations

import json
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from facts.combine import Section, of, split, table_command
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
        return {**{name: section.default() for name, section in SECTIONS.items()}, "unreadable": []}

    def command(self, programs: str, rail_ip: str, port: int, state_file: str, log_lines: int, stack_dir: str,
                api: dict | None = None, prometheus: str | None = None, door: str | None = None, door_counts: str | None = None,
                planned: str | None = None) -> StringCommand:
        given = {"programs": programs, "rail_ip": rail_ip, "port": port, "state_file": state_file, "log_lines": log_lines,
                 "stack_dir": stack_dir, "api": api, "prometheus": prometheus, "door": door, "door_counts": door_counts,
                 "planned": planned}
        return table_command(SECTIONS, given)

    def process(self, output: list[str]) -> Status:
        sections = split(output)
        unreadable = container_reading(sections.get("container", []))[1] + records_reading(sections)[1]
        return {**{name: section.value(sections, name) for name, section in SECTIONS.items()}, "unreadable": sections[""] + unreadable}


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


def program(given: dict, *args) -> StringCommand:
    """A call of the programs' archive, the node's own."""
    return StringCommand("python3", QuoteString(given["programs"]), *args)


def log(sections: dict[str, list[str]], name: str) -> list[str]:
    """The container's last lines; none where there is no container (Docker's error is no log)."""
    container = container_reading(sections.get("container", []))[0]
    return [line for line in sections.get(name, []) if line.strip()] if container else []


def last_line(sections: dict[str, list[str]], name: str) -> str | None:
    found = [line.strip() for line in sections.get(name, []) if line.strip()]
    return found[-1] if found else None


def given_only(key: str, section: Section) -> Section:
    """``section`` where the fact's argument ``key`` is given (the head's), else no command and None."""
    return Section(lambda given: section.command(given) if given[key] else None,
                   lambda sections, name: section.value(sections, name) if name in sections else None, section.default, section.background)


# Every section of ServingStatus, by its name in the reading, in the order the command runs them:
# the quick ones in turn, then every background one at once.
SECTIONS: dict[str, Section] = {
    "now": Section(lambda _: StringCommand("date", "-u", "+%Y-%m-%dT%H:%M:%SZ"), last_line),
    "links": of(NetLinks),
    "rdma": of(RdmaDevices),
    "records": Section(lambda given: record_sections(given["stack_dir"]), lambda sections, _: records_reading(sections)[0],
                       lambda: {"served": None, "rollback": None}),
    "container": Section(lambda _: container_command(), lambda sections, name: container_reading(sections.get(name, []))[0],
                         background=True),
    "watchdog": Section(lambda given: program(given, "watchdog", "status", "--ip", given["rail_ip"], "--port", str(given["port"]),
                                              "--state", QuoteString(given["state_file"]),
                                              *(("--planned", QuoteString(given["planned"])) if given["planned"] else ()), "2>&1"),
                        lambda sections, name: watchdog_reading(sections.get(name, [])),
                        lambda: {"live": None, "starts": None, "planned": None, "unreadable": []}, background=True),
    "log": Section(lambda given: StringCommand("docker", "logs", "--tail", str(given["log_lines"]), CONTAINER, "2>&1", "|", "tail", "-n",
                                               str(given["log_lines"])), log, list, background=True),
    "memory": of(GpuMemory, background=True),
    "api": given_only("api", Section(lambda given: program(given, "health", "--url", QuoteString(given["api"]["url"]), "--key-file",
                                                           QuoteString(given["api"]["key_file"]), "--timeout", "10", "--metrics", "2>/dev/null"),
                                     lambda sections, name: api_reading(sections.get(name)), background=True)),
    "prometheus": given_only("prometheus", Section(lambda given: program(given, "metrics", "rates", "--url", QuoteString(given["prometheus"]),
                                                                         "--window", str(RATES_WINDOW), "--timeout", "5", "2>/dev/null"),
                                                   lambda sections, name: prometheus_reading(sections[name]), background=True)),
    "door": given_only("door", Section(lambda given: program(given, "door", "state", "--socket", QuoteString(given["door"]),
                                                             *(("--counts", QuoteString(given["door_counts"])) if given["door_counts"] else ()),
                                                             "2>&1"),
                                       lambda sections, name: door_reading(sections[name]), background=True)),
}
