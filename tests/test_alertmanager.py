"""The deploy's Alertmanager configuration (operations/observability.py) in a real Alertmanager,
Debian's (tests/observability.py), delivering to a webhook receiver on loopback: when a
notification goes out, as the grouping makes it."""

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler

from tests.net import QuietServer
from tests.observability import alertmanager
from tests.test_observability import alertmanager_files


@contextmanager
def webhook() -> Iterator[tuple[str, list[tuple[float, dict]]]]:
    """A loopback webhook receiver: its URL, and each payload it received with the time it came."""
    received: list[tuple[float, dict]] = []

    class Hook(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            received.append((time.monotonic(), json.loads(self.rfile.read(int(self.headers["Content-Length"])))))
            self.send_response(200)
            self.end_headers()

    server = QuietServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()


def test_a_warning_that_becomes_a_page_pages_after_the_first_wait_not_the_groups_next_turn(tmp_path):
    """The pair's Alertmanager configuration in a real Alertmanager, at the lab's 5 s scrape (a
    group's first notification after 10 s, its changes after 100 s): DualSparkApiDown warns, its
    warning goes out; past the expected heal the warning resolves and the page fires. The page
    reaches the receiver within the first wait (10 s) and a margin, not at the warning group's
    next turn (100 s after its notification)."""
    def alert(severity: str, ends: float | None = None) -> dict:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ends or time.time() + 300))
        return {"labels": {"alertname": "DualSparkApiDown", "node": "spark-head", "severity": severity}, "endsAt": stamp}

    def post(url: str, alerts: list[dict]) -> None:
        request = urllib.request.Request(f"{url}/api/v2/alerts", data=json.dumps(alerts).encode(), headers={"Content-Type": "application/json"})
        urllib.request.urlopen(request, timeout=5).close()

    def notified(received: list[tuple[float, dict]], severity: str) -> float | None:
        return next((at for at, body in received for found in body["alerts"]
                     if found["labels"]["severity"] == severity and found["status"] == "firing"), None)

    with webhook() as (hook, received):
        config = alertmanager_files(tmp_path, "pair", {"alert_webhooks": [hook], "metrics_interval_seconds": 5})
        with alertmanager(config, tmp_path / "data") as url:
            post(url, [alert("warning")])
            deadline = time.monotonic() + 30
            while notified(received, "warning") is None:
                assert time.monotonic() < deadline, f"the warning was not delivered: {received}"
                time.sleep(0.2)
            time.sleep(1)
            post(url, [alert("warning", ends=time.time()), alert("critical")])
            paged = time.monotonic()
            while (at := notified(received, "critical")) is None:
                assert time.monotonic() - paged < 40, f"the page did not go out within 40 s: {received}"
                time.sleep(0.2)
    assert at - paged < 20, f"the page went out {at - paged:.0f} s after it fired"
