"""Load and validate the site file (`site.toml`) before pyinfra contacts any host.

Every problem is reported at once, each naming the field, the value seen and the fix.
"""

from __future__ import annotations

import copy
import difflib
import ipaddress
import os
import posixpath
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import layout
import serving_data
import site_schema as schema
from cluster import Canary, Cluster, Image, Model, Node, Profile, Rail, Settings, parallel

REPO = Path(__file__).resolve().parent
SITE_ENV = "DUAL_SPARK_SITE"
PLACEHOLDER = "CHANGE_ME"
MAX_NODES = 64
MAX_RAILS = 4
# The keys each table of the site file may hold, for the nearest-key suggestion of a typo.
SCHEMA = {
    "": {"ssh", "node", "settings", "model", "image", "profile", "client", "canary"},
    "ssh": set(schema.SSH),
    "node": set(schema.NODE),
    "rail": set(schema.RAIL),
    "settings": set(schema.SETTINGS),
    "model": set(schema.MODEL),
    "image": set(schema.IMAGE),
    "profile": set(schema.PROFILE),
    "client": set(),
    "canary": set(schema.CANARY),
}
TABLE_NAMES = {"": "the site file", "ssh": "[ssh]", "node": "[[node]]", "rail": "[[node.rail]]", "settings": "[settings]",
               "model": "[model]", "image": "[image.NAME]", "profile": "[profile.NAME]", "client": "[client.NAME]",
               "canary": "[canary.NAME]"}
# pyinfra's own arguments a `--data` may give: those that cannot weaken what the deploy checks.
PYINFRA_ARGUMENTS = {"_sudo_password"}
MAX_DEPTH = 8  # tables and lists inside each other: the deepest the schema has is 4
SHOWN = 120  # characters of a value quoted in a message
# A top-level table of the wrong shape: the syntax that gives the right one.
SHAPES = {
    "ssh": "write [ssh] on a line of its own, then user = \"...\" under it",
    "node": "declare each node as [[node]] (two brackets: a list of node tables), the head first, with hostname and ssh_host",
    "settings": "write [settings] on a line of its own, then key = value lines under it",
    "model": "write [model] on a line of its own, then repo and revision (or path) under it",
    "image": "declare each image as an [image.NAME] table",
    "profile": "declare profiles as [profile.NAME] tables; to choose the served one, set profile = \"NAME\" under [settings]",
    "client": "declare each client as an empty [client.NAME] table: the front door gives it a key of its own",
    "canary": "declare each canary as a [canary.NAME] table: prompt, and max_tokens or long = true",
}
# What state_dir holds besides a model_dir inside it: the first name of each of layout.paths under it.
STATE_ENTRIES = {path.split("/")[2] for path in layout.paths("/state", "/model").values() if path.startswith("/state/")}
# What stack_dir holds: the stack's files, their previous versions, the records and the marker.
STACK_ENTRIES = {*layout.STACK_FILES, *(f"{name}.previous" for name in layout.STACK_FILES), *layout.RECORDS, layout.MANAGED_MARKER,
                 layout.CANARY_ANSWERS}


class SiteError(Exception):
    """The site file or a --data override is invalid; the message lists every problem."""


def inventory_groups(cluster: Cluster) -> dict[str, list[tuple[str, dict]]]:
    """pyinfra groups: {"head": [(name, data)], "worker": [(name, data), ...]} in rank order; each
    node's data is the typed cluster, the node's place in it (rank, role) and pyinfra's
    connection: the one route from the site to the code."""
    groups: dict[str, list] = {"head": [], "worker": []}
    for node in cluster.nodes:
        data = {
            "cluster": cluster,
            "rank": node.rank,
            "role": node.role,
            "ssh_hostname": node.ssh_host,
            "ssh_user": cluster.deploy_user,
            "ssh_port": cluster.ssh_port,
        }
        if cluster.ssh_key:
            data["ssh_key"] = cluster.ssh_key
        if cluster.known_hosts:
            data["ssh_known_hosts_file"] = cluster.known_hosts
        groups[node.role].append((node.hostname, data))
    return groups


def unknown(key: str, known, where: str, elsewhere: bool = True) -> str:
    """The fix for an unknown key: the nearest known key, here or (``elsewhere``) in another
    table of the site file."""
    candidates = {name: where for name in known}
    for table, names in SCHEMA.items() if elsewhere else ():
        if key in names and TABLE_NAMES[table] != where:
            return f"{key} is a key of {TABLE_NAMES[table]}: set it there in the site file"
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
    """Each setting's default (site_schema.SETTINGS), a copy of its own."""
    return {name: copy.deepcopy(key.default) for name, key in schema.SETTINGS.items()}


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
        key, equals, value = pair.partition("=")
        if not equals:
            raise SiteError(f"--data {pair}: no value. Fix: write --data key=value, e.g. --data profile=fast")
        try:
            overrides[key] = parse_cli_arg(value)
        except RecursionError:
            raise SiteError(f"--data {key}: nested more than {MAX_DEPTH} levels deep. Fix: no setting nests that far.") from None
    return overrides


def load_site(path: Path | None = None, overrides: dict | None = None) -> Cluster:
    """Read, merge (defaults < [settings] < overrides) and validate a site file."""
    path = path or site_path()
    fix = f"Fix: copy site.example.toml to site.toml and describe your Sparks, or point {SITE_ENV} at one (the lab writes its own: python -m lab up)."
    if not path.exists():
        raise SiteError(f"{path}: no site file. {fix}")
    if not path.is_file():
        raise SiteError(f"{path}: not a file (a directory?). {fix}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise SiteError(f"{path}: not UTF-8 text (byte {error.start} is {error.object[error.start:error.start + 1]!r}). "
                        "Fix: save the site file as UTF-8.") from None
    except OSError as error:
        raise SiteError(f"{path}: cannot be read ({error.strerror}). Fix: make it readable by this user.") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise SiteError(f"{path}: not valid TOML ({error}). Fix: correct the syntax.") from None
    except RecursionError:
        raise SiteError(f"{path}: arrays or tables nested too deeply to read. Fix: at most {MAX_DEPTH} levels.") from None
    deep = too_deep({**raw, "--data": overrides or {}})
    if deep:
        raise SiteError(f"{path}: {deep} is nested more than {MAX_DEPTH} levels deep. Fix: no key of the site file nests that far.")
    return _Validator(path, raw, overrides or {}).site()


def too_deep(value, limit: int = MAX_DEPTH) -> str | None:
    """The first field nested deeper than ``limit`` tables and lists (walked without recursion)."""
    stack = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > limit:
            return where
        if isinstance(item, dict):
            stack += [(child, f"{where}.{key}" if where else str(key), depth + 1) for key, child in item.items()]
        elif isinstance(item, list):
            stack += [(child, f"{where}[{index}]", depth + 1) for index, child in enumerate(item)]
    return None


def shown(value) -> str:
    """A value as a message quotes it: its repr, cut to a prefix when long."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(text)} characters)"


class _Validator:
    """Shapes first, then every key against site_schema's tables, then the relations between keys."""

    def __init__(self, path: Path, raw: dict, overrides: dict):
        self.path = path
        self.raw = raw
        self.overrides = overrides
        self.errors: list[str] = []
        self.fields_in_error: set[str] = set()
        self.check = schema.Checker(self.error, lambda key, known, where: unknown(key, known, where, elsewhere=False))

    def error(self, field_name: str, seen, fix: str) -> None:
        """Record one problem; a field reports only its first."""
        if field_name not in self.fields_in_error:
            self.fields_in_error.add(field_name)
            self.errors.append(f"{field_name} = {shown(seen)}: {fix}")

    def failed(self, *prefixes: str) -> bool:
        return any(name == p or name.startswith((p + ".", p + "[")) for name in self.fields_in_error for p in prefixes)

    def site(self) -> Cluster:
        tables = self._shapes()
        self._placeholders(self.raw, "")
        ssh = self.check.table("ssh", tables["ssh"], schema.SSH, "[ssh]")
        nodes = self._nodes(tables["node"])
        serving = serving_data.merge(tables, self.check, self.error)
        effective, where = self._settings(tables["settings"], serving, ssh.get("port", 22))
        if nodes:
            self._topology(nodes, effective, where["topology"])
            self._fabric(nodes)
            self._parallel(len(nodes), serving["profiles"])
        clients = self._clients(tables["client"])
        if self.errors:
            listing = "\n".join(f"  - {line}" for line in self.errors)
            raise SiteError(f"{self.path}: {len(self.errors)} problem(s), no host was contacted:\n{listing}")
        return Cluster(self.path, ssh["user"], ssh.get("key"), ssh.get("port", 22), ssh.get("known_hosts"), tuple(nodes),
                       Settings(**effective), Model(**serving["model"]),
                       {name: Image(**spec) for name, spec in serving["images"].items()},
                       {name: Profile(**spec) for name, spec in serving["profiles"].items()}, clients,
                       {name: Canary(**spec) for name, spec in serving["canaries"].items()})

    def _clients(self, tables: dict) -> tuple[str, ...]:
        """The clients' names, each a [client.NAME] table with nothing in it (yet)."""
        for name, spec in tables.items():
            if not schema.CLIENT_NAME.fullmatch(name):
                self.error(f"client.{name}", name, "name a client with 1 to 32 lower-case letters, digits, '-' and '_', a letter first")
            elif name == "deploy":
                self.error(f"client.{name}", name, "the door calls the deploy's own key 'deploy': give the client another name")
            for key, value in spec.items():
                self.error(f"client.{name}.{key}", value, "a [client.NAME] table takes no keys: leave it empty")
        return tuple(sorted(tables))

    def _shapes(self) -> dict:
        """Each top-level table in the shape TOML gives it, or an error naming the right syntax;
        a table of the wrong shape is read as empty so that nothing after this meets it."""
        for key, value in self.raw.items():
            if key not in SCHEMA[""]:
                self.error(key, value, unknown(key, SCHEMA[""], TABLE_NAMES[""]))
        tables = {}
        for name, fix in SHAPES.items():
            value = self.raw.get(name, [] if name == "node" else {})
            wanted = list if name == "node" else dict
            if not isinstance(value, wanted):
                self.error(name, value, fix)
                value = wanted()
            tables[name] = value
        for name in ("image", "profile", "client", "canary"):
            for entry, spec in list(tables[name].items()):
                if not isinstance(spec, dict):
                    self.error(f"{name}.{entry}", spec, SHAPES[name])
                    del tables[name][entry]
        return tables

    def _placeholders(self, value, where: str) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                self._placeholders(item, f"{where}.{key}" if where else key)
        elif isinstance(value, list):
            for index, item in enumerate(value):
                self._placeholders(item, f"{where}[{index}]")
        elif isinstance(value, str) and PLACEHOLDER in value:
            self.error(where, value, "replace the placeholder with this site's value")

    def _nodes(self, entries: list) -> list[Node]:
        """The nodes in rank order: by ``rank`` when every node has one, else the file's order with
        the node whose role is "head" first (a two-node site of before the cluster model)."""
        declared = []
        for index, entry in enumerate(entries):
            where = f"node[{index}]"
            if not isinstance(entry, dict):
                self.error(where, entry, SHAPES["node"])
                continue
            node = self.check.table(where, entry, schema.NODE, "[[node]]")
            rails = node.get("rail", [])
            if "rail" in node and not 1 <= len(rails) <= MAX_RAILS:
                self.error(f"{where}.rail", f"{len(rails)} rail(s)",
                           f"declare 1 to {MAX_RAILS} [[node.rail]] (netdev, rdma, address): a Spark's two CX-7 ports have four netdevs")
                rails = []
            checked = []
            for rail_index, rail in enumerate(rails):
                rail_where = f"{where}.rail[{rail_index}]"
                if not isinstance(rail, dict):
                    self.error(rail_where, rail, "declare each rail as [[node.rail]] (two brackets) under its [[node]]")
                    continue
                good = self.check.table(rail_where, rail, schema.RAIL, "[[node.rail]]")
                if len(good) == len(rail) and not self.failed(rail_where):
                    checked.append(Rail(good["netdev"], good["rdma"], ipaddress.IPv4Interface(good["address"]), good.get("gid_index", "auto")))
            declared.append((where, node, tuple(checked)))
        if not 2 <= len(entries) <= MAX_NODES:
            self.error("node", f"{len(entries)} node(s)", f"declare 2 to {MAX_NODES} [[node]] tables, the head first")
        if self.failed("node") or not 2 <= len(declared) <= MAX_NODES:
            return []
        ordered = self._ranked(declared)
        if not ordered:
            return []
        nodes = [Node(rank, node["hostname"], node["ssh_host"], rails) for rank, (_, node, rails) in enumerate(ordered)]
        for label, key in (("hostname", lambda n: n.hostname.lower()), ("ssh_host", lambda n: schema.host_key(n.ssh_host))):
            seen: dict[str, str] = {}
            for node, (where, _, _) in zip(nodes, ordered):
                if key(node) in seen:
                    self.error(f"{where}.{label}", getattr(node, label), f"{seen[key(node)]} has it already: every Spark needs its own {label}"
                               + (" (set one with hostnamectl)" if label == "hostname" else ""))
                seen.setdefault(key(node), where)
        return nodes

    def _ranked(self, declared: list) -> list:
        """``declared`` in rank order, or [] after recording why it has none."""
        ranks = [node.get("rank") for _, node, _ in declared]
        if any(rank is not None for rank in ranks):
            if None in ranks or sorted(ranks) != list(range(len(declared))):
                self.error("node[].rank", ranks, f"give every [[node]] a rank, 0 (the head) to {len(declared) - 1}, each once; or none, in rank order")
                return []
            ordered = sorted(declared, key=lambda item: item[1]["rank"])
        else:
            heads = [item for item in declared if item[1].get("role") == "head"]
            if len(heads) > 1:
                self.error(f"{heads[1][0]}.role", "head", f"{heads[0][0]} is the head already: declare one head")
                return []
            ordered = heads + [item for item in declared if item not in heads]
        ranked = all(rank is not None for rank in ranks)
        for rank, (where, node, _) in enumerate(ordered):
            role = "head" if rank == 0 else "worker"
            if node.get("role", role) != role:
                if ranked:
                    fix = f"this node has rank {rank}, so it is the {role}: set role = \"{role}\" or drop role"
                elif rank == 0:
                    fix = "the first [[node]] is the head: put the head's [[node]] first, or give it role = \"head\""
                else:
                    fix = "declare one head"
                self.error(f"{where}.role", node["role"], fix)
                return []
        return ordered

    def _topology(self, nodes: list[Node], effective: dict, where: str) -> None:
        if effective["topology"] == "direct" and len(nodes) != 2:
            self.error(where, "direct", f"one cable joins two Sparks: {len(nodes)} nodes need a switch "
                       "(topology = \"switch\" under [settings], switch ports forced to 200G, auto-negotiation off)")

    def _fabric(self, nodes: list[Node]) -> None:
        """Every node on every rail; rail i of every node in one subnet, subnets apart from each
        other and from the management LAN; every address and every node's devices its own."""
        head = nodes[0]
        for node in nodes[1:]:
            if len(node.rails) != len(head.rails):
                self.error(f"{node.hostname} rail", f"{head.hostname} {len(head.rails)}, {node.hostname} {len(node.rails)}",
                           "give every node the same number of rails: rail N of each node is on the same cable (direct) or switch subnet")
                return
        seen_addresses: dict[str, str] = {}
        subnets: list[tuple[ipaddress.IPv4Network, int]] = []
        for index in range(len(head.rails)):
            where = f"rail[{index}]"
            subnet = head.rails[index].address.network
            apart = [node for node in nodes[1:] if node.rails[index].address.network != subnet]
            for node in nodes:
                ip = str(node.rails[index].address.ip)
                if ip in seen_addresses:
                    self.error(f"{node.hostname} {where}.address", ip, f"already used by {seen_addresses[ip]}: every fabric address must be unique")
                seen_addresses[ip] = f"{node.hostname} {where}"
            if apart:
                self.error(f"{where}.address", ", ".join(f"{node.hostname} {node.rails[index].address}" for node in [head, *apart]),
                           f"put every node's rail {index} in one subnet (the head's is {subnet})")
                continue
            for other, other_index in subnets:
                if subnet.overlaps(other):
                    self.error(f"{where}.address", str(subnet), f"overlaps rail[{other_index}]'s subnet {other}: give each rail a subnet of its own")
            subnets.append((subnet, index))
            for node in nodes:
                try:
                    management = ipaddress.ip_address(node.ssh_host)
                except ValueError:
                    continue
                if management in subnet:
                    self.error(f"{where}.address", str(subnet),
                               f"overlaps the management address {management} of {node.hostname}: pick a fabric subnet apart from the LAN")
        for node in nodes:
            for label, values in (("netdev", [r.netdev for r in node.rails]), ("rdma", [r.rdma for r in node.rails])):
                duplicates = sorted({v for v in values if values.count(v) > 1})
                if duplicates:
                    self.error(f"{node.hostname} rail[].{label}", duplicates, "each rail needs its own device")

    def _parallel(self, size: int, profiles: dict) -> None:
        """Every profile splits the model over exactly the cluster's nodes."""
        for name, profile in sorted(profiles.items()):
            tensor, pipeline = parallel(profile.get("tensor_parallel"), profile.get("pipeline_parallel"), size)
            if tensor * pipeline != size:
                key = "tensor_parallel" if "tensor_parallel" in profile else "pipeline_parallel"
                self.error(f"profile.{name}.{key}", profile[key],
                           f"tensor_parallel x pipeline_parallel must be the number of nodes, {size} (now {tensor} x {pipeline})")

    def _settings(self, site_settings: dict, serving: dict, ssh_port: int) -> tuple[dict, dict]:
        """The effective settings (defaults < the site's valid [settings] < --data) checked
        together, and where each was set."""
        defaults = default_settings()
        settings = self.check.table("settings", site_settings, schema.SETTINGS, "[settings]", required=False)
        overrides = {}
        for key, value in self.overrides.items():
            where = f"--data {key}"
            if key in schema.SETTINGS:
                if self.check.value(where, value, schema.SETTINGS[key]):
                    overrides[key] = value
            elif key in schema.CONNECTOR:
                self.check.value(where, value, schema.CONNECTOR[key])
            elif key.startswith("ssh_"):
                self.error(where, value, "connections are the site file's: set [ssh] and each node's ssh_host there, where they are checked per node")
            elif key.startswith("_"):
                if key not in PYINFRA_ARGUMENTS:
                    self.error(where, value, f"pyinfra's own argument would change how every step runs (_ignore_errors turns a refusal "
                               f"into 'go on'): only {', '.join(sorted(PYINFRA_ARGUMENTS))} may be given")
            else:
                self.error(where, value, unknown(key, schema.SETTINGS, "the settings"))
        effective = {**defaults, **settings, **overrides}
        where = {key: ("--data " if key in overrides else "settings.") + key for key in effective}
        Relations(effective, where, serving, ssh_port, self.error, self.failed).check()
        return effective, where


class Relations:
    """What no single key can say: the settings against each other and against what is served."""

    def __init__(self, effective: dict, where: dict, serving: dict, ssh_port: int, error, failed):
        self.values, self.where, self.serving, self.error, self.failed = effective, where, serving, error, failed
        self.ssh_port = ssh_port

    def check(self) -> None:
        values, where = self.values, self.where
        if values["profile"] not in self.serving["profiles"] and not self.failed("profile", where["profile"]):
            self.error(where["profile"], values["profile"], f"choose one of {', '.join(sorted(self.serving['profiles']))}")
        if not ipaddress.ip_address(values["api_host"]).is_loopback and not values["api_public"]:
            self.error(where["api_host"], values["api_host"], "the API would answer beyond this machine: keep 127.0.0.1 "
                       "(reach it through an SSH tunnel), or set api_public = true in [settings] to mean it")
        self._ports()
        self._hub()
        self._speculation()
        self._observability()
        self._adaptive_verification()
        self._directories()
        self._secrets()

    def _ports(self) -> None:
        """Each port that is bound its own (the door's and vLLM's beside the API): Prometheus, Alertmanager and the node
        exporter only with observability, Grafana only with its image too."""
        values, where = self.values, self.where
        bound = ["api_port", "vllm_port", "door_metrics_port", "master_port", "watchdog_port"]
        if values["observability"]:
            bound += ["prometheus_port", "alertmanager_port", "node_exporter_port"] + (["grafana_port"] if values["grafana_image"] else [])
        ports: dict[int, str] = {self.ssh_port: "SSH (ssh.port)"}
        for key in bound:
            if values[key] in ports:
                self.error(where[key], values[key], f"{ports[values[key]]} uses that port already: give each its own")
            ports.setdefault(values[key], key)

    def _hub(self) -> None:
        """The hub is reached over https (the token travels with every request), http only when
        the site says so; and saying so of an https hub contradicts it."""
        endpoint, insecure = self.values["hf_endpoint"], self.values["hf_endpoint_insecure_http"]
        http = urlsplit(endpoint).scheme == "http"
        if http and not insecure:
            self.error(self.where["hf_endpoint"], endpoint, "use https://; for a mirror on your LAN that speaks only http, "
                       "set hf_endpoint_insecure_http = true in [settings] to mean it (the hub token crosses in clear)")
        elif insecure and not http:
            self.error(self.where["hf_endpoint_insecure_http"], insecure,
                       f"hf_endpoint {endpoint} is not http: drop hf_endpoint_insecure_http, or name the http mirror it is for")

    def _speculation(self) -> None:
        """speculative_options reach vLLM only with a profile that drafts tokens: with the served
        one not drafting, they would be dropped silently."""
        options, name = self.values["speculative_options"], self.values["profile"]
        profile = self.serving["profiles"].get(name)
        if options and profile and profile.get("speculative_tokens") == 0:
            self.error(self.where["speculative_options"], options,
                       f"profile {name} drafts no tokens (speculative_tokens = 0), so these would be dropped: "
                       "drop speculative_options, or serve a profile with speculative_tokens above 0")

    def _observability(self) -> None:
        """Grafana and Alertmanager are part of observability: a pinned Grafana, or webhooks, with
        observability off would never run (a webhook is quoted to its host: it may hold a token)."""
        if self.values["grafana_image"] and not self.values["observability"]:
            self.error(self.where["grafana_image"], self.values["grafana_image"],
                       "observability = false installs no Grafana: set observability = true, or grafana_image = \"\" for none")
        if self.values["alert_webhooks"] and not self.values["observability"]:
            self.error(self.where["alert_webhooks"], schema.url_shown(self.values["alert_webhooks"]),
                       "observability = false installs no Alertmanager, and no alert is sent: set observability = true, "
                       "or alert_webhooks = [] for none")

    def _adaptive_verification(self) -> None:
        """vLLM 0.32 refuses at start adaptive verification with use_local_argmax_reduction
        (the draft logits it needs are never made) unless the method is dspark."""
        options = self.values["speculative_options"]
        if self.values["speculative_method"] == "dspark" or not options.get("use_local_argmax_reduction"):
            return
        for name, profile in sorted(self.serving["profiles"].items()):
            if profile.get("adaptive_verification"):
                self.error(self.where["speculative_options"], options,
                           f"profile {name} sets adaptive_verification, which reads the draft logits use_local_argmax_reduction "
                           "never makes: drop use_local_argmax_reduction, or adaptive_verification from the profile")

    def _directories(self) -> None:
        """The directories the deploy owns are apart: none inside another, except the model's
        own directory inside state_dir (and never in one of state_dir's own entries)."""
        values, where = self.values, self.where
        state, model, stack = values["state_dir"], values["model_dir"], values["stack_dir"]

        def inside(path: str, parent: str) -> bool:
            return path == parent or path.startswith(parent.rstrip("/") + "/")

        for key, path, other_key, other in (("model_dir", model, "stack_dir", stack), ("state_dir", state, "stack_dir", stack)):
            if inside(path, other) or inside(other, path):
                self.error(where[key], path, f"{other_key} is {other}: keep the deploy's directories apart (neither inside the other)")
        if inside(state, model):
            self.error(where["model_dir"], model, f"state_dir {state} would be inside the model's directory: use a directory of its own, e.g. {state}/model")
        elif inside(model, state) and model.split("/")[len(state.rstrip("/").split("/"))] in STATE_ENTRIES:
            self.error(where["model_dir"], model, f"{state}/{model.split('/')[len(state.rstrip('/').split('/'))]} is the deploy's own: use e.g. {state}/model")
        for index, mount in enumerate(values["container_mounts"]):
            for key in ("state_dir", "stack_dir"):
                if inside(mount, values[key]) or inside(values[key], mount):
                    self.error(f"{where['container_mounts']}[{index}]", mount,
                               f"{key} is {values[key]}: the deploy's own files (the API key) are never mounted into a container")
        for name, secret in values["container_secrets"].items():
            field = f"{where['container_secrets']}.{name}"
            for key in ("state_dir", "model_dir"):
                if inside(secret, values[key]):
                    self.error(field, secret, f"{key} is {values[key]}: the deploy writes there; keep secrets in a directory of their own, "
                               f"e.g. {schema.SECRETS_HOME}/{name}")
            below = secret[len(stack.rstrip("/")) + 1:].split("/")[0] if inside(secret, stack) else None
            if below in STACK_ENTRIES:
                self.error(field, secret, f"{stack}/{below} is the deploy's own (stack_dir): keep secrets in a directory of their own, "
                           f"e.g. {schema.SECRETS_HOME}/{name}")
        source = self.serving["model"].get("path")
        if source and (inside(model, source) or inside(source, model)):
            self.error("model.path", source, f"the weights are copied into model_dir {model}: keep the source outside it (and it outside the source)")
        for key in ("state_dir", "stack_dir") if source else ():
            if inside(source, values[key]) or inside(values[key], source):
                self.error("model.path", source, f"{key} is {values[key]}: the deploy's own files (the API key) are never the weights' source")

    def _secrets(self) -> None:
        """The hub token's directory (hf_token_file's, in the deploy user's home) is neither
        mounted into a container nor copied as the weights."""
        values, where = self.values, self.where
        token_dir = posixpath.dirname(values["hf_token_file"][2:])
        named = [(f"{where['container_mounts']}[{index}]", mount) for index, mount in enumerate(values["container_mounts"])]
        if self.serving["model"].get("path"):
            named.append(("model.path", self.serving["model"]["path"]))
        for field, path in named if token_dir else ():
            inside = schema.in_home(path)
            if inside and (inside == token_dir or inside.startswith(token_dir + "/") or token_dir.startswith(inside + "/")):
                self.error(field, path, f"hf_token_file {values['hf_token_file']} is in it: the hub token's directory is never "
                           "mounted into a container nor copied as the weights; name another directory")
