"""The status rules as pure functions of ServingStatus readings: which side a failure names, what
the uptime and acceptance rows say, and that a failing side brings its log lines."""

from datetime import datetime, timedelta

import pytest

from checks import FAIL, PASS, WARN
from checks.status import status_checks, uptime
from checks.table import render
from tests.fake_host import site
from tests.test_checks import healthy, ok

PROFILES = {"adaptive": {"speculative_tokens": 3}, "fast": {"speculative_tokens": 0}}


def cluster(size: int):
    """The pair, or four nodes (spark-head, spark-worker, spark-3, spark-4); rail i of rank r at
    10.0.i.(r+1) as tests.test_checks.healthy reads it; profile adaptive drafting 3 tokens, fast none."""
    return site("pair" if size == 2 else "four-grown", tables={"profile": PROFILES})


SESSION = "9f2c41d0" + "0" * 24
MODEL = {"repo": "org/model", "revision": "ab" * 20}
SERVED = {"cluster": "c1", "stack": "9d2e", "profile": "adaptive", "image": "dual-spark/x:1", "image_id": "sha256:" + "5e" * 32,
          "model": MODEL, "model_digest": "e8" * 6, "since": "2026-11-29T20:03:40Z",
          "canaries": {"passed": ["code", "fabric", "long"], "when": "2026-11-29T20:05:12Z"}}
BEFORE = {**SERVED, "cluster": "c0", "stack": "77aa", "profile": "fast", "since": "2026-11-28T10:00:00Z"}
DOOR = {"ok": True, "status": "no check", "health": "UP", "in_flight": 1, "requests": 212, "retried": 3, "connection_errors": 0, "response_errors": 0}
LOG = ["RuntimeError: NCCL error: unhandled system error", "Engine core initialization failed."]


def reading(role: str, state: str = "running", health: str = "healthy", live: dict | None = None, **changes) -> dict:
    base = healthy()
    live = live if live is not None else (
        {"role": "head", "session": SESSION, "state": "serving", "joined": None} if role == "head" else
        {"role": "worker", "session": "77" * 16, "state": "joined", "joined": SESSION})
    value = {
        "now": "2026-11-29T23:15:10Z",
        "container": {"id": "4f1c", "status": state, "started": "2026-11-29T20:01:02.512873Z", "restarts": 2, "stack": "9d2e",
                      "profile": "adaptive", "image": "sha256:" + "5e" * 32, "health": health if state == "running" else "",
                      "exit_code": 0 if state == "running" else 137, "finished": "2026-11-29T23:14:58.1Z"},
        "watchdog": ok(live=live, starts={"failed_starts": 0, "healthy": True}),
        "log": LOG, "memory": base["memory"], "links": base["links"], "rdma": base["rdma"], "unreadable": [],
        "records": {"served": SERVED, "rollback": BEFORE},
        "api": ({"ok": True, "model": "tiny", "max_model_len": 512, "error": None,
                 "metrics": {"spec": {"drafts": 400, "draft_tokens": 1200, "accepted": 750}, "running": 1, "waiting": 0}}
                if role == "head" else None),
        "door": DOOR if role == "head" else None,
    }
    return {**value, **changes}


def rows(head: dict, *workers: dict | None) -> dict:
    """Every answering node's rows by (node, item): the head, then spark-worker, spark-3, ..."""
    names = ["spark-head", "spark-worker", *(f"spark-{rank + 1}" for rank in range(2, len(workers) + 1))]
    readings = {name: reading and {**reading, "links": healthy(rank)["links"], "rdma": healthy(rank)["rdma"]}
                for rank, (name, reading) in enumerate(zip(names, (head, *workers)))}
    nodes = cluster(len(readings))
    checks = [check for name, reading in readings.items() if reading is not None for check in status_checks(name, nodes, readings)]
    return {(c.node, c.item): c for c in checks}


@pytest.mark.parametrize("served, status, detail", [
    ({k: v for k, v in SERVED.items() if k != "canaries"}, WARN, "none recorded with the state that serves"),
    ({**SERVED, "canaries": {"passed": [], "when": "x"}}, WARN, "none recorded with the state that serves"),
    ({**SERVED, "canaries": "all"}, WARN, "none recorded with the state that serves"),
], ids=["recorded without them", "none passed", "not a record"])
def test_a_state_recorded_without_passing_canaries_is_a_warning(served, status, detail):
    found = rows(reading("head", records={"served": served, "rollback": BEFORE}), reading("worker"))["spark-head", "canaries"]
    assert (found.status, found.detail) == (status, detail)


def test_a_serving_pair_passes_with_uptime_acceptance_and_load():
    found = rows(reading("head"), reading("worker"))
    assert all(check.status == PASS for check in found.values()), render(list(found.values()))
    container = found["spark-head", "vLLM container"].detail
    assert "up 3h 14m" in container and "2 restarts" in container and "profile adaptive" in container
    assert "sha256:5e5e5e5e5e5e" in container
    assert found["spark-head", "speculative decoding"].detail.startswith("62% of draft tokens accepted")
    assert "mean acceptance length 2.88" in found["spark-head", "speculative decoding"].detail
    assert found["spark-head", "API"].detail == "generates tokens as tiny, max model len 512, 1 running / 0 waiting"
    assert found["spark-worker", "watchdog"].detail == "joined the head's session 9f2c41d0"
    assert found["spark-head", "canaries"].detail == "3 passed on this state (code, fabric, long) at 2026-11-29T20:05:12Z"
    assert ("spark-worker", "API") not in found
    assert found["spark-worker", "rail 1 enP2p1s0f0np0 link"].status == PASS


def test_a_dead_worker_is_named_as_the_failing_side_with_its_log():
    worker = reading("worker", state="restarting", watchdog=ok(live=None, starts={"failed_starts": 3, "healthy": False}))
    head = reading("head", api={"ok": False, "model": None, "max_model_len": None, "error": "generating one token failed with 500",
                                "metrics": None},
                   watchdog=ok(live={"role": "head", "session": SESSION, "state": "failing", "joined": None}, starts=None))
    found = rows(head, worker)
    assert found["spark-head", "API"].status == FAIL
    assert found["spark-head", "API"].fix == "spark-worker's container is down: see its rows"
    assert "the watchdogs restart the cluster on their own" in found["spark-worker", "vLLM container"].fix
    dead = found["spark-worker", "vLLM container"]
    assert dead.status == FAIL and "restarting (exit code 137" in dead.detail and dead.lines == tuple(LOG)
    assert found["spark-worker", "watchdog"].status == FAIL and "3 time(s) in a row" in found["spark-worker", "watchdog"].detail
    assert found["spark-head", "watchdog"].status == FAIL
    text = render(list(found.values()), "status")
    assert "| RuntimeError: NCCL error" in text and "status: " in text


def test_a_stopped_container_is_left_by_docker_and_the_fix_says_deploy():
    worker = reading("worker", state="exited", watchdog=ok(live=None, starts=None))
    check = rows(reading("head"), worker)["spark-worker", "vLLM container"]
    assert check.status == FAIL and "run the deploy, which starts the workers, then the head" in check.fix


def test_a_worker_left_in_an_old_session_fails_until_it_rejoins():
    worker = reading("worker", live={"role": "worker", "session": "77" * 16, "state": "joined", "joined": "0ld5e55" + "0" * 25})
    check = rows(reading("head"), worker)["spark-worker", "watchdog"]
    assert check.status == FAIL and "but the head runs 9f2c41d0" in check.detail


def test_a_starting_pair_warns_and_an_unanswering_worker_is_said():
    head = reading("head", health="starting", live={"role": "head", "session": SESSION, "state": "waiting", "joined": None},
                   api={"ok": False, "model": None, "max_model_len": None, "error": "no answer at http://127.0.0.1:8888", "metrics": None})
    found = rows(head, None)
    assert found["spark-head", "vLLM container"].status == WARN and found["spark-head", "watchdog"].status == WARN
    assert "spark-worker does not answer over SSH" in found["spark-head", "API"].fix
    assert found["spark-head", "speculative decoding"].status == WARN


def test_a_profile_without_speculation_says_so():
    head = reading("head")
    head["container"]["profile"] = "fast"
    assert rows(head, reading("worker"))["spark-head", "speculative decoding"].detail == "off in this profile"


def test_uptime_reads_dockers_times():
    assert uptime("2026-11-29T20:01:02.512873Z", "2026-11-29T20:01:40Z") == "up 38s"
    assert uptime("2026-11-27T20:01:02Z", "2026-11-29T21:03:02Z") == "up 2d 1h 2m"
    assert uptime("2026-11-29T20:01:02Z", None) == "since 2026-11-29T20:01:02Z"


def test_a_pair_that_generates_passes_while_its_watchdogs_have_not_looked_yet():
    head = reading("head", health="starting", live={"role": "head", "session": SESSION, "state": "waiting", "joined": None})
    worker = reading("worker", health="starting", live={"role": "worker", "session": "77" * 16, "state": "waiting", "joined": None})
    found = rows(head, worker)
    for node in ("spark-head", "spark-worker"):
        assert found[node, "vLLM container"].status == PASS and found[node, "watchdog"].status == PASS


def test_a_busy_head_passes():
    head = reading("head", live={"role": "head", "session": SESSION, "state": "busy", "joined": None})
    check = rows(head, reading("worker"))["spark-head", "watchdog"]
    assert check.status == PASS and "waited behind a long request" in check.detail


def test_four_nodes_list_every_node_in_rank_order_and_name_the_failing_workers():
    dead = reading("worker", state="exited", watchdog=ok(live=None, starts=None))
    head = reading("head", api={"ok": False, "model": None, "max_model_len": None, "error": "generating one token failed with 500",
                                "metrics": None})
    found = rows(head, reading("worker"), dead, dead)
    assert list(dict.fromkeys(node for node, _ in found)) == ["spark-head", "spark-worker", "spark-3", "spark-4"]
    assert found["spark-head", "API"].fix == "the containers of workers spark-3, spark-4 are down: see their rows"
    assert found["spark-worker", "watchdog"].status == PASS and found["spark-3", "vLLM container"].status == FAIL
    assert "spark-3 does not answer over SSH: power it on" in rows(head, reading("worker"), None, dead)["spark-head", "API"].fix
    assert "spark-3, spark-4 do not answer over SSH: power them on" in rows(head, reading("worker"), None, None)["spark-head", "API"].fix


def test_a_worker_of_four_in_an_old_session_fails_alone():
    old = reading("worker", live={"role": "worker", "session": "77" * 16, "state": "joined", "joined": "0ld5e55" + "0" * 25})
    found = rows(reading("head"), reading("worker"), reading("worker"), old)
    assert found["spark-4", "watchdog"].status == FAIL and "but the head runs 9f2c41d0" in found["spark-4", "watchdog"].detail
    assert [node for (node, item), check in found.items() if check.status != PASS] == ["spark-4"]


def test_status_names_the_state_that_serves_and_the_one_a_rollback_returns_to():
    found = rows(reading("head"), reading("worker"))
    assert found["spark-head", "serving state"].detail == (
        f"profile adaptive, image dual-spark/x:1 (sha256:5e5e5e5e5e5e), model org/model@{'ab' * 6}, serving since 2026-11-29T20:03:40Z")
    back = found["spark-head", "rollback state"]
    assert back.status == PASS and back.detail.startswith("profile fast,") and "since 2026-11-28T10:00:00Z" in back.detail
    assert back.detail.endswith("`pyinfra inventory.py tasks/rollback.py` returns to it")
    assert ("spark-worker", "serving state") not in found

    left = rows(reading("head", records={"served": SERVED, "rollback": BEFORE},
                        container={**reading("head")["container"], "stack": "dead"}), reading("worker"))
    assert left["spark-head", "serving state"].status == WARN and "runs stack dead, not the one recorded" in left["spark-head", "serving state"].detail
    assert left["spark-head", "rollback state"].detail.startswith("profile adaptive,")  # back to the state that served last

    none = rows(reading("head", records={"served": None, "rollback": None}), reading("worker"))
    assert none["spark-head", "serving state"].status == WARN and none["spark-head", "rollback state"].detail == "none recorded yet"


RATES = {"ok": True, "url": "http://127.0.0.1:9090", "window_seconds": 300, "error": None, "alerts": [], "series": [
    {"name": "dual_spark:decode_tokens_per_second:per_stream", "labels": {"node": "spark-head", "model_name": "tiny"}, "mean": 34.54,
     "last": 35.0},
    {"name": "dual_spark:generation_tokens_per_second:aggregate", "labels": {"node": "spark-head"}, "mean": 75.44, "last": 70.0},
    {"name": "dual_spark:time_to_first_token_seconds:mean", "labels": {}, "mean": 0.412, "last": 0.4},
    {"name": "dual_spark:time_to_first_token_seconds:p95", "labels": {}, "mean": 0.917, "last": 0.9},
    {"name": "dual_spark:kv_cache_usage:ratio", "labels": {}, "mean": 0.123, "last": 0.1},
    {"name": "dual_spark:spec_decode_acceptance:ratio", "labels": {}, "mean": None, "last": None},
    {"name": "dual_spark:spec_decode_acceptance_length:mean", "labels": {}, "mean": 3.41, "last": 3.4}]}
ALERT = {"name": "DualSparkRailSlow", "state": "firing", "labels": {"node": "spark-worker", "severity": "warning", "rail": "1"},
         "summary": "Rail 1 (enP2p1s0f0np0) of spark-worker runs below 200000 Mb/s"}


def test_the_head_shows_the_last_five_minutes_of_the_recording_rules():
    found = rows(reading("head", prometheus=RATES), reading("worker"))
    row = found["spark-head", "metrics (last 5 min)"]
    assert row.status == PASS
    assert row.detail == ("decode 34.5 tok/s per stream, 75.4 tok/s in all, TTFT 0.41 s (p95 0.92 s), KV cache 12% in use, "
                          "3.41 tokens per step")  # a rule with no value in the window is left out
    assert found["spark-head", "alerts"].status == PASS and found["spark-head", "alerts"].detail == "none firing"
    quiet = rows(reading("head", prometheus={**RATES, "series": []}), reading("worker"))
    assert quiet["spark-head", "metrics (last 5 min)"].detail == "no request in that time"


def test_an_alert_firing_is_named_with_what_it_says():
    found = rows(reading("head", prometheus={**RATES, "alerts": [ALERT, {**ALERT, "name": "DualSparkKvCacheFull", "state": "pending",
                                                                          "labels": {"node": "spark-head"}}]}), reading("worker"))
    alerts = found["spark-head", "alerts"]
    assert alerts.status == WARN and alerts.detail == "firing: DualSparkRailSlow (spark-worker)"
    assert alerts.lines == (ALERT["summary"],)
    critical = {**ALERT, "name": "DualSparkApiDown", "labels": {"node": "spark-head", "severity": "critical"}}
    assert rows(reading("head", prometheus={**RATES, "alerts": [critical]}), reading("worker"))["spark-head", "alerts"].status == FAIL
    pending = rows(reading("head", prometheus={**RATES, "alerts": [{**ALERT, "state": "pending"}]}), reading("worker"))
    assert pending["spark-head", "alerts"].detail == "none firing; pending: DualSparkRailSlow (spark-worker)"


def test_the_heartbeat_firing_is_no_trouble():
    heartbeat = {"name": "DualSparkHeartbeat", "state": "firing", "labels": {"severity": "none"}, "summary": "evaluates"}
    alerts = rows(reading("head", prometheus={**RATES, "alerts": [heartbeat]}), reading("worker"))["spark-head", "alerts"]
    assert alerts.status == PASS and alerts.detail == "none firing"
    both = rows(reading("head", prometheus={**RATES, "alerts": [heartbeat, ALERT]}), reading("worker"))["spark-head", "alerts"]
    assert both.status == WARN and both.detail == "firing: DualSparkRailSlow (spark-worker)"


def test_a_prometheus_that_does_not_answer_is_a_warning_with_its_fix():
    down = {"ok": False, "series": [], "alerts": [], "error": "no answer at http://127.0.0.1:9090: <urlopen error [Errno 111] Connection refused>"}
    row = rows(reading("head", prometheus=down), reading("worker"))["spark-head", "metrics (Prometheus)"]
    assert row.status == WARN and "Connection refused" in row.detail and "systemctl status prometheus" in row.fix
    assert not any(item.startswith("metrics") for _, item in rows(reading("head"), reading("worker")))  # observability off: no row


def test_the_front_door_says_what_it_holds_and_fails_when_clients_reach_nothing():
    assert rows(reading("head"), reading("worker"))["spark-head", "front door"].detail == \
        "answers at 127.0.0.1:8888: 1 in flight, 212 sent to vLLM, 3 tried again since it started"
    for health in ("UP", "DOWN"):  # a change: drained, and vLLM down while it restarts
        draining = rows(reading("head", door={**DOOR, "status": "DRAIN", "health": health}), reading("worker"))["spark-head", "front door"]
        assert draining.status == WARN and draining.detail.startswith("vLLM drained for a change: new requests wait until it serves and "
                                                                      "passes its canaries"), health
    gone = rows(reading("head", door={"ok": False, "error": "no front door answers on this node"}), reading("worker"))["spark-head", "front door"]
    assert gone.status == FAIL and "clients reach nothing at 127.0.0.1:8888" in gone.fix
    assert rows(reading("head", door={**DOOR, "status": "MAINT"}), reading("worker"))["spark-head", "front door"].status == FAIL
    down = rows(reading("head", door={**DOOR, "health": "DOWN"}), reading("worker"))["spark-head", "front door"]
    assert down.status == WARN and down.detail.startswith("vLLM is down at the door's health check: new requests wait")


DOWN = {"ok": False, "model": None, "max_model_len": None, "error": "no answer at http://127.0.0.1:8889", "metrics": None}
MARK = {"since": 1796337000.0, "until": 1796341260.0, "what": "a deploy run stops and starts serving", "age_seconds": 42, "in_force": True}


def restarted_head(seconds_ago: int, starts: dict, planned: dict | None = None) -> dict:
    """The head's vLLM started ``seconds_ago`` and not serving yet; its worker's container restarting."""
    head = reading("head", health="starting", live={"role": "head", "session": SESSION, "state": "loading", "joined": None}, api=DOWN)
    started = datetime.fromisoformat(head["now"].replace("Z", "+00:00")) - timedelta(seconds=seconds_ago)
    head["container"] = {**head["container"], "started": started.strftime("%Y-%m-%dT%H:%M:%S.000000Z")}
    head["watchdog"] = {**ok(live=head["watchdog"]["live"], starts=starts), "planned": planned}
    return head


def test_planned_work_turns_the_serving_rows_to_warnings_that_say_so_and_nothing_else():
    """A deploy run's stop marked planned work on the head: what it takes down warns, naming it;
    a GPU that fails still fails."""
    head = restarted_head(30, {"failed_starts": 0, "healthy": False}, MARK)
    worker = reading("worker", state="restarting", watchdog=ok(live=None, starts=None))
    found = rows(head, worker)
    for node, item in (("spark-head", "API"), ("spark-worker", "vLLM container"), ("spark-worker", "watchdog")):
        assert found[node, item].status == WARN, found[node, item]
        assert found[node, item].detail.startswith("planned work (a deploy run stops and starts serving, for 42 s): ")
    unmarked = rows(restarted_head(30, {"failed_starts": 0, "healthy": False}, {**MARK, "in_force": False}), worker)
    assert unmarked["spark-head", "API"].status == FAIL and unmarked["spark-worker", "vLLM container"].status == FAIL
    broken = {**worker, "memory": {**worker["memory"], "nvidia_smi": "Unable to determine the device handle for GPU0"}}
    assert rows(head, broken)["spark-worker", "GPU memory"].status == FAIL


def test_a_heal_warns_within_its_expected_time_and_fails_past_it_or_in_a_loop():
    """Expected: 1.5 times the last start that served, plus heal_margin_seconds (120 by default)."""
    within = rows(restarted_head(150, {"failed_starts": 0, "healthy": False, "last_start_seconds": 40.0}), reading("worker"))
    assert within["spark-head", "API"].status == WARN
    assert within["spark-head", "API"].detail.startswith("a heal within its expected time (the head up 150 s of 180 s: its last start took 40 s)")
    past = rows(restarted_head(190, {"failed_starts": 0, "healthy": False, "last_start_seconds": 40.0}), reading("worker"))
    assert past["spark-head", "API"].status == FAIL
    loop = rows(restarted_head(30, {"failed_starts": 2, "healthy": False, "last_start_seconds": 40.0}), reading("worker"))
    assert loop["spark-head", "API"].status == FAIL
    unmeasured = rows(restarted_head(30, {"failed_starts": 0, "healthy": False}), reading("worker"))
    assert unmeasured["spark-head", "API"].status == FAIL


def test_the_run_doing_the_planned_work_sees_its_failures_as_failures():
    """The run whose change fails reports the rows that fail, its own mark notwithstanding."""
    head = restarted_head(30, {"failed_starts": 0, "healthy": False}, MARK)
    readings = {"spark-head": head, "spark-worker": reading("worker", state="restarting", watchdog=ok(live=None, starts=None))}
    own = {(c.node, c.item): c for name in readings for c in status_checks(name, cluster(2), readings, excused=False)}
    assert own["spark-head", "API"].status == FAIL and own["spark-worker", "vLLM container"].status == FAIL


def test_the_front_door_row_says_how_many_requests_it_holds():
    head = reading("head", door={**DOOR, "status": "DRAIN", "held": 2.0, "held_longest_seconds": 31.4})
    row = rows(head, reading("worker"))["spark-head", "front door"]
    assert row.status == WARN and "2 held (the oldest 31 s), 1 in flight" in row.detail
    unread = rows(reading("head", door={**DOOR, "held": None, "held_longest_seconds": None}), reading("worker"))["spark-head", "front door"]
    assert unread.status == PASS and "held" not in unread.detail


def test_a_worker_in_a_loop_of_failed_starts_is_no_heal():
    """The head restarted within its expected time, but a worker's starts never serve: that fails."""
    head = restarted_head(30, {"failed_starts": 0, "healthy": False, "last_start_seconds": 40.0})
    worker = reading("worker", state="restarting", watchdog=ok(live=None, starts={"failed_starts": 2, "healthy": False}))
    found = rows(head, worker)
    assert found["spark-head", "API"].status == FAIL and found["spark-worker", "watchdog"].status == FAIL


def test_a_container_unhealthy_from_its_start_that_serves_now_warns():
    """Docker marks a container unhealthy after three failed checks while it loads; once the
    watchdog serves and the API generates, the next check clears it: a warning until then."""
    stale = rows(reading("head", health="unhealthy"), reading("worker"))["spark-head", "vLLM container"]
    assert stale.status == WARN and "serves now" in stale.detail
    down = reading("head", health="unhealthy", api=DOWN, live={"role": "head", "session": SESSION, "state": "failing", "joined": None})
    assert rows(down, reading("worker"))["spark-head", "vLLM container"].status == FAIL


def test_alert_delivery_says_where_the_alerts_go_and_warns_when_nowhere():
    """The site's webhooks, each named by its host alone (a token may follow it); none: the alerts
    stay on the head, a warning that names the setting. No row without observability."""
    readings = {"spark-head": reading("head", prometheus=RATES), "spark-worker": reading("worker")}
    hooks = ["https://hooks.example.com/services/T0/B1?token=s3cr3t", "http://10.9.0.5:8080/alerts"]
    delivered = {c.item: c for c in status_checks("spark-head", site("pair", {"alert_webhooks": hooks}), readings)}["alert delivery"]
    assert delivered.status == PASS and "2 webhook(s) at 10.9.0.5:8080, hooks.example.com" in delivered.detail
    assert "s3cr3t" not in delivered.detail + delivered.fix and "services" not in delivered.detail
    nowhere = rows(reading("head", prometheus=RATES), reading("worker"))["spark-head", "alert delivery"]
    assert nowhere.status == WARN and "stay on the head" in nowhere.detail and "alert_webhooks" in nowhere.fix
    assert ("spark-head", "alert delivery") not in rows(reading("head"), reading("worker"))
