"""Alert delivery on the lab pair, for real: the deploy installs Debian's Alertmanager on the head
from the nodes' (offline) package mirror, on loopback with no cluster listener, and a converge with
a webhook in the site sends the alerts to it. The webhook is a tiny listener in the head's own
network namespace (no lab support beyond the package): it receives the heartbeat, a node gone (the
head's node exporter stopped) firing, and then its resolution once the exporter runs again. The
webhook's token is in no output of the run, its diff, its --dry diff of a new token, or the status.
A worker that cannot start keeps vLLM down past its expected heal: it backs off, status names it,
and the API's critical alert is delivered.

The lab's site scrapes every lab.config.METRICS_INTERVAL seconds (5 s): Alertmanager's waits follow
it (a group's first notification after two scrapes, its resolution within twenty: 100 s).
Runs after test_48 (which reads the site's own configuration) and before test_50's faults; the
next module's converge puts the site's own configuration (no webhook) back."""

import json
import re
import secrets
import subprocess
import time

import pytest

from lab import faults
from lab.config import HEAD, LAB_MODEL, METRICS_INTERVAL, WORKER
from lab.processes import in_node
from layout import store_entry
from tests.e2e.conftest import RECOVERED, pyinfra, serving_after, site_variant
from tests.e2e.test_10_converge import changed_operations

# Mostly waits on Alertmanager's groups and a worker's backoff: the lab's cores are lent meanwhile.
pytestmark = [pytest.mark.end_to_end, pytest.mark.usefixtures("lent_cores")]
PORT = 19099  # on the head's loopback: nothing of the deploy's listens there
# In the head's root file system, which the host sees at HEAD.root (a node's /tmp and /run are
# its own tmpfs, out of the host's sight): what the listener received, a JSON line a POST.
RECEIVED = "/var/tmp/dual-spark-webhook.jsonl"
TOKEN = f"lab-{secrets.token_hex(8)}"
WEBHOOK = f"http://127.0.0.1:{PORT}/hook/{TOKEN}?token={TOKEN}"
CONFIG = "etc/prometheus/dual-spark/alertmanager.yml"
MODEL_CONFIG = store_entry("/var/lib/dual-spark/model", {"path": LAB_MODEL}) + "/config.json"  # the served model's
# The site's margin for a heal beyond 1.5 times the last start (120 s by default): short here, so that a
# vLLM kept down pages soon after its heal was due (only the rules change: no restart).
HEAL_MARGIN = 1
# The listener: each POST's JSON body, and its path, appended to RECEIVED; it ends on its own after
# an hour, and writes its PID beside RECEIVED for the fixture to end it sooner.
LISTENER = r"""
import http.server, json, os, sys, time
port, out = int(sys.argv[1]), sys.argv[2]
open(out + ".pid", "w").write(str(os.getpid()))
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(out, "a") as received:
            received.write(json.dumps({"path": self.path, "body": json.loads(body)}) + "\n")
        self.send_response(200)
        self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", port), Hook)
server.timeout = 1
deadline = time.monotonic() + 3600
while time.monotonic() < deadline:
    server.handle_request()
"""


def listening(node, port: int) -> list[str]:
    lines = in_node(node.dir, "ss", "-Hltn", f"sport = :{port}", capture_output=True).stdout.splitlines()
    return sorted(line.split()[3].rsplit(":", 1)[0] for line in lines if len(line.split()) >= 4)


def received() -> list[dict]:
    """Every notification the listener received, in order: Alertmanager's webhook payloads."""
    path = HEAD.root / RECEIVED.lstrip("/")
    return [json.loads(line)["body"] for line in path.read_text().splitlines()] if path.exists() else []


def notified(alertname: str, status: str, node: str | None = None) -> list[dict]:
    """The notifications whose group holds ``alertname`` (on ``node``) with its alert in ``status``."""
    return [body for body in received() for alert in body["alerts"]
            if alert["labels"]["alertname"] == alertname and alert["status"] == status
            and (node is None or alert["labels"].get("node") == node)]


def waited(what: str, found, timeout: float) -> list[dict]:
    deadline = time.monotonic() + timeout
    while not (got := found()):
        assert time.monotonic() < deadline, f"{what}: not received in {timeout:.0f} s; received: {received()}"
        time.sleep(2)
    return got


@pytest.fixture(scope="module")
def webhook(lab, tmp_path_factory):
    """The listener running in the head's namespaces (as in_node enters them), and the lab's site
    with it as the one webhook; ended with the module."""
    (HEAD.root / RECEIVED.lstrip("/")).unlink(missing_ok=True)
    pid = (HEAD.dir / "init.pid").read_text().strip()
    process = subprocess.Popen(["nsenter", "-t", pid, "-m", "-u", "-i", "-n", "-p", "-r", "-w", "--", "python3", "-c", LISTENER,
                                str(PORT), RECEIVED], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while listening(HEAD, PORT) != ["127.0.0.1"]:
        assert time.monotonic() < deadline and process.poll() is None, "the webhook listener did not start in the head"
        time.sleep(0.5)
    yield site_variant(tmp_path_factory.mktemp("webhook"), alert_webhooks=[WEBHOOK], heal_margin_seconds=HEAL_MARGIN)
    listener = HEAD.root / f"{RECEIVED.lstrip('/')}.pid"
    if listener.exists():
        in_node(HEAD.dir, "kill", listener.read_text().strip(), check=False)
    process.wait(timeout=30)


@pytest.fixture(scope="module")
def delivering(webhook):
    """A converge with the webhook in the site: Alertmanager's configuration changes, and it reloads."""
    result = pyinfra("-y", site=webhook)
    assert result.returncode == 0, result.stdout
    return result


def test_alertmanager_listens_on_loopback_alone_its_configuration_the_daemons_alone(delivering):
    assert re.search(r"Run Alertmanager on the head \(127\.0\.0\.1:9093\), delivering to 1 webhook\(s\)", delivering.stdout), delivering.stdout
    assert in_node(HEAD.dir, "systemctl", "is-active", "prometheus-alertmanager", capture_output=True, check=False).stdout.strip() == "active"
    assert listening(HEAD, 9093) == ["127.0.0.1"] and listening(HEAD, 9094) == []  # no cluster (gossip) listener
    assert listening(WORKER, 9093) == []
    config = HEAD.root / CONFIG
    group = next(line.split(":")[2] for line in (HEAD.root / "etc/group").read_text().splitlines() if line.startswith("prometheus:"))
    assert oct(config.stat().st_mode & 0o777) == "0o640" and config.stat().st_uid == 0 and str(config.stat().st_gid) == group
    assert TOKEN in config.read_text()  # what Alertmanager needs; and nowhere in what the run printed
    assert TOKEN not in delivering.stdout and "127.0.0.1:19099/(not shown)" in delivering.stdout, delivering.stdout


def test_the_heartbeat_reaches_the_webhook(delivering):
    [body, *_] = waited("the heartbeat", lambda: notified("DualSparkHeartbeat", "firing"), 120)
    assert body["version"] == "4" and body["receiver"] == "site" and body["status"] == "firing"


@pytest.fixture(scope="module")
def node_gone(delivering) -> dict:
    """The head's node exporter stopped until DualSparkNodeDown fires (after four scrapes) and
    its notification reaches the webhook, then started again; the notification. Its resolution
    comes at the group's next interval (twenty scrapes), which the tests between wait out. The
    head's: the worker's went down in earlier modules (its rails), Prometheus sends a resolved
    alert on for 15 minutes, and Alertmanager puts a new one in its group, to go out at the
    group's next interval (twenty scrapes) rather than after its first wait."""
    assert not notified("DualSparkNodeDown", "firing", "spark-head")
    in_node(HEAD.dir, "systemctl", "stop", "prometheus-node-exporter")
    try:
        [fired, *_] = waited("DualSparkNodeDown firing", lambda: notified("DualSparkNodeDown", "firing", "spark-head"),
                             4 * METRICS_INTERVAL + 120)
    finally:
        in_node(HEAD.dir, "systemctl", "start", "prometheus-node-exporter")
    return fired


def test_a_node_gone_is_delivered_firing(node_gone):
    assert node_gone["groupLabels"] == {"alertname": "DualSparkNodeDown", "node": "spark-head", "severity": "critical"}
    assert node_gone["commonLabels"]["severity"] == "critical"


def test_a_worker_that_cannot_start_backs_off_is_named_and_pages_past_its_expected_heal(node_gone, webhook):
    """A worker that cannot start (its model's config.json gone), the pair kept down: the worker
    waits longer before each start; status fails its rows with the reason from its log; the API's
    alert warns within the heal's expected time (1.5 times the last start, plus HEAL_MARGIN) and
    pages (critical, delivered) past it; put right, the pair serves again."""
    def paged():
        return [alert for body in received() for alert in body["alerts"] if alert["labels"]["alertname"] == "DualSparkApiDown"
                and alert["labels"]["severity"] == "critical" and alert["status"] == "firing"]

    in_node(WORKER.dir, "mv", MODEL_CONFIG, MODEL_CONFIG + ".aside")
    try:
        assert faults.kill(WORKER, "vllm serve")
        started = time.monotonic()
        waited("the worker's second failed start", lambda: starts(WORKER).get("failed_starts", 0) >= 2, 300)
        restarts, counted = restart_count(WORKER), time.monotonic()
        result = pyinfra("-y", task="tasks/status.py", site=webhook)
        time.sleep(max(0.0, 15 - (time.monotonic() - counted)))  # the status run counts towards the 15 s watched
        assert restart_count(WORKER) - restarts <= 1, "the worker restarts without waiting"
        assert result.returncode != 0
        assert re.search(r"spark-worker\s+watchdog\s+FAIL\s+this side failed to come up [2-9] time\(s\) in a row", result.stdout), result.stdout
        assert re.search(r"\|\s.*'config\.json'", result.stdout), result.stdout  # vLLM's reason, from the worker's log
        [page, *_] = waited("DualSparkApiDown paging", paged, 300 - (time.monotonic() - started))
        down = time.monotonic() - started
    finally:
        in_node(WORKER.dir, "mv", MODEL_CONFIG + ".aside", MODEL_CONFIG)
    assert page["labels"]["node"] == "spark-head" and "longer than 1.5 times its last start plus 1 s" in page["annotations"]["description"]
    RECOVERED["worker crash loop, put right"] = round(serving_after(900), 1)
    print(f"DualSparkApiDown paged {down:.0f} s after the worker's vLLM was killed and could not start; "
          f"put right, the pair served again {RECOVERED['worker crash loop, put right']:.0f} s later")


def starts(node) -> dict:
    try:
        return json.loads((node.root / f"var/lib/dual-spark/serving/{node.role}-starts").read_text())
    except (OSError, ValueError):
        return {}


def restart_count(node) -> int:
    return int(in_node(node.dir, "docker", "inspect", "-f", "{{.RestartCount}}", "dual-spark-vllm", capture_output=True).stdout)


def test_status_names_the_webhooks_host_and_not_its_token(delivering, webhook):
    result = pyinfra("-y", task="tasks/status.py", site=webhook)
    assert re.search(r"spark-head\s+alert delivery\s+PASS\s+Alertmanager sends to 1 webhook\(s\) at 127\.0\.0\.1:19099", result.stdout), result.stdout
    assert TOKEN not in result.stdout


def test_a_new_token_is_said_in_a_line_never_shown(delivering, webhook, tmp_path):
    again = pyinfra("-y", site=webhook)
    assert again.returncode == 0 and changed_operations(again.stdout) == 0, again.stdout
    other = f"lab-{secrets.token_hex(8)}"
    dry = pyinfra("--dry", site=site_variant(tmp_path, alert_webhooks=[WEBHOOK.replace(TOKEN, other)], heal_margin_seconds=HEAL_MARGIN))
    assert dry.returncode == 0, dry.stdout
    assert "a webhook URL changed past its host (not shown: it may hold a token)" in dry.stdout, dry.stdout
    assert other not in dry.stdout and TOKEN not in dry.stdout
    assert other not in (HEAD.root / CONFIG).read_text()  # --dry changed nothing


def test_the_token_is_in_no_file_beyond_alertmanagers_configuration(delivering):
    for folder in ("etc/systemd/system", "var/log/sparklab-units"):
        for path in (HEAD.root / folder).rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert TOKEN not in path.read_text(errors="replace"), path
    found = in_node(HEAD.dir, "grep", "-rlF", "-D", "skip", "--", TOKEN, "/run", "/tmp", capture_output=True, check=False)
    assert found.stdout == "", found.stdout  # the node's own tmpfs, read inside it
    assert [path for path in (HEAD.root / "etc/prometheus").rglob("*") if path.is_file() and TOKEN in path.read_text(errors="replace")] \
        == [HEAD.root / CONFIG]


def test_the_node_back_is_delivered_resolved(node_gone):
    """Last in the module: the runs above took part of the group's interval."""
    waited("DualSparkNodeDown resolved", lambda: notified("DualSparkNodeDown", "resolved", "spark-head"), 20 * METRICS_INTERVAL + 180)
