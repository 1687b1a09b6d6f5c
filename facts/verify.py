"""What verification reads of one node beyond what the steps read there, in one round trip: the
fabric, limits, the deploy user's logins, Docker and memory; pings to the other nodes, SSH logins
to them and the API's one-token probe run at the same time as the rest. Verification takes the
rest of its table (identity, the deploy user, the runtime artifacts, the serving stack) from the
steps' own readings, read in the same round trip (operations/verify.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from cluster import Cluster
from facts.combine import Section, of, split, table_command
from facts.fabric import DfPing, Links, NetLinks, Ping, Rdma, RdmaDevices
from facts.gpu import GpuMemory, Memory
from facts.host_prep import Account, SysctlReading, SysctlValue, UserGroups
from facts.identity import HostKeys, Identity, MachineIds, SshHostKeyFingerprints
from facts.limits import LoginMemlock, Memlock
from facts.runtime import Image, ImageState, Model, ModelState
from facts.serving import Serving, ServingState
from facts.ssh_trust import Login, SshLogin


class Own(TypedDict):
    links: Links
    rdma: Rdma
    pings: list[Ping]
    memlock: Memlock
    userns: SysctlReading
    host_keys: HostKeys
    docker: str | None
    memory: Memory
    ssh_to: list[Login]
    api: dict | None
    listening: list[str]
    unreadable: list[str]


class Readings(Own):
    """A node's rows of the readiness table read: Readiness's own sections and the steps' readings
    it shares (``SHARED``)."""

    identity: Identity
    user: Account
    image: Image
    model: Model
    serving: Serving


# The readings verification shares with the steps, by their name in Readings: the same facts with
# the same arguments (operations/verify.py), so one reading of each serves both.
SHARED: dict[str, type[FactBase]] = {"identity": MachineIds, "user": UserGroups, "image": ImageState, "model": ModelState,
                                     "serving": ServingState}


def numbered(prefix: str, fact: type[FactBase]) -> Callable[[dict[str, list[str]], str], list]:
    """The values of the sections "PREFIX 0", "PREFIX 1", ..., in order."""
    def value(sections: dict[str, list[str]], _: str) -> list:
        found = sorted((int(name.split()[1]), lines) for name, lines in sections.items()
                       if name.startswith(prefix + " ") and name.split()[1].isdecimal())
        return [fact().process(lines) for _, lines in found]
    return value


def docker_path(sections: dict[str, list[str]], name: str) -> str | None:
    found = [line.strip() for line in sections.get(name, []) if line.strip().startswith("/")]
    return found[0] if found else None


def listening(sections: dict[str, list[str]], name: str) -> list[str]:
    return sorted({line.split()[3].rsplit(":", 1)[0] for line in sections.get(name, []) if len(line.split()) >= 4})


def health(given: dict) -> StringCommand | None:
    """The programs' one-token probe of the API through the front door, on the head; the engine's
    counters read behind it (the door would hold those reads too while vLLM restarts)."""
    api = given["api"]
    if api is None:
        return None
    return StringCommand("python3", QuoteString(api["programs"]), "ready", "--url", QuoteString(f"http://{api['host']}:{api['port']}"),
                         "--backend", QuoteString(api["backend"]), "--key-file", QuoteString(api["key_file"]), "--timeout", "20", "2>/dev/null")


# Every section of Readiness, by its name in the reading, in the order the command runs them: the
# quick ones in turn, then every background one at once (the pings, the SSH logins and the API's
# probe first; then each that takes tens of milliseconds).
SECTIONS: dict[str, Section] = {
    "links": of(NetLinks),
    "rdma": of(RdmaDevices),
    "userns": of(SysctlValue, lambda given: (given["userns_key"],)),
    "docker": Section(lambda _: StringCommand("command", "-v", "docker", "||", "true"), docker_path),
    "listening": Section(lambda given: StringCommand("ss", "-Hltn", QuoteString(f"sport = :{given['api']['port']}"), "2>/dev/null")
                         if given["api"] is not None else None, listening, list),
    "pings": Section(lambda given: [DfPing().command(*pair.split(), size=given["size"]) for pair in given["pings"]],
                     numbered("ping", DfPing), list, background=True),
    "ssh_to": Section(lambda given: [SshLogin().command(given["user"], address) for address in given["ssh_to"]],
                      numbered("ssh", SshLogin), list, background=True),
    "api": Section(health, lambda sections, name: api_reading(sections.get(name)), background=True),
    "memlock": of(LoginMemlock, lambda given: (given["user"],), background=True),
    "host_keys": of(SshHostKeyFingerprints, background=True),
    "memory": of(GpuMemory, background=True),
}
NUMBERED = {"pings": "ping", "ssh_to": "ssh"}  # sections of one command per target, named "ping 0", "ping 1", ...


class Readiness(FactBase[Own]):
    """
    The readings behind one node's rows of the readiness table that no step takes (``SECTIONS``).
    ``pings`` are "netdev address" pairs, pinged with ``size``-byte don't-fragment probes;
    ``ssh_to`` the addresses of other nodes ``user`` must reach without a password; ``api`` on the
    head: the programs, the API's host and port and its key file (the one-token probe of the
    programs' `health` runs at the same time as the rest), None on a worker.

    .. code:: python

        {"links": {...NetLinks...}, "rdma": {...RdmaDevices...}, "pings": [{...DfPing...}],
         "memlock": {"limit": "unlimited", ...}, "userns": {"value": 0, ...}, "host_keys": {...},
         "docker": "/usr/bin/docker", "memory": {...GpuMemory...}, "ssh_to": [{"ok": True, ...}],
         "api": {"ok": True, "model": "tiny", "max_model_len": 512, ...}, "listening": ["127.0.0.1"], "unreadable": []}
    """

    @staticmethod
    def default() -> Own:
        return {**{name: section.default() for name, section in SECTIONS.items()}, "unreadable": []}

    def command(self, user: str, pings: list[str], size: int, ssh_to: list[str], userns_key: str, api: dict | None) -> StringCommand:
        given = {"user": user, "pings": pings, "size": size, "ssh_to": ssh_to, "userns_key": userns_key, "api": api}
        return table_command(SECTIONS, given, NUMBERED)

    def process(self, output: list[str]) -> Own:
        sections = split(output)
        return {**{name: section.value(sections, name) for name, section in SECTIONS.items()}, "unreadable": sections[""]}


def api_reading(lines: list[str] | None) -> dict | None:
    """The health probe's JSON line; None where no probe ran (a worker)."""
    if lines is None:
        return None
    try:
        return json.loads([line for line in lines if line.strip()][-1])
    except (ValueError, IndexError):
        return {"ok": False, "model": None, "max_model_len": None, "error": "the health probe printed nothing readable", "unreadable": lines}


def ping_targets(cluster: Cluster, name: str) -> list[tuple[int, str, str, str]]:
    """What ``name`` pings: every other node on every rail, as (rail index, netdev, other node,
    its address), rail by rail and the others in rank order."""
    return [(index, rail.netdev, other.hostname, str(other.rails[index].address.ip))
            for index, rail in enumerate(cluster.node(name).rails) for other in cluster.others(name)]


def ssh_targets(cluster: Cluster, name: str) -> list[tuple[str, str]]:
    """Where ``name``'s deploy user must log in without a password, as (node, address) on every rail."""
    return [(target.hostname, address) for target in cluster.logins_from(cluster.node(name)) for address in target.fabric_addresses]
