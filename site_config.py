"""Load and validate the site file (`site.toml`) before pyinfra contacts any host.

Every problem is reported at once, each naming the field, the value seen and the fix.
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import runpy
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import serving_data

REPO = Path(__file__).resolve().parent
SITE_ENV = "DUAL_SPARK_SITE"
PLACEHOLDER = "CHANGE_ME"
PROFILES = ("adaptive", "fast", "long-c4")
ROLES = ("head", "worker")
MTU_RANGE = (1280, 9216)
NETDEV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")
RDMA_RE = re.compile(r"^[A-Za-z0-9_.-]{1,63}$")
USER_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
HOSTNAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
# The keys each table of the site file may hold ([settings] takes group_data/all.py's names).
SCHEMA = {
    "": {"ssh", "node", "settings", "model", "image", "profile"},
    "ssh": {"user", "key", "port", "known_hosts"},
    "node": {"role", "hostname", "ssh_host", "rail"},
    "rail": {"netdev", "rdma", "address", "gid_index"},
}
TABLE_NAMES = {"": "the site file", "ssh": "[ssh]", "node": "[[node]]", "rail": "[[node.rail]]"}


class SiteError(Exception):
    """The site file or a --data override is invalid; the message lists every problem."""


@dataclass(frozen=True)
class Rail:
    netdev: str
    rdma: str
    address: ipaddress.IPv4Interface
    gid_index: str | int = "auto"

    def as_data(self) -> dict:
        return {
            "netdev": self.netdev,
            "rdma": self.rdma,
            "address": str(self.address.ip),
            "cidr": str(self.address),
            "gid_index": self.gid_index,
        }


@dataclass(frozen=True)
class Node:
    role: str
    ssh_host: str
    hostname: str
    rails: tuple[Rail, ...]


@dataclass
class Site:
    path: Path
    deploy_user: str
    ssh_key: str | None
    ssh_port: int
    known_hosts: str | None
    nodes: dict[str, Node]
    settings: dict = field(default_factory=dict)
    serving: dict = field(default_factory=dict)

    def inventory_groups(self) -> dict[str, list[tuple[str, dict]]]:
        """pyinfra groups: {"head": [(name, data)], "worker": [(name, data)]}."""
        groups = {}
        for role, node in self.nodes.items():
            peer = self.nodes["worker" if role == "head" else "head"]
            data = {
                **self.settings,
                **self.serving,
                "role": role,
                "expected_hostname": node.hostname,
                "peer_name": peer.hostname,
                "peer_address": peer.ssh_host,
                "deploy_user": self.deploy_user,
                "rails": [rail.as_data() for rail in node.rails],
                "peer_rails": [rail.as_data() for rail in peer.rails],
                "ssh_hostname": node.ssh_host,
                "ssh_user": self.deploy_user,
                "ssh_port": self.ssh_port,
            }
            if self.ssh_key:
                data["ssh_key"] = self.ssh_key
            if self.known_hosts:
                data["ssh_known_hosts_file"] = self.known_hosts
            groups[role] = [(node.hostname, data)]
        return groups


def unknown(key: str, known, where: str, elsewhere: bool = True) -> str:
    """The fix for an unknown key: the nearest known key, here or (``elsewhere``) in another
    table of the site file."""
    candidates = {name: where for name in known}
    for table, names in SCHEMA.items() if elsewhere else ():
        for name in names:
            candidates.setdefault(name, TABLE_NAMES[table])
    scored = sorted(((difflib.SequenceMatcher(None, key, name).ratio(), name) for name in candidates), reverse=True)
    score, nearest = scored[0]
    if score < 0.4:
        return f"unknown key in {where}; known: {', '.join(sorted(known))}"
    if candidates[nearest] == where:
        return f"unknown key in {where}; did you mean {nearest!r}?"
    return f"unknown key in {where}; did you mean {nearest!r} (a key of {candidates[nearest]})?"


def default_settings() -> dict:
    """The defaults of `group_data/all.py`, without pyinfra's own arguments."""
    values = runpy.run_path(str(REPO / "group_data" / "all.py"))
    return {k: v for k, v in values.items() if not k.startswith("_")}


def site_path() -> Path:
    return Path(os.environ.get(SITE_ENV) or REPO / "site.toml")


def cli_data_overrides(argv: list[str]) -> dict:
    """The `--data key=value` pairs of a pyinfra command line, parsed as pyinfra does."""
    # Imported here: pyinfra_cli monkey-patches the standard library with gevent on import,
    # which only the pyinfra CLI (already running when inventory.py calls this) should do.
    from pyinfra_cli.util import parse_cli_arg

    overrides = {}
    for i, arg in enumerate(argv):
        if arg == "--data" and i + 1 < len(argv):
            pair = argv[i + 1]
        elif arg.startswith("--data="):
            pair = arg.split("=", 1)[1]
        else:
            continue
        key, _, value = pair.partition("=")
        overrides[key] = parse_cli_arg(value)
    return overrides


def load_site(path: Path | None = None, overrides: dict | None = None) -> Site:
    """Read, merge (defaults < [settings] < overrides) and validate a site file."""
    path = path or site_path()
    if not path.exists():
        raise SiteError(
            f"{path}: no site file. Fix: copy site.example.toml to site.toml and describe your two "
            f"Sparks, or point {SITE_ENV} at one (the lab writes its own: python -m lab up)."
        )
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        raise SiteError(f"{path}: not valid TOML ({error}). Fix: correct the syntax.") from None
    return _Validator(path, raw, overrides or {}).site()


class _Validator:
    def __init__(self, path: Path, raw: dict, overrides: dict):
        self.path = path
        self.raw = raw
        self.overrides = overrides
        self.errors: list[str] = []
        self.fields_in_error: set[str] = set()

    def error(self, field_name: str, seen, fix: str) -> None:
        """Record one problem; a field reports only its first."""
        if field_name not in self.fields_in_error:
            self.fields_in_error.add(field_name)
            self.errors.append(f"{field_name} = {seen!r}: {fix}")

    def site(self) -> Site:
        self._unknown_keys()
        self._placeholders(self.raw, "")
        ssh = self.raw.get("ssh", {})
        user = ssh.get("user")
        if not isinstance(user, str) or not USER_RE.match(user):
            self.error("ssh.user", user, "set the deploy user, a Linux user name present on both Sparks")
        port = ssh.get("port", 22)
        if not isinstance(port, int) or not 0 < port < 65536:
            self.error("ssh.port", port, "use an SSH port number between 1 and 65535")
        nodes = self._nodes()
        serving = serving_data.merge(self.raw, self.error, lambda key, known, where: unknown(key, known, where, elsewhere=False))
        settings = self._settings(serving)
        if nodes:
            self._fabric(nodes)
        if self.errors:
            listing = "\n".join(f"  - {line}" for line in self.errors)
            raise SiteError(f"{self.path}: {len(self.errors)} problem(s), no host was contacted:\n{listing}")
        return Site(self.path, user, ssh.get("key"), port, ssh.get("known_hosts"), nodes, settings, serving)

    def _unknown_keys(self) -> None:
        """A typo anywhere (`ssh_hots`, `[sevrer]`) is refused, naming the nearest known key."""
        def check(table: dict, schema: str, where: str) -> None:
            for key in table:
                if key not in SCHEMA[schema]:
                    self.error(f"{where}{key}", table[key], unknown(key, SCHEMA[schema], TABLE_NAMES[schema], elsewhere=bool(schema)))

        check(self.raw, "", "")
        if isinstance(self.raw.get("ssh"), dict):
            check(self.raw["ssh"], "ssh", "ssh.")
        for index, node in enumerate(self.raw.get("node", []) if isinstance(self.raw.get("node"), list) else []):
            check(node, "node", f"node[{index}].")
            for rail_index, rail in enumerate(node.get("rail", []) if isinstance(node.get("rail"), list) else []):
                check(rail, "rail", f"node[{index}].rail[{rail_index}].")

    def _placeholders(self, value, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                self._placeholders(item, f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self._placeholders(item, f"{where}[{index}]")
        elif isinstance(value, str) and PLACEHOLDER in value:
            self.error(where, value, "replace the placeholder with this site's value")

    def _nodes(self) -> dict[str, Node]:
        entries = self.raw.get("node", [])
        roles = [entry.get("role") for entry in entries]
        if sorted(roles) != sorted(ROLES):
            self.error("node[].role", roles, "declare exactly two [[node]] tables, one role 'head', one 'worker'")
            return {}
        nodes = {}
        for index, entry in enumerate(entries):
            where = f"node[{index}]"
            hostname = entry.get("hostname")
            if not isinstance(hostname, str) or not HOSTNAME_RE.match(hostname):
                self.error(f"{where}.hostname", hostname, "set the node's hostname (letters, digits, '-')")
            ssh_host = entry.get("ssh_host")
            if not isinstance(ssh_host, str) or not ssh_host:
                self.error(f"{where}.ssh_host", ssh_host, "set the management LAN address or DNS name used for SSH")
            rails = tuple(self._rail(f"{where}.rail[{i}]", rail) for i, rail in enumerate(entry.get("rail", [])))
            if not rails:
                self.error(f"{where}.rail", [], "declare at least one [[node.rail]] (netdev, rdma, address)")
            nodes[entry["role"]] = Node(entry["role"], ssh_host, hostname, tuple(r for r in rails if r))
        head, worker = nodes["head"], nodes["worker"]
        if self.fields_in_error & {"node[0].hostname", "node[1].hostname", "node[0].ssh_host", "node[1].ssh_host"}:
            return nodes
        if head.hostname == worker.hostname:
            self.error("node[].hostname", head.hostname, "the two Sparks need different hostnames (set one with hostnamectl)")
        if head.ssh_host == worker.ssh_host:
            self.error("node[].ssh_host", head.ssh_host, "head and worker need different SSH addresses")
        return nodes

    def _rail(self, where: str, entry: dict) -> Rail | None:
        errors = len(self.errors)
        netdev, rdma = entry.get("netdev"), entry.get("rdma")
        if not isinstance(netdev, str) or not NETDEV_RE.match(netdev):
            self.error(f"{where}.netdev", netdev, "use the CX-7 interface name (at most 15 letters, digits, '_.-'), e.g. enp1s0f0np0")
        if not isinstance(rdma, str) or not RDMA_RE.match(rdma):
            self.error(f"{where}.rdma", rdma, "use the RDMA device of that interface (ls /sys/class/infiniband), e.g. rocep1s0f0")
        address = None
        try:
            address = ipaddress.IPv4Interface(entry.get("address"))
        except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError, TypeError):
            self.error(f"{where}.address", entry.get("address"), "use an IPv4 address with prefix, e.g. 10.0.0.1/24")
        else:
            if address.network.prefixlen > 30 or address.ip in (address.network.network_address, address.network.broadcast_address):
                self.error(f"{where}.address", str(address), "use a host address of a subnet with room for both nodes, e.g. 10.0.0.1/24")
        gid_index = entry.get("gid_index", "auto")
        if gid_index != "auto" and not (isinstance(gid_index, int) and 0 <= gid_index < 256):
            self.error(f"{where}.gid_index", gid_index, "use 'auto' (found per node) or a GID table index 0-255")
        if len(self.errors) > errors:
            return None
        return Rail(netdev, rdma, address, gid_index)

    def _fabric(self, nodes: dict[str, Node]) -> None:
        head, worker = nodes["head"], nodes["worker"]
        if len(head.rails) != len(worker.rails):
            self.error("node[].rail", f"head {len(head.rails)}, worker {len(worker.rails)}",
                       "give both nodes the same number of rails: rail N of the head faces rail N of the worker")
            return
        seen_addresses: dict[str, str] = {}
        subnets: dict[str, int] = {}
        for index, (mine, theirs) in enumerate(zip(head.rails, worker.rails)):
            where = f"rail[{index}]"
            for role, rail in (("head", mine), ("worker", theirs)):
                ip = str(rail.address.ip)
                if ip in seen_addresses:
                    self.error(f"{role} {where}.address", ip, f"already used by {seen_addresses[ip]}: every fabric address must be unique")
                seen_addresses[ip] = f"{role} {where}"
            if mine.address.network != theirs.address.network:
                self.error(f"{where}.address", f"head {mine.address}, worker {theirs.address}",
                           "put the head and worker ends of a rail in the same subnet")
                continue
            subnet = str(mine.address.network)
            if subnet in subnets:
                self.error(f"{where}.address", subnet, f"subnet already used by rail[{subnets[subnet]}]: give each rail its own subnet")
            subnets[subnet] = index
            for node in (head, worker):
                try:
                    management = ipaddress.ip_address(node.ssh_host)
                except ValueError:
                    continue
                if management in mine.address.network:
                    self.error(f"{where}.address", subnet,
                               f"overlaps the management address {management} of {node.role}: pick a fabric subnet apart from the LAN")
        for role, node in nodes.items():
            for label, values in (("netdev", [r.netdev for r in node.rails]), ("rdma", [r.rdma for r in node.rails])):
                duplicates = sorted({v for v in values if values.count(v) > 1})
                if duplicates:
                    self.error(f"{role} rail[].{label}", duplicates, "each rail needs its own device")

    def _settings(self, serving: dict) -> dict:
        defaults = default_settings()
        settings = {**self.raw.get("settings", {})}
        for key in settings:
            if key not in defaults:
                self.error(f"settings.{key}", settings[key], unknown(key, defaults, "[settings]"))
        for key in self.overrides:
            if key not in defaults and not key.startswith(("ssh_", "_")):
                self.error(f"--data {key}", self.overrides[key], unknown(key, defaults, "the settings"))
        effective = {**defaults, **settings, **self.overrides}
        where = {key: ("--data " if key in self.overrides else "settings.") + key for key in effective}
        for key, value in list(effective.items()):
            if key in defaults and not serving_data.type_ok(value, type(defaults[key])):
                self.error(where[key], value, f"use {serving_data.KIND[type(defaults[key])]}, like the default {defaults[key]!r}")
                effective[key] = defaults[key]  # the checks below then see a value of the right type
        profile = effective["profile"]
        if profile not in serving["profiles"]:
            self.error(where["profile"], profile, f"choose one of {', '.join(sorted(serving['profiles']))}")
        mtu = effective["fabric_mtu"]
        if not MTU_RANGE[0] <= mtu <= MTU_RANGE[1]:
            self.error(where["fabric_mtu"], mtu, f"use an MTU between {MTU_RANGE[0]} and {MTU_RANGE[1]} (9000 for jumbo frames)")
        for key in ("api_port", "master_port", "watchdog_port"):
            if not 0 < effective[key] < 65536:
                self.error(where[key], effective[key], "use a TCP port between 1 and 65535")
        try:
            api_host = ipaddress.ip_address(effective["api_host"])
        except ValueError:
            self.error(where["api_host"], effective["api_host"], "use an IP address (127.0.0.1 keeps the API on loopback)")
        else:
            if not api_host.is_loopback and not effective["api_public"]:
                self.error(where["api_host"], str(api_host), "the API would answer beyond this machine: keep 127.0.0.1 "
                           "(reach it through an SSH tunnel), or set api_public = true in [settings] to mean it")
        floor = effective["memory_floor_gib"]
        if not 0 < floor <= 128:
            self.error(where["memory_floor_gib"], floor, "use a number of GiB above 0 and at most 128")
        path = str(effective["netplan_path"])
        if not re.match(r"^/etc/netplan/[A-Za-z0-9_.-]+\.yaml$", path):
            self.error(where["netplan_path"], path, "use a file directly under /etc/netplan ending in .yaml")
        for key in ("state_dir", "model_dir", "stack_dir"):
            if not re.match(r"^/[A-Za-z0-9_./-]+$", effective[key]) or "/../" in effective[key] + "/":
                self.error(where[key], effective[key], "use an absolute path (letters, digits, '_', '.', '-', '/')")
        if not str(effective["hf_token_file"]).startswith(("/", "~/")):
            self.error(where["hf_token_file"], effective["hf_token_file"], "use an absolute path on the head, or one under ~/ (the deploy user's home)")
        if not effective["hf_endpoint"].startswith(("https://", "http://")):
            self.error(where["hf_endpoint"], effective["hf_endpoint"], "use the hub's URL, e.g. https://huggingface.co")
        if effective["verify_model"] not in ("size", "full"):
            self.error(where["verify_model"], effective["verify_model"], "use \"size\" (size and time against the manifest) or \"full\" (hash again)")
        if not 1 <= effective["replication_streams"] <= 32:
            self.error(where["replication_streams"], effective["replication_streams"], "use 1 to 32 streams per rail")
        for key in ("container_mounts", "container_devices", "vllm_extra_args"):
            if not all(isinstance(item, str) and item for item in effective[key]):
                self.error(where[key], effective[key], "use a list of strings")
        for path in effective["container_mounts"]:
            if not str(path).startswith("/"):
                self.error(where["container_mounts"], path, "mount absolute host paths")
        return {key: value for key, value in settings.items() if key in defaults}
