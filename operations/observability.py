"""Operations for observability: the OS's own Prometheus on the head and its node exporter on every
node, configured through drop-ins of their Debian units (the package's /etc/default files are left
as shipped), with the deploy's recording and alert rules and its textfile collector; and Grafana on
the head, from an image pinned by digest, when the site names one. Every file is written only when
it differs, and a service restarts only when its own configuration changed (or it is not running).
The unit drop-ins are written before a package is installed, so a package's first start already
listens where the deploy says, never on the management LAN."""

from __future__ import annotations

import json
import posixpath
import re
from dataclasses import dataclass
from io import BytesIO
from pathlib import Path
from urllib.parse import urlsplit

import yaml
from pyinfra import host
from pyinfra.api import OperationError, QuoteString, StringCommand, operation
from pyinfra.api.util import get_file_sha256

from cluster import HEAL_FACTOR, Cluster
from facts.alerting import PACKAGE, AlertmanagerState, shown
from facts.observability import CONFIG_FILES, ObservabilityState
from files.dual_spark.silence import QUIET
from layout import (
    ALERTMANAGER_CONFIG,
    ALERTMANAGER_STORAGE,
    ANSWERS_TEXTFILE,
    COLLECTOR_STATE,
    COLLECTOR_USER,
    DOOR,
    GRAFANA_DATASOURCE_UID,
    GRAFANA_PROJECT,
    PROMETHEUS_DIR,
    PROMETHEUS_STORAGE,
    RUN_DIR,
    SCRAPE_JOBS,
    TEXTFILE,
    TEXTFILE_DIR,
    UNIT_FILES,
    UNITS,
    VLLM_HOST,
    paths,
)
from operations.managed import show_changed
from operations.own import claimed
from operations.peer import acts_here
from operations.readings import Reading, plans, read
from operations.render import render, show_diff, show_line
from operations.services import differs, from_staging, installed, restarted_or_reloaded, running, staged, units_put
from operations.upload import upload
from programs import digest

REPO = Path(__file__).resolve().parents[1]
DASHBOARDS = REPO / "files/observability/dashboards"
STAGING = f"{RUN_DIR}/prometheus-check"
ALERTMANAGER_STAGING = f"{RUN_DIR}/alertmanager-check"  # root's alone: the configuration may hold a token
ALERTMANAGER_MODE, ALERTMANAGER_OWNER = "640", "root:prometheus"  # the daemon runs as prometheus and reads it
GRAFANA_STAGING = f"{RUN_DIR}/grafana-check"
READY_WAIT = 60  # seconds Prometheus has to answer /-/ready after a (re)start or a reload
RULE_FILES = ("recording.yml", "alerts.yml", "objectives.yml")
RULES = tuple(f"/{name}" for name in RULE_FILES)
HEADER = "# Managed by the dual-spark deploy (tasks/observability.py): edits here are overwritten.\n"


@dataclass(frozen=True)
class ObservabilitySettings:
    """What one node's observability is made of (``observability_settings``)."""

    hostname: str
    role: str
    rails: list[dict]
    prometheus_port: int
    alertmanager_port: int
    webhooks: int  # how many webhooks the site names (their URLs are in ``files`` alone)
    exporter_port: int
    programs: str
    stack_dir: str
    grafana_image: str
    grafana_port: int
    grafana_dir: str
    show_program_diffs: bool  # the rules' and dashboards' full diffs, not one line each
    files: dict[str, str]  # path -> text of every file the deploy writes for it on this node


def window(interval: int) -> str:
    """The range of the rules' rates: four scrapes, and a minute at least."""
    return f"{max(60, 4 * interval)}s"


def prometheus_config(cluster: Cluster) -> str:
    """prometheus.yml, built as data: vLLM on the head, behind the front door on loopback (only
    rank 0 has engine metrics), the door's own metrics (HAProxy's exporter, and its Lua's counts),
    the node exporter of every node on its rail 0 address, and Prometheus itself. Each target is
    labelled with its node's hostname. Its alerts go to Alertmanager on the head's loopback."""
    settings, head = cluster.settings, cluster.head
    interval = settings.metrics_interval_seconds
    config = {
        "global": {"scrape_interval": f"{interval}s", "evaluation_interval": f"{interval}s", "scrape_timeout": f"{min(interval, 10)}s"},
        "rule_files": list(RULE_FILES),
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{settings.alertmanager_port}"]}]}]},
        "scrape_configs": [
            {"job_name": SCRAPE_JOBS["prometheus"],
             "static_configs": [{"targets": [f"127.0.0.1:{settings.prometheus_port}"], "labels": {"node": head.hostname}}]},
            {"job_name": SCRAPE_JOBS["vllm"],
             "static_configs": [{"targets": [f"{VLLM_HOST}:{settings.vllm_port}"], "labels": {"node": head.hostname, "rank": "0"}}]},
            {"job_name": SCRAPE_JOBS["door"],
             "static_configs": [{"targets": [f"127.0.0.1:{settings.door_metrics_port}"], "labels": {"node": head.hostname}}]},
            {"job_name": SCRAPE_JOBS["door_counts"], "metrics_path": DOOR["counts_path"],
             "static_configs": [{"targets": [f"127.0.0.1:{settings.door_metrics_port}"], "labels": {"node": head.hostname}}]},
            {"job_name": SCRAPE_JOBS["node"],
             "static_configs": [{"targets": [f"{node.fabric_addresses[0]}:{settings.node_exporter_port}"],
                                 "labels": {"node": node.hostname, "rank": str(node.rank)}} for node in cluster.nodes]},
        ],
    }
    text = (HEADER + "# Prometheus of the dual-spark cluster: vLLM and the front door on the head, the node exporter of every node over the fabric.\n"
            + yaml.safe_dump(config, sort_keys=False, width=10**6))
    if yaml.safe_load(text) != config:
        raise OperationError(f"{PROMETHEUS_DIR}/prometheus.yml would not read back as meant: refusing to write it")
    return text


def rule_files(cluster: Cluster) -> dict[str, str]:
    """The rule files of the cluster (RULE_FILES), rendered from templates/observability/."""
    settings = cluster.settings
    return rules_for(settings.metrics_interval_seconds, settings.expected_link_speed_mbps, settings.heal_margin_seconds,
                     settings.serving_ready_timeout, objectives(settings))


# The alerts a node gone makes on its own: its rails' (the collector's series end with its exporter)
# and the API's, which every node serves a part of. In a direct pair the other node's rails are the
# same cable, and go down with it.
NODE_DOWN = "DualSparkNodeDown"
RAIL_ALERTS = ("DualSparkRailDown", "DualSparkRailSlow", "DualSparkRailErrors")
API_ALERT = "DualSparkApiDown"
HEARTBEAT = "DualSparkHeartbeat"
RECEIVER, NOBODY = "site", "head-only"  # the site's webhooks; none: the alerts stay on the head
# A group's first notification waits group_wait, an alert joining a group that went out waits its
# group_interval: by severity too, a warning that becomes a page (DualSparkApiDown past the heal it
# expected) opens a group of its own and pages after group_wait, not up to group_interval later.
GROUP_BY = ["alertname", "node", "severity"]


def alertmanager_timings(interval: int) -> dict[str, str]:
    """Alertmanager's waits, in scrapes: a group's first notification after two (the alerts of one
    fault, evaluated together, go out together), its changes after twenty (5 min at 15 s), a
    firing alert again after four hours; the heartbeat every twenty scrapes."""
    return {"group_wait": duration(2 * interval), "group_interval": duration(20 * interval), "repeat_interval": "4h",
            "heartbeat": duration(20 * interval)}


def inhibit_rules(topology: str) -> list[dict]:
    """A node gone silences the alerts it causes: its rails' (``equal: node``; in a direct pair
    both nodes' rails, the one cable between them), and the API's (the model is split over every
    node, so any node gone takes it down)."""
    rails = {"source_matchers": [f'alertname="{NODE_DOWN}"'], "target_matchers": [f'alertname=~"{"|".join(RAIL_ALERTS)}"']}
    return [{**rails, **({} if topology == "direct" else {"equal": ["node"]})},
            {"source_matchers": [f'alertname="{NODE_DOWN}"'], "target_matchers": [f'alertname="{API_ALERT}"']}]


def alertmanager_config(cluster: Cluster) -> str:
    """alertmanager.yml, built as data: every alert to the site's webhooks (none named: to a
    receiver that sends nothing, and the alerts stay on the head), grouped by alert, node and
    severity (GROUP_BY); the heartbeat repeated every twenty scrapes, so that a receiver notices
    its silence; a node gone silencing the alerts it causes (``inhibit_rules``)."""
    settings = cluster.settings
    timings = alertmanager_timings(settings.metrics_interval_seconds)
    receiver = RECEIVER if settings.alert_webhooks else NOBODY
    receivers = [{"name": receiver, **({"webhook_configs": [{"url": url, "send_resolved": True} for url in settings.alert_webhooks]}
                                       if settings.alert_webhooks else {})}]
    config = {
        "route": {"receiver": receiver, "group_by": GROUP_BY, "group_wait": timings["group_wait"],
                  "group_interval": timings["group_interval"], "repeat_interval": timings["repeat_interval"],
                  "routes": [{"matchers": [f'alertname="{HEARTBEAT}"'], "receiver": receiver, "group_wait": "0s",
                              "group_interval": timings["heartbeat"], "repeat_interval": timings["heartbeat"]}]},
        "inhibit_rules": inhibit_rules(settings.topology),
        "receivers": receivers,
    }
    text = (HEADER + "# Alertmanager of the dual-spark cluster: the alerts of the head's Prometheus to the site's receivers "
            "(alert_webhooks).\n" + yaml.safe_dump(config, sort_keys=False, width=10**6))
    if yaml.safe_load(text) != config:
        raise OperationError(f"{ALERTMANAGER_CONFIG} would not read back as meant: refusing to write it")
    hidden = shown(text)
    if any(urlsplit(url)._replace(scheme="", netloc="").geturl() not in ("", "/") and url in hidden for url in settings.alert_webhooks):
        raise OperationError(f"{ALERTMANAGER_CONFIG}: a webhook URL would show whole in the diff: refusing to write it")
    return text


def duration(seconds: int) -> str:
    """Prometheus's shortest spelling of a whole number of seconds: 300 -> 5m, 86400 -> 1d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


# The Google SRE workbook's multi-window, multi-burn-rate alerts (chapter 5, "Alerting on SLOs"): the
# burn rate (how many times faster than the budget allows) over a long window and over a short one,
# both above the factor. 14.4 over 1 h spends 2% of 30 days' budget; 6 over 6 h, 5%: those page.
# 3 over 1 d and 1 over 3 d, 10% each: those are tickets.
BURNS = (("page", 3600, 300, 14.4), ("page", 21600, 1800, 6), ("ticket", 86400, 7200, 3), ("ticket", 259200, 21600, 1))


def burn_windows(interval: int) -> dict[str, list[tuple[str, str, float]]]:
    """Per severity, (long window, short window, factor): each window four scrapes at least."""
    found: dict[str, list[tuple[str, str, float]]] = {}
    for kind, long, short, factor in BURNS:
        found.setdefault(kind, []).append((duration(max(long, 4 * interval)), duration(max(short, 4 * interval)), factor))
    return found


def objectives(settings) -> list[dict]:
    """The objectives of the site: per objective its name, the budget (the share that may be bad)
    and what is bad, for templates/observability/objectives.yml.j2."""
    return [
        {"name": "errors", "alert": "Error", "title": "error", "budget": settings.slo_error_ratio,
         "what": f"requests failed (a 5xx from the door, or vLLM ending one in error), where {settings.slo_error_ratio:g} may"},
        {"name": "ttft_slow", "alert": "Ttft", "title": "time to first token", "histogram": "time_to_first_token_seconds", "budget": round(1 - settings.slo_ttft_target, 6), "bound": repr(float(settings.slo_ttft_seconds)),
         "what": f"requests waited over {settings.slo_ttft_seconds:g} s for their first token, where {1 - settings.slo_ttft_target:.4g} may"},
        {"name": "itl_slow", "alert": "Itl", "title": "inter-token latency", "histogram": "inter_token_latency_seconds", "budget": round(1 - settings.slo_itl_target, 6), "bound": repr(float(settings.slo_itl_seconds)),
         "what": f"tokens came over {settings.slo_itl_seconds:g} s after the one before, where {1 - settings.slo_itl_target:.4g} may"},
    ]


def rules_for(interval: int, expected_link_speed_mbps: int, heal_margin_seconds: int, ready_timeout: int,
              objectives: list[dict]) -> dict[str, str]:
    """The rule files (RULE_FILES) for a scrape ``interval`` in seconds; a heal expected within
    HEAL_FACTOR times the head's last measured start plus ``heal_margin_seconds``, or within
    ``ready_timeout`` (the deploy's own bound for a start) while no start was measured."""
    # the node exporter's `file` label of the collector's textfile: its name, or its path (node exporter 1.6 on)
    textfile = f"({re.escape(TEXTFILE_DIR + '/')})?{re.escape(posixpath.basename(TEXTFILE))}"
    burns = burn_windows(interval)
    values = {"interval": interval, "window": window(interval), "jobs": SCRAPE_JOBS, "expected_link_speed_mbps": expected_link_speed_mbps,
              "textfile": textfile, "textfile_dir": TEXTFILE_DIR, "heal_factor": HEAL_FACTOR, "heal_margin": heal_margin_seconds,
              "quiet": QUIET, "ready_timeout": ready_timeout, "objectives": objectives, "burns": burns,
              "burn_ranges": sorted({w for pairs in burns.values() for pair in pairs for w in pair[:2]}, key=seconds_of)}
    return {name: render(f"observability/{name}.j2", **values) for name in RULE_FILES}


def seconds_of(span: str) -> int:
    """The seconds of a ``duration``."""
    return int(span[:-1]) * {"d": 86400, "h": 3600, "m": 60, "s": 1}[span[-1]]


def grafana_files(cluster: Cluster, grafana_dir: str) -> dict[str, str]:
    """Grafana's stack on the head: compose.yaml (built as data), its provisioning (the Prometheus
    datasource, with a fixed uid and the scrape interval as its time interval; the dashboards'
    provider) and the dashboards, each a file of files/observability/dashboards/. Anonymous
    viewers only: no login form, no basic auth, no admin account made at its first start, so
    there is no default password to change."""
    settings = cluster.settings
    inside = "/etc/grafana/provisioning"
    datasource = {"apiVersion": 1, "datasources": [{
        "name": "Prometheus", "type": "prometheus", "uid": GRAFANA_DATASOURCE_UID, "access": "proxy", "isDefault": True,
        "url": f"http://127.0.0.1:{settings.prometheus_port}", "editable": False,
        "jsonData": {"timeInterval": f"{settings.metrics_interval_seconds}s"}}]}
    provider = {"apiVersion": 1, "providers": [{
        "name": "dual-spark", "folder": "dual-spark", "type": "file", "disableDeletion": True, "allowUiUpdates": False,
        "options": {"path": "/var/lib/dual-spark-dashboards"}}]}
    env = {"GF_SERVER_HTTP_ADDR": "127.0.0.1", "GF_SERVER_HTTP_PORT": str(settings.grafana_port),
           "GF_AUTH_ANONYMOUS_ENABLED": "true", "GF_AUTH_ANONYMOUS_ORG_ROLE": "Viewer", "GF_AUTH_DISABLE_LOGIN_FORM": "true",
           "GF_AUTH_BASIC_ENABLED": "false", "GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION": "true", "GF_USERS_ALLOW_SIGN_UP": "false",
           "GF_USERS_ALLOW_ORG_CREATE": "false", "GF_ANALYTICS_REPORTING_ENABLED": "false",
           "GF_ANALYTICS_CHECK_FOR_UPDATES": "false", "GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH": "/var/lib/dual-spark-dashboards/vllm-overview.json"}
    stack = {"name": GRAFANA_PROJECT, "services": {"grafana": {
        "image": settings.grafana_image, "pull_policy": "missing", "container_name": GRAFANA_PROJECT, "restart": "unless-stopped",
        "network_mode": "host", "environment": env,
        "volumes": [f"./provisioning:{inside}:ro", "./dashboards:/var/lib/dual-spark-dashboards:ro", "grafana-data:/var/lib/grafana"]}},
        "volumes": {"grafana-data": {}}}
    compose = HEADER + "# Grafana on loopback, anonymous viewers only (no login, no admin account), its dashboards provisioned read-only.\n" + yaml.safe_dump(
        stack, sort_keys=False, width=10**6)
    files = {"compose.yaml": compose,
             "provisioning/datasources/dual-spark.yaml": HEADER + yaml.safe_dump(datasource, sort_keys=False),
             "provisioning/dashboards/dual-spark.yaml": HEADER + yaml.safe_dump(provider, sort_keys=False)}
    files |= {f"dashboards/{path.name}": path.read_text() for path in sorted(DASHBOARDS.glob("*.json"))}
    return {f"{grafana_dir}/{name}": text for name, text in files.items()}


def observability_settings(cluster: Cluster, hostname: str) -> ObservabilitySettings:
    """One node's observability settings, with every file the deploy writes for it there."""
    node, settings = cluster.node(hostname), cluster.settings
    where = paths(settings.state_dir, settings.model_dir)
    interval = settings.metrics_interval_seconds
    files = {
        UNIT_FILES["node_exporter"]: render("observability/node-exporter.conf.j2", address=node.fabric_addresses[0],
                                            port=settings.node_exporter_port, textfile_dir=TEXTFILE_DIR),
        UNIT_FILES["collector"]: render("observability/dual-spark-metrics.service.j2", interval=interval, digest=digest("metrics.py")[:16],
                                        programs=where["programs"], textfile=TEXTFILE, role=node.role,
                                        watchdog_state=f"{where['serving']}/{node.role}-starts", planned=where["planned"],
                                        stack_dir=settings.stack_dir,
                                        state=COLLECTOR_STATE, model_dir=settings.model_dir, user=COLLECTOR_USER, rails=node.rail_data,
                                        textfile_dir=TEXTFILE_DIR),
    }
    grafana_dir = f"{settings.stack_dir}/grafana"
    if node.role == "head":
        files[UNIT_FILES["prometheus"]] = render("observability/prometheus.conf.j2", config=f"{PROMETHEUS_DIR}/prometheus.yml",
                                                 port=settings.prometheus_port, storage=PROMETHEUS_STORAGE,
                                                 retention_days=settings.prometheus_retention_days,
                                                 retention_gib=settings.prometheus_retention_gib)
        files |= {f"{PROMETHEUS_DIR}/prometheus.yml": prometheus_config(cluster),
                  **{f"{PROMETHEUS_DIR}/{name}": text for name, text in rule_files(cluster).items()}}
        files[UNIT_FILES["alertmanager"]] = render("observability/alertmanager.conf.j2", config=ALERTMANAGER_CONFIG,
                                                   port=settings.alertmanager_port, storage=ALERTMANAGER_STORAGE)
        files[ALERTMANAGER_CONFIG] = alertmanager_config(cluster)
        watched = sorted(name for name, canary in cluster.canaries.items() if canary.watch) if settings.canaries else []
        files[UNIT_FILES["answers"]] = render("observability/dual-spark-answers.service.j2", every=settings.canary_watch_seconds,
                                              canaries=watched, digest=digest("answers.py")[:16], user=COLLECTOR_USER,
                                              key_file=where["api_key"], programs=where["programs"], url=f"http://{VLLM_HOST}:{settings.vllm_port}",
                                              stack_dir=settings.stack_dir, planned=where["planned"], agree_tokens=settings.canary_agree_tokens,
                                              textfile=ANSWERS_TEXTFILE, textfile_dir=TEXTFILE_DIR)
        if settings.grafana_image:
            files |= grafana_files(cluster, grafana_dir)
    return ObservabilitySettings(
        hostname=hostname, role=node.role, rails=node.rail_data, prometheus_port=settings.prometheus_port,
        alertmanager_port=settings.alertmanager_port, webhooks=len(settings.alert_webhooks), exporter_port=settings.node_exporter_port, programs=where["programs"], stack_dir=settings.stack_dir,
        grafana_image=settings.grafana_image if node.role == "head" else "", grafana_port=settings.grafana_port, grafana_dir=grafana_dir, show_program_diffs=settings.show_program_diffs, files=files)


def reading_arguments(settings: ObservabilitySettings) -> dict:
    """ObservabilityState's arguments on this node (as operations/readings.py reads it for every step)."""
    grafana = sorted(path for path in settings.files if path.startswith(settings.grafana_dir + "/"))
    return {"role": settings.role, **({"grafana": grafana} if settings.grafana_image else {})}


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    if not cluster.settings.observability:
        return []
    head = cluster.node(name).role == "head"
    return [(ObservabilityState, reading_arguments(observability_settings(cluster, name)))] + [(AlertmanagerState, {})] * head


def service(reading: dict, unit: str) -> dict:
    return reading["services"].get(unit, {"active": "unknown", "enabled": "unknown"})


def collector_home(reading: dict):
    """The collector's own system user (no home, no login) and its directory, the only one it may
    write: made when missing, given back to it when another owner or mode was set there."""
    if not reading["collector_user"]:
        show_line(f"Will add the system user {COLLECTOR_USER}: the metrics collector's own, with no home and no login")
        yield StringCommand("useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", COLLECTOR_USER)
    found = reading["files"]["files"].get(TEXTFILE_DIR) or {"kind": "absent"}
    if found["kind"] == "file":
        raise OperationError(f"{host.name}: {TEXTFILE_DIR} is a file, where the metrics collector keeps its directory: move it away "
                             f"(sudo mv {TEXTFILE_DIR} {TEXTFILE_DIR}.old) and run the deploy again")
    owner = f"{COLLECTOR_USER}:{COLLECTOR_USER}"
    if found["kind"] == "absent" or (found["owner"], found["mode"]) != (owner, "755"):
        was = "" if found["kind"] == "absent" else f" (was {found['owner']}, mode {found['mode']})"
        show_line(f"Will make {TEXTFILE_DIR} the collector's directory: {owner}, mode 755{was}")
        yield StringCommand("install", "-d", "-o", COLLECTOR_USER, "-g", COLLECTOR_USER, "-m", "755", TEXTFILE_DIR)


@operation()
def exporters_running(settings: ObservabilitySettings):
    """
    On every node: the OS's node exporter on the node's rail 0 address (a drop-in of its unit:
    never the management LAN), and the deploy's collector of Spark metrics (its own unit, running
    `dual-spark.pyz metrics collect` as its own user) writing the exporter's textfile in its own
    directory; on the head, the watch of the answers (`dual-spark.pyz answers watch`, as the
    collector's user, the API key its credential) writing one more textfile there. The unit files are written, and systemd told, before the package is installed, so
    its first start listens where they say; each service restarts only when its unit file
    changed, its package is new (the collector: its user or directory), or it is not running.

    + settings: the node's observability settings (``observability_settings``)

    **Example:**

    .. code:: python

        exporters_running(settings=observability_settings(cluster, host.name))
    """
    reading = read(host, ObservabilityState, **reading_arguments(settings))
    files = reading["files"]["files"]
    units = {UNITS[name]: UNIT_FILES[name] for name in ("node_exporter", "collector", "answers") if UNIT_FILES[name] in settings.files}
    commands, changed_paths = units_put({path: settings.files[path] for path in units.values()}, files)
    changed = {unit for unit, path in units.items() if path in changed_paths}
    new = list(installed(reading, ["prometheus-node-exporter"]))
    commands += new
    home = list(collector_home(reading))
    commands += home
    for unit in units:
        why = "its unit file changed" if unit in changed else None
        if new and unit == UNITS["node_exporter"]:
            why = "its package is new"
        if home and unit in (UNITS["collector"], UNITS["answers"]) and why is None:
            why = "its user or directory changed"
        commands += running(unit, service(reading, unit), why)
    if not commands:
        host.noop(f"the node exporter listens on {settings.rails[0]['address']}:{settings.exporter_port}, and the collector runs")
    yield from commands


def alertmanager_shown(wanted: str, reading: dict) -> None:
    """The diff of alertmanager.yml, each webhook URL cut after its host on both sides (the rest may
    be a token); a change past a host, or of the file's owner or mode only, said in a line."""
    info = reading["files"]["files"].get(ALERTMANAGER_CONFIG)
    current = reading["shown"] if info is not None and info["kind"] == "file" else None
    if current is None or current != shown(wanted).splitlines():
        show_diff(ALERTMANAGER_CONFIG, current, shown(wanted))
    elif info["sha256"] != get_file_sha256(BytesIO(wanted.encode())):
        show_line(f"Will modify {ALERTMANAGER_CONFIG}: a webhook URL changed past its host (not shown: it may hold a token)")
    else:
        show_line(f"Will set {ALERTMANAGER_CONFIG} to {ALERTMANAGER_OWNER}, mode {ALERTMANAGER_MODE} (now {info['owner']}, mode {info['mode']})")


@operation()
def alertmanager_running(settings: ObservabilitySettings):
    """
    On the head: the OS's Alertmanager on loopback, its cluster listener off, sending the alerts
    of the head's Prometheus to the site's webhooks (none named: they stay on the head). Its
    configuration (root's, readable by the daemon's group alone: a webhook's URL may hold a token)
    is staged where only root reads it and checked by the real `amtool check-config` before it is
    installed; its diff shows each URL to its host only. A new configuration is reloaded, a new
    drop-in restarts it.

    + settings: the head's observability settings (``observability_settings``)

    **Example:**

    .. code:: python

        alertmanager_running(settings=observability_settings(cluster, host.name))
    """
    if not acts_here("head"):
        return
    reading = read(host, AlertmanagerState)
    files = reading["files"]["files"]
    dropin, config = UNIT_FILES["alertmanager"], settings.files[ALERTMANAGER_CONFIG]
    commands, dropin_changed = units_put({dropin: settings.files[dropin]}, files)
    changed = differs(config, files.get(ALERTMANAGER_CONFIG), ALERTMANAGER_MODE, ALERTMANAGER_OWNER)
    if changed:
        alertmanager_shown(config, reading)
        commands += staged({ALERTMANAGER_CONFIG: config}, ALERTMANAGER_STAGING, private=True)
    new = list(installed(reading, [PACKAGE]))
    commands += new
    if changed:
        commands.append(StringCommand("amtool", "check-config", f"{ALERTMANAGER_STAGING}/{posixpath.basename(ALERTMANAGER_CONFIG)}"))
        commands.append(from_staging([ALERTMANAGER_CONFIG], ALERTMANAGER_STAGING, PROMETHEUS_DIR, ALERTMANAGER_MODE, ALERTMANAGER_OWNER))
    unit = UNITS["alertmanager"]
    why = "its drop-in changed" if dropin_changed else "its package is new" if new else None
    served, _ = restarted_or_reloaded(unit, service(reading, unit), why, "its configuration changed" if changed else None)
    commands += served
    if not commands:
        where = f"{settings.webhooks} webhook(s)" if settings.webhooks else "no receiver: the alerts stay on the head"
        host.noop(f"Alertmanager listens on 127.0.0.1:{settings.alertmanager_port}, its configuration up to date ({where})")
    yield from commands


def ready(settings: ObservabilitySettings, what: str) -> StringCommand:
    """Wait up to READY_WAIT seconds for Prometheus's /-/ready, failing saying where to look."""
    return StringCommand("python3", QuoteString(settings.programs), "metrics", "ready", "--url",
                         f"http://127.0.0.1:{settings.prometheus_port}", "--wait", str(READY_WAIT), "--after", QuoteString(what))


@operation()
def prometheus_running(settings: ObservabilitySettings):
    """
    On the head: the OS's Prometheus on loopback, with bounded retention (days and GiB), scraping
    vLLM and every node's exporter, with the deploy's recording and alert rules. Its configuration
    is staged and checked by the real `promtool check config` (the rules with it) before it is
    installed; a new configuration is reloaded, a new drop-in (port, retention) restarts it.

    + settings: the head's observability settings (``observability_settings``)

    **Example:**

    .. code:: python

        prometheus_running(settings=observability_settings(cluster, host.name))
    """
    if not acts_here("head"):
        return
    reading = read(host, ObservabilityState, **reading_arguments(settings))
    files = reading["files"]["files"]
    dropin = UNIT_FILES["prometheus"]
    configs = {f"{PROMETHEUS_DIR}/{name}": settings.files[f"{PROMETHEUS_DIR}/{name}"] for name in CONFIG_FILES}
    commands, dropin_changed = units_put({dropin: settings.files[dropin]}, files)
    config_changed = [path for path, text in configs.items() if differs(text, files.get(path))]
    for path in config_changed:
        show_changed(path, configs[path], files.get(path), "the deploy's rules" if path.endswith(RULES) else None,
                     settings.show_program_diffs)
    if config_changed:
        commands += staged(configs, STAGING)  # promtool checks the configuration with the rules it names
    new = list(installed(reading, ["prometheus"]))
    commands += new
    if config_changed:
        commands.append(StringCommand("promtool", "check", "config", f"{STAGING}/prometheus.yml"))
        commands.append(from_staging(list(configs), STAGING, PROMETHEUS_DIR))
    unit = UNITS["prometheus"]
    state = service(reading, unit)
    why = "its drop-in changed" if dropin_changed else "its package is new" if new else None
    served, restarts = restarted_or_reloaded(unit, state, why, "its configuration changed" if config_changed else None)
    commands += served
    if restarts or any(command.get_raw_value().startswith("systemctl reload") for command in served):
        commands.append(ready(settings, "its start" if restarts else "its reload"))
    if not commands:
        host.noop(f"Prometheus listens on 127.0.0.1:{settings.prometheus_port}, its configuration and rules up to date")
    yield from commands


@operation()
def grafana_running(settings: ObservabilitySettings):
    """
    On the head, when the site names a Grafana image (by digest): Grafana on loopback, anonymous
    viewers only, with the Prometheus datasource and the deploy's dashboards provisioned read-only,
    as a compose stack in ``stack_dir``/grafana checked by the real `docker compose config` before
    it is installed; started (the image pulled by digest) when its files changed or it is not running.

    + settings: the head's observability settings (``observability_settings``)

    **Example:**

    .. code:: python

        grafana_running(settings=observability_settings(cluster, host.name))
    """
    if not acts_here("head"):
        return
    if not settings.grafana_image:
        host.noop("no Grafana in this site (grafana_image is empty)")
        return
    reading = read(host, ObservabilityState, **reading_arguments(settings))
    current = (reading["grafana"] or {"files": {"files": {}}})["files"]["files"]
    wanted = {path: text for path, text in settings.files.items() if path.startswith(settings.grafana_dir + "/")}
    changed = [path for path, text in wanted.items() if differs(text, current.get(path))]
    commands = []
    if changed:
        for path in changed:
            show_changed(path, wanted[path], current.get(path), "a dashboard" if path.endswith(".json") else None,
                         settings.show_program_diffs)
        folders = sorted({posixpath.dirname(GRAFANA_STAGING + path[len(settings.grafana_dir):]) for path in wanted})
        commands.append(StringCommand("rm", "-rf", GRAFANA_STAGING, "&&", "mkdir", "-p", *folders))
        for path, text in wanted.items():
            staged = GRAFANA_STAGING + path[len(settings.grafana_dir):]
            commands += upload(BytesIO(text.encode()), staged)
        commands.append(StringCommand("docker", "compose", "-f", f"{GRAFANA_STAGING}/compose.yaml", "config", "-q"))
        commands.append(StringCommand(claimed(settings.programs, settings.stack_dir, "stack_dir"), "&&", "rm", "-rf", QuoteString(settings.grafana_dir), "&&",
                                      "cp", "-r", GRAFANA_STAGING, QuoteString(settings.grafana_dir), "&&", "chmod", "-R", "go-w,a+rX",
                                      QuoteString(settings.grafana_dir), "&&", "rm", "-rf", GRAFANA_STAGING))
    if changed or reading["grafana"] is None or reading["grafana"]["container"] != "running":
        show_line(f"Will start Grafana ({settings.grafana_image}) on 127.0.0.1:{settings.grafana_port}"
                  + (": its files changed" if changed else ": it is not running"))
        commands.append(StringCommand("docker", "compose", "--project-directory", QuoteString(settings.grafana_dir), "-f",
                                      QuoteString(f"{settings.grafana_dir}/compose.yaml"), "up", "-d", "--remove-orphans"))
    if not commands:
        host.noop(f"Grafana runs on 127.0.0.1:{settings.grafana_port} with the dashboards up to date")
    yield from commands


def dashboards() -> dict[str, dict]:
    """The dashboards, by file name."""
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}
