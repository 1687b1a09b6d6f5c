"""Rules for `tasks/status.py`: the serving cluster at a glance. Each bad row names the fix; the
node that fails shows the last lines of its log."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from urllib.parse import urlsplit

from checks import FAIL, PASS, WARN, Check
from checks.fabric import link_check, roce_check
from checks.node import NVML_FIXES
from cluster import HEAL_FACTOR, Cluster, Profile
from layout import CONTAINER, HEALTH_INTERVAL
from states import described

LOGS = f"docker logs --tail 100 {CONTAINER}"
UP = ("serving", "busy", "joined")  # the watchdog states of a side that serves
HEALS = "the watchdogs restart the cluster on their own (workers first); if it persists, run the deploy"
SERVING_ROWS = ("vLLM container", "watchdog", "API", "front door")  # what a planned restart or a heal takes down for a while


def status_checks(name: str, cluster: Cluster, readings: dict[str, dict | None], excused: bool = True) -> list[Check]:
    """One node's rows; ``readings`` every node's reading by name in rank order, the head first
    (None for a node that does not answer). ``excused``: serving rows down for planned work or a
    heal in its time are warnings (``expected``)."""
    mine = readings[name]
    head = next(iter(readings.values()))
    generating = bool(head and (head["api"] or {}).get("ok"))  # then a watchdog still "waiting" has not looked yet
    node = cluster.node(name)
    checks = [container_row(name, mine, generating), watchdog_row(name, node.role, mine, head, generating)]
    if node.role == "head":
        workers = {other: reading for other, reading in readings.items() if other != name}
        checks += api_rows(name, mine, workers, cluster.profiles[mine_profile(mine, cluster)])
        checks.append(door_row(name, cluster, mine["door"]))
        checks += record_rows(name, mine)
        checks.append(canary_row(name, cluster, mine["records"]["served"]))
        if mine.get("prometheus") is not None:
            checks += prometheus_rows(name, mine["prometheus"])
            checks.append(delivery_row(name, cluster))
    if excused:
        checks = expected(checks, readings, cluster)
    checks.append(memory_row(name, mine["memory"]))
    configured = {rail["netdev"] for rail in node.rail_data}
    rdma = mine["rdma"]["devices"]
    for index, rail in enumerate(node.rail_data):
        label = f"rail {index} {rail['netdev']}"
        link = mine["links"]["links"].get(rail["netdev"])
        if link is None:
            checks.append(Check(name, f"{label} link", FAIL, "no such netdev", "set the rail's netdev in site.toml (ip -br link)"))
            continue
        checks += [link_check(name, label, cluster, rail, link, rdma, configured), roce_check(name, index, rail["netdev"], rail, rdma)]
    return checks


def expected(checks: list[Check], readings: dict[str, dict | None], cluster: Cluster) -> list[Check]:
    """The serving rows that fail while serving is down on purpose or for a while it is expected
    to be, as warnings that say so: a deploy run's planned work (the mark the head's stop wrote),
    or a heal within its expected time (the head's container up for less than HEAL_FACTOR times
    the last start that served, plus heal_margin_seconds, while no node is in a loop of starts
    that never serve)."""
    head = next(iter(readings.values()))
    looping = any(((reading["watchdog"] or {}).get("starts") or {}).get("failed_starts", 0) >= 2 for reading in readings.values() if reading)
    why = planned_work(head) or (None if looping else healing(head, cluster))
    if why is None:
        return checks
    return [replace(check, status=WARN, detail=f"{why}: {check.detail}") if check.status == FAIL and check.item in SERVING_ROWS else check
            for check in checks]


def planned_work(head: dict | None) -> str | None:
    work = ((head or {}).get("watchdog") or {}).get("planned")
    if not work or not work.get("in_force"):
        return None
    return f"planned work ({work['what']}, for {work['age_seconds']} s)"


def healing(head: dict | None, cluster: Cluster) -> str | None:
    if not head or (head["api"] or {}).get("ok") or not head["container"] or head["container"]["status"] != "running":
        return None
    took = ((head["watchdog"] or {}).get("starts") or {}).get("last_start_seconds")
    up = seconds_between(head["container"]["started"], head["now"])
    if not isinstance(took, (int, float)) or up is None:
        return None
    bound = HEAL_FACTOR * took + cluster.settings.heal_margin_seconds
    return f"a heal within its expected time (the head up {up} s of {bound:.0f} s: its last start took {took:.0f} s)" if up <= bound else None


def mine_profile(reading: dict, cluster: Cluster) -> str:
    """The profile the container runs (its label), else the configured one."""
    running = (reading["container"] or {}).get("profile")
    return running if running in cluster.profiles else cluster.profile_name


def seconds_between(since: str, now: str | None) -> int | None:
    """Whole seconds between two of Docker's RFC 3339 times (nanoseconds and all); None if unknown."""
    def parse(text: str) -> datetime:
        return datetime.fromisoformat(text[:19] + "+00:00")

    try:
        seconds = int((parse(now) - parse(since)).total_seconds()) if now else None
    except ValueError:
        return None
    return seconds if seconds is not None and seconds >= 0 else None


def uptime(since: str, now: str | None) -> str:
    """'3h 12m' between two of Docker's RFC 3339 times."""
    seconds = seconds_between(since, now)
    if seconds is None:
        return f"since {since[:19]}Z"
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    parts = [f"{days}d"] * bool(days) + [f"{hours}h"] * bool(hours or days) + [f"{minutes}m"] * bool(minutes or hours or days)
    return "up " + " ".join(parts or [f"{seconds}s"])


def container_row(name: str, reading: dict, generating: bool) -> Check:
    container = reading["container"]
    if container is None:
        return Check(name, "vLLM container", FAIL, "none", "run the deploy: it starts the workers, then the head")
    restarts = f"{container['restarts']} restart{'s' * (container['restarts'] != 1)}"
    what = f"image {container['image'][:19]}, profile {container['profile']}, {restarts}"
    if container["status"] != "running":
        remedy = HEALS if container["status"] == "restarting" else \
            "it was stopped, so Docker leaves it (it restarts only what failed): run the deploy, which starts the workers, then the head"
        return Check(name, "vLLM container", FAIL, f"{container['status']} (exit code {container['exit_code']}, "
                     f"at {container['finished'][:19]}Z), {what}", f"`{LOGS}` on {name}; {remedy}", tuple(reading["log"]))
    health = container["health"] or "no health check"
    detail = f"running, {uptime(container['started'], reading['now'])}, {health}, {what}"
    joined = (reading["watchdog"]["live"] or {}).get("state") in UP
    if health == "unhealthy" and joined and generating:
        return Check(name, "vLLM container", WARN, detail + ": Docker's checks failed while it started, and it serves now",
                     f"its next health check (every {HEALTH_INTERVAL} s) clears it; if it stays, see the watchdog row")
    if health == "unhealthy":
        return Check(name, "vLLM container", FAIL, detail, f"`{LOGS}` on {name}; " + HEALS, tuple(reading["log"]))
    return Check(name, "vLLM container", WARN if health == "starting" and not (joined or generating) else PASS, detail)


def watchdog_row(name: str, role: str, reading: dict, head: dict | None, generating: bool) -> Check:
    live, starts = reading["watchdog"]["live"], reading["watchdog"]["starts"] or {}
    log = tuple(reading["log"])
    failed = starts.get("failed_starts", 0)
    if failed and not generating and not (live and live["state"] in UP):
        return Check(name, "watchdog", FAIL, f"this side failed to come up {failed} time(s) in a row; it now waits "
                     "longer before each start (10 s, doubling, at most 5 min)", f"its log below says why; `{LOGS}` on {name}", log)
    if live is None:
        down = reading["container"] is None or reading["container"]["status"] != "running"
        return Check(name, "watchdog", FAIL if down else WARN, "no answer on the fabric" + (" (the container is down)" * down),
                     "see the vLLM container row" if down else f"the container may be starting; `{LOGS}` on {name}")
    if role == "head":
        detail = f"session {live['session'][:8]}, {live['state']}"
        if live["state"] == "serving":
            return Check(name, "watchdog", PASS, detail)
        if live["state"] == "busy":
            return Check(name, "watchdog", PASS, detail + ": its probe waited behind a long request, and the engine works")
        if live["state"] == "failing":
            return Check(name, "watchdog", FAIL, detail + ": its last token probe failed; a second failure restarts the head",
                         "see the workers' rows: the head fails when a worker is gone", log)
        if generating:
            return Check(name, "watchdog", PASS, detail + ": the API already generates; its first probe is due")
        doing = "vLLM is loading" if live["state"] == "loading" else "it waits for every worker to be fresh, then starts vLLM"
        return Check(name, "watchdog", WARN, f"{detail}: {doing}", "wait for the first token; the API row says when it serves")
    head_live = (head or {}).get("watchdog", {}).get("live")
    if live["state"] != "joined":
        if generating:
            return Check(name, "watchdog", PASS, f"{live['state']}: the cluster already generates; it records the session within seconds")
        return Check(name, "watchdog", WARN, f"{live['state']}: not yet part of a head session",
                     "it joins when the head starts vLLM; see the head's rows")
    if head_live and head_live["session"] != live["joined"]:
        return Check(name, "watchdog", FAIL, f"joined session {live['joined'][:8]}, but the head runs {head_live['session'][:8]}",
                     "this worker ends itself within seconds and rejoins; " + HEALS, log)
    return Check(name, "watchdog", PASS, f"joined the head's session {live['joined'][:8]}"
                 + ("" if head_live else " (the head's watchdog was not read)"))


def api_rows(name: str, head: dict, workers: dict[str, dict | None], profile: Profile) -> list[Check]:
    api = head["api"] or {"ok": False, "error": "no probe ran", "metrics": None}
    metrics = api.get("metrics") or {}
    if api["ok"]:
        load = f", {metrics['running']} running / {metrics['waiting']} waiting" if metrics.get("running") is not None else ""
        checks = [Check(name, "API", PASS, f"generates tokens as {api['model']}, max model len {api['max_model_len']}{load}")]
    else:
        checks = [Check(name, "API", FAIL, api.get("error") or "no token generated", failing_side(head, workers))]
    spec = metrics.get("spec")
    if not profile.speculative_tokens:
        checks.append(Check(name, "speculative decoding", PASS, "off in this profile"))
    elif spec is None:
        checks.append(Check(name, "speculative decoding", WARN, "no counters in /metrics",
                            "the API does not answer /metrics yet; see the API row"))
    elif not spec["drafts"]:
        checks.append(Check(name, "speculative decoding", PASS, "no drafts since the start (no requests yet)"))
    else:
        rate = spec["accepted"] / spec["draft_tokens"] if spec["draft_tokens"] else 0.0
        checks.append(Check(name, "speculative decoding", PASS,
                            f"{rate:.0%} of draft tokens accepted since the start ({spec['accepted']:,} of {spec['draft_tokens']:,}), "
                            f"mean acceptance length {1 + spec['accepted'] / spec['drafts']:.2f}"))
    return checks


def door_row(name: str, cluster: Cluster, door: dict | None) -> Check:
    """The front door: where clients reach it, and its view of vLLM (drained only during a change)."""
    where = f"{cluster.settings.api_host}:{cluster.settings.api_port}"
    if not door or not door["ok"]:
        return Check(name, "front door", FAIL, (door or {}).get("error", "not read"),
                     f"clients reach nothing at {where}: `systemctl status haproxy` on the head, then run the deploy (tasks/door.py)")
    longest = door.get("held_longest_seconds")
    holding = f"{door['held']:.0f} held" + (f" (the oldest {longest:.0f} s)" if longest is not None else "") + ", " if door.get("held") else ""
    counts = f"{holding}{door['in_flight']} in flight, {door['requests']} sent to vLLM, {door['retried']} tried again since it started"
    if "MAINT" in door["status"]:
        return Check(name, "front door", FAIL, f"vLLM is in maintenance at the door: requests wait ({counts})",
                     "`sudo systemctl reload haproxy` on the head: a reload starts with vLLM ready")
    if "DRAIN" in door["status"]:
        return Check(name, "front door", WARN, f"vLLM drained for a change: new requests wait until it serves and passes its canaries ({counts})",
                     "a change is under way; if none runs: `sudo systemctl reload haproxy` on the head (the door also opens by itself "
                     "once the change's time has lapsed)")
    if "DOWN" in door["health"]:
        return Check(name, "front door", WARN, f"vLLM is down at the door's health check: new requests wait ({counts})",
                     "see the vLLM container and API rows: the door serves them once vLLM does")
    return Check(name, "front door", PASS, f"answers at {where}: {counts}")


def record_rows(name: str, head: dict) -> list[Check]:
    """The state that serves and the one tasks/rollback.py returns to, as the head records them."""
    served, before = head["records"]["served"], head["records"]["rollback"]
    running = (head["container"] or {}).get("stack")
    rollback = "`pyinfra inventory.py tasks/rollback.py` returns to it"
    if served is None:
        return [Check(name, "serving state", WARN, "none recorded yet", "the next deploy records it once the head generates a token"),
                Check(name, "rollback state", PASS, "none recorded yet")]
    if served["stack"] == running:
        back = Check(name, "rollback state", PASS, f"{described(before)}: {rollback}" if before else
                     "none recorded yet: after a change that serves, tasks/rollback.py returns to the state before it")
        return [Check(name, "serving state", PASS, described(served)), back]
    return [Check(name, "serving state", WARN, f"the head runs stack {running or 'none'}, not the one recorded as serving",
                  "a change is under way, or one failed and was left in place: the rollback state row says where tasks/rollback.py returns"),
            Check(name, "rollback state", PASS, f"{described(served)}: {rollback}")]


def canary_row(name: str, cluster: Cluster, served: dict | None) -> Check:
    """What the canaries said of the state that serves, as recorded with it (files/dual_spark/stack.py)."""
    if not cluster.settings.canaries or not cluster.canaries:
        return Check(name, "canaries", PASS, "none run: a change is kept once it serves a token (canaries = false, or no [canary.NAME])")
    found = (served or {}).get("canaries")
    if not (isinstance(found, dict) and isinstance(found.get("passed"), list) and found["passed"]):
        return Check(name, "canaries", WARN, "none recorded with the state that serves",
                     "it served before the deploy ran canaries, or was recorded without them: the next change runs them")
    passed = ", ".join(str(canary) for canary in found["passed"])
    return Check(name, "canaries", PASS, f"{len(found['passed'])} passed on this state ({passed}) at {found.get('when')}")


def failing_side(head: dict, workers: dict[str, dict | None]) -> str:
    """Which node to look at when the head generates nothing: the workers that do not answer,
    then those whose container is down, in rank order."""
    def down(reading: dict | None) -> bool:
        return reading is None or reading["container"] is None or reading["container"]["status"] != "running"

    def names(found: list[str]) -> str:
        return ", ".join(found)

    if gone := [name for name, reading in workers.items() if reading is None]:
        them = "it" if len(gone) == 1 else "them"
        return f"{names(gone)} {'does' if len(gone) == 1 else 'do'} not answer over SSH: power {them} on; " + HEALS
    if stopped := [name for name, reading in workers.items() if down(reading)]:
        if len(stopped) == 1:
            return f"{stopped[0]}'s container is down: see its rows"
        return f"the containers of workers {names(stopped)} are down: see their rows"
    if down(head):
        return "the head's container is down: see its rows"
    live = head["watchdog"]["live"] or {}
    if live.get("state") in ("waiting", "loading"):
        return (f"the cluster is starting (the head's container {uptime(head['container']['started'], head['now'])}): "
                "it serves once vLLM has loaded; run the status again in a minute")
    every = "both" if len(workers) == 1 else "all"
    return f"{every} containers run: `{LOGS}` on {every} nodes says why; " + HEALS


def memory_row(name: str, memory: dict) -> Check:
    state = memory["nvidia_smi"]
    if state not in ("ok", "absent"):
        fix = next((text for key, text in NVML_FIXES.items() if key in state), "run `nvidia-smi` on the node")
        return Check(name, "GPU memory", FAIL, f"nvidia-smi: {state}", fix)
    used = memory["total_gib"] - memory["available_gib"]
    source = memory["source"] + (f", {', '.join(memory['gpus'])}" if memory["gpus"] else "")
    return Check(name, "GPU memory", PASS, f"{used:.1f} of {memory['total_gib']} GiB in use ({source})")


# The recording rules (templates/observability/recording.yml.j2) the status shows, and how.
RATES = [
    ("dual_spark:decode_tokens_per_second:per_stream", "decode {:.1f} tok/s per stream"),
    ("dual_spark:generation_tokens_per_second:aggregate", "{:.1f} tok/s in all"),
    ("dual_spark:time_to_first_token_seconds:mean", "TTFT {:.2f} s"),
    ("dual_spark:time_to_first_token_seconds:p95", "(p95 {:.2f} s)"),
    ("dual_spark:requests_waiting", "{:.1f} waiting"),
    ("dual_spark:kv_cache_usage:ratio", "KV cache {:.0%} in use"),
    ("dual_spark:preemptions_per_second", "{:.2f} preemptions/s"),
    ("dual_spark:spec_decode_acceptance:ratio", "{:.0%} of draft tokens accepted"),
    ("dual_spark:spec_decode_acceptance_length:mean", "{:.2f} tokens per step"),
]
PROMETHEUS_FIX = ("the deploy starts it (tasks/observability.py); `systemctl status prometheus` and `journalctl -u prometheus` "
                  "on the head say why it stopped")


def prometheus_rows(name: str, prometheus: dict) -> list[Check]:
    """The head's Prometheus: the last five minutes of the recording rules, and the alerts pending
    or firing (a critical one firing fails the status); DualSparkHeartbeat (severity none) is no trouble."""
    if not prometheus.get("ok"):
        return [Check(name, "metrics (Prometheus)", WARN, prometheus.get("error") or "Prometheus did not answer", PROMETHEUS_FIX)]
    means: dict[str, float] = {}
    for series in prometheus["series"]:
        if series.get("mean") is not None and series["name"] not in means:
            means[series["name"]] = series["mean"]
    minutes = round(prometheus.get("window_seconds", 300) / 60)
    parts = [text.format(means[rule]) for rule, text in RATES if rule in means]
    detail = ", ".join(parts).replace(", (p95", " (p95") if parts else "no request in that time"
    checks = [Check(name, f"metrics (last {minutes} min)", PASS, detail)]
    trouble = [alert for alert in prometheus["alerts"] if alert["labels"].get("severity") != "none"]  # not the heartbeat
    firing = [alert for alert in trouble if alert["state"] == "firing"]
    pending = [alert for alert in trouble if alert["state"] == "pending"]
    if not firing:
        checks.append(Check(name, "alerts", PASS, "none firing" + (f"; pending: {alert_names(pending)}" if pending else "")))
    else:
        critical = any(alert["labels"].get("severity") == "critical" for alert in firing)
        checks.append(Check(name, "alerts", FAIL if critical else WARN, f"firing: {alert_names(firing)}",
                            "each names what to look at (Prometheus's /alerts page through the tunnel: docs/observability.md)",
                            tuple(alert["summary"] for alert in firing if alert.get("summary"))))
    return checks


def alert_names(alerts: list[dict]) -> str:
    return ", ".join(f"{alert['name']} ({alert['labels']['node']})" if alert["labels"].get("node") else alert["name"] for alert in alerts)


def delivery_row(name: str, cluster: Cluster) -> Check:
    """Where the alerts go: the site's webhooks (each shown to its host: the rest may be a token), or
    nowhere beyond the head, which no one hears."""
    settings = cluster.settings
    if not settings.alert_webhooks:
        return Check(name, "alert delivery", WARN, "no receiver: the alerts stay on the head (Prometheus's /alerts and "
                     f"Alertmanager on 127.0.0.1:{settings.alertmanager_port}, through the tunnel)",
                     "name a webhook in alert_webhooks under [settings] (docs/observability.md#delivery)")
    hosts = sorted({urlsplit(url).netloc for url in settings.alert_webhooks})
    return Check(name, "alert delivery", PASS, f"Alertmanager sends to {len(settings.alert_webhooks)} webhook(s) at {', '.join(hosts)}, "
                 "with a heartbeat that always fires")
