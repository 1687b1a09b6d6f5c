"""The front door as the deploy renders it (templates/door/, files/door/), run by the real
HAProxy (tests/programs/door.py) in front of a backend that stops and starts as vLLM does and
answers as it does, with the door program's drain and keys (files/dual_spark/door.py); and the
door's own counts of the requests it holds and of each client's requests and tokens."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import pytest
from dual_spark.door import set_state

from layout import DOOR
from tests.net import free_port
from tests.observability import promtool
from tests.programs import ARCHIVE
from tests.programs.door import counts, counts_text, door_program, of_client, per_client, running_door, write_keys

BACKEND = """
import hashlib, http.server, json, os, sys, time
DEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "dead")
FROZEN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frozen")
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if os.path.exists(FROZEN):  # a frozen rank's vLLM, ended by its watchdog under the request
            os._exit(1)
        asked = json.loads(body) if body.startswith(b"{") else {}
        if self.path == "/v1/fail":
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if "usage" not in asked:  # the body's digest: what vLLM was sent
            digest = hashlib.sha256(body).hexdigest().encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(digest)))
            self.end_headers()
            self.wfile.write(digest)
            return
        # as vLLM answers, its usage the request's "usage" (prompt, completion) where the client asked
        prompt, completion = asked["usage"]
        if not asked.get("stream"):
            body = json.dumps({"choices": [{"message": {"content": 'a "usage": {"prompt_tokens": 999}'}}],
                               "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                                         "prompt_tokens_details": {"cached_tokens": 1}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        def send(text):
            data = text.encode()
            self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(data), data))
            self.wfile.flush()
            time.sleep(0.3)
        if self.path == "/v1/messages":  # Anthropic's stream: input tokens first, output tokens last
            send('event: message_start\\ndata: ' + json.dumps({"type": "message_start", "message": {"usage": {"input_tokens": prompt, "output_tokens": 1}}}) + '\\n\\n')
            send('event: content_block_delta\\ndata: {"type": "content_block_delta", "delta": {"text": "hi"}}\\n\\n')
            send('event: message_delta\\ndata: ' + json.dumps({"type": "message_delta", "usage": {"output_tokens": completion}}) + '\\n\\n')
        else:
            usage = asked.get("stream_options", {}).get("include_usage")
            for n in range(3):
                send("data: " + json.dumps({"choices": [{"delta": {"content": f"token{n}"}}], **({"usage": None} if usage else {})}) + "\\n\\n")
            if usage:  # the last chunk, cut in two inside its usage
                last = "data: " + json.dumps({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion}}) + "\\n\\n"
                cut = last.index("usage") + 3
                send(last[:cut])
                send(last[cut:])
            send("data: [DONE]\\n\\n")
        self.wfile.write(b"0\\r\\n\\r\\n")
        self.wfile.flush()
    def do_GET(self):
        if self.path == "/health" and os.path.exists(DEAD):  # an engine that died: vLLM's /health answers 503
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/v1/models" and os.path.exists(DEAD):
            self.send_response(500)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path == "/v1/whoami":  # what the door handed on as the key
            body = self.headers.get("Authorization", "").encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        chunks = 5 if self.path == "/slow" else 1
        self.send_response(200)
        self.send_header("Content-Length", str(6 * chunks))
        self.end_headers()
        for n in range(chunks):
            if self.path == "/slow":
                time.sleep(1)
            self.wfile.write(f"chunk{n}".encode())
            self.wfile.flush()
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
"""


class Vllm:
    """A backend on vllm_port that stops (is killed) and starts again, as vLLM does."""

    def __init__(self, port: int, tmp_path: Path):
        self.port, self.script, self.process = port, tmp_path / "backend.py", None
        self.script.write_text(BACKEND)

    def start(self) -> None:
        self.process = subprocess.Popen([sys.executable, str(self.script), str(self.port)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/", timeout=1).read()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError("the backend did not start")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()


DEPLOY_KEY, LAPTOP_KEY, PHONE_KEY = "d" * 43, "l" * 43, "p" * 43


class Door(NamedTuple):
    url: str  # the API
    socket: str  # its runtime API
    vllm: Vllm
    metrics: str  # its metrics frontend


@contextmanager
def door_on_free_ports(tmp_path: Path, bound: int, lapse: int | None = None) -> Iterator[Door]:
    """The rendered door on free ports, its hold bound ``bound`` s, the deploy's key and client
    laptop's let in (``lapse``: running_door's)."""
    ports = {"api_port": free_port(), "vllm_port": free_port(), "door_metrics_port": free_port()}
    with running_door(tmp_path, {**ports, "serving_ready_timeout": bound}, DEPLOY_KEY, {"laptop": LAPTOP_KEY}, lapse) as socket:
        vllm = Vllm(ports["vllm_port"], tmp_path)
        try:
            yield Door(f"http://127.0.0.1:{ports['api_port']}", socket, vllm, f"http://127.0.0.1:{ports['door_metrics_port']}")
        finally:
            vllm.stop()


@pytest.fixture
def door(tmp_path):
    with door_on_free_ports(tmp_path, 6) as found:
        yield found


def get(url: str, results: list, timeout: float = 60, key: str | None = LAPTOP_KEY, header: str = "Authorization") -> None:
    """GET ``url`` with ``key`` and append (status, body, seconds, Retry-After) to ``results``."""
    start = time.monotonic()
    request = urllib.request.Request(url, headers={header: f"Bearer {key}" if header == "Authorization" else key} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            results.append((response.status, response.read().decode(), time.monotonic() - start, None))
    except urllib.error.HTTPError as error:
        results.append((error.code, error.read().decode(), time.monotonic() - start, error.headers.get("Retry-After")))


def in_background(url: str, results: list) -> threading.Thread:
    thread = threading.Thread(target=get, args=(url, results))
    thread.start()
    return thread


def test_a_request_waits_at_the_door_while_vllm_starts_and_is_served(door):
    url, _, vllm, _ = door
    results: list = []
    thread = in_background(url + "/v1/models", results)
    time.sleep(2)  # vLLM takes no connections yet: the door tries again each second
    vllm.start()
    thread.join()
    status, body, waited, _ = results[0]
    assert status == 200 and body == "chunk0" and waited >= 2


def test_a_request_that_waited_past_the_bound_fails_once_with_retry_after(door):
    url, _, _, metrics = door
    results: list = []
    get(url + "/v1/models", results)
    status, body, waited, retry_after = results[0]
    assert status == 503 and retry_after == "30" and "did not serve within 6 s" in json.loads(body)["error"]["message"]
    assert waited >= 5
    assert per_client(metrics) == {**of_client("deploy"), **of_client("laptop", {"5xx": 1})}  # the door's own answer, counted


def seen_up(socket: str) -> None:
    """Until the door's health check sees vLLM up."""
    deadline = time.monotonic() + 15
    while json.loads(door_program("state", "--socket", socket).stdout)["door"]["health"] != "UP":
        assert time.monotonic() < deadline, "the door's health check never saw vLLM up"
        time.sleep(0.2)


def test_a_planned_stop_lets_the_request_in_flight_finish_and_holds_the_next(tmp_path):
    """The drain: the slow request in flight when it starts finishes whole; one sent during the
    drain is held, not sent to the vLLM about to stop, nor to the next one before the change
    opens the door (it has served and passed its canaries), and then served by it."""
    with door_on_free_ports(tmp_path, 60) as door:
        drained_then_opened(door)


def drained_then_opened(door: Door) -> None:
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    before = vllm.process
    slow: list = []
    held: list = []
    slow_thread = in_background(url + "/slow", slow)
    deadline = time.monotonic() + 15
    while json.loads(door_program("state", "--socket", socket).stdout)["door"]["in_flight"] != 1:
        assert time.monotonic() < deadline, "the slow request never reached vLLM"
        time.sleep(0.1)
    stopping = subprocess.Popen([sys.executable, str(ARCHIVE), "door", "stop", "--socket", socket, "--drain", "30", "--",
                                 "kill", str(vllm.process.pid)], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 15
    while not json.loads(door_program("state", "--socket", socket).stdout)["door"]["status"].startswith("DRAIN"):
        assert time.monotonic() < deadline, "the stop never drained vLLM"
        time.sleep(0.1)
    held_thread = in_background(url + "/v1/models", held)
    assert stopping.wait(timeout=30) == 0
    assert "1 in flight" in stopping.stderr.read()
    slow_thread.join()
    assert slow[0][:2] == (200, "chunk0chunk1chunk2chunk3chunk4")  # finished before vLLM stopped
    assert before.wait(timeout=5) is not None and not held  # the held request was not sent to the stopped vLLM
    vllm.start()
    seen_up(socket)
    time.sleep(1)
    assert not held and json.loads(door_program("state", "--socket", socket).stdout)["door"]["status"] == "DRAIN"
    opened = door_program("open", "--socket", socket)
    assert opened.returncode == 0 and "open: held requests go on" in opened.stderr
    held_thread.join()
    assert held[0][:2] == (200, "chunk0")
    state = json.loads(door_program("state", "--socket", socket).stdout)["door"]
    assert state["status"] == "no check" and state["in_flight"] == 0 and state["requests"] >= 2


def test_a_stop_that_fails_leaves_the_door_open(door):
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    done = door_program("stop", "--socket", socket, "--drain", "5", "--", "sh", "-c", "exit 3")
    assert done.returncode == 3 and "the stop failed: vLLM is ready at the door again" in done.stderr
    results: list = []
    get(url + "/v1/models", results, timeout=5)
    assert results[0][:2] == (200, "chunk0")


def test_a_door_left_drained_by_a_run_that_died_opens_once_the_change_has_lapsed(tmp_path):
    """No `door open` comes (the run was killed after the stop): the held request is served once
    DUAL_SPARK_GATE_LAPSE (here 3 s, in place of the change's time) has passed."""
    with door_on_free_ports(tmp_path, 30, lapse=3) as (url, socket, vllm, _):
        vllm.start()
        assert door_program("stop", "--socket", socket, "--drain", "5", "--", "true").returncode == 0
        results: list = []
        get(url + "/v1/models", results, timeout=30)
    status, body, waited, _ = results[0]
    assert (status, body) == (200, "chunk0") and 2 <= waited < 10, results


def test_a_vllm_whose_engine_died_is_seen_down_and_requests_wait_for_the_next(door, tmp_path):
    """A heal: vLLM answers 503 at /health (its engine died) while its API still takes requests.
    Once the door's check sees it down, a new request waits at the door instead of meeting the
    dead engine, and is served by the vLLM that follows."""
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    (tmp_path / "dead").write_text("")  # the backend's /health answers 503 from now on
    deadline = time.monotonic() + 15
    while json.loads(door_program("state", "--socket", socket).stdout)["door"]["health"] != "DOWN":
        assert time.monotonic() < deadline, "the door's health check never saw the dead engine"
        time.sleep(0.2)
    held: list = []
    thread = in_background(url + "/v1/models", held)
    time.sleep(2)
    assert not held  # not sent to the dead engine: waiting
    (tmp_path / "dead").unlink()
    thread.join()
    assert held[0][:2] == (200, "chunk0")


def post_in_two_parts(url: str, body: bytes, results: list) -> None:
    """POST ``body`` as many clients do (urllib among them): the headers, then the body a moment
    later; append (status, answer)."""
    connection = http.client.HTTPConnection(url.removeprefix("http://"), timeout=60)
    connection.putrequest("POST", "/v1/completions")
    for name, value in (("Authorization", f"Bearer {LAPTOP_KEY}"), ("Content-Type", "application/json"), ("Content-Length", str(len(body)))):
        connection.putheader(name, value)
    connection.endheaders()
    time.sleep(0.3)
    connection.send(body)
    response = connection.getresponse()
    results.append((response.status, response.read().decode()))


@pytest.mark.parametrize("size", [200, 600_000])
def test_a_request_that_vllm_took_and_died_under_is_sent_whole_to_the_next(door, tmp_path, size):
    """A heal: vLLM read the request and ended without an answer (the watchdog ended a frozen
    rank's vLLM). The door sends it again, whole, to the next vLLM: its body came after its
    headers, and it is larger than HAProxy's 16 KiB default buffer, and neither stops that."""
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    (tmp_path / "frozen").write_text("")
    body = json.dumps({"prompt": "x" * size}).encode()
    results: list = []
    thread = threading.Thread(target=post_in_two_parts, args=(url, body, results))
    thread.start()
    vllm.process.wait(timeout=10)  # it took the request and ended under it
    (tmp_path / "frozen").unlink()
    vllm.start()
    thread.join(timeout=30)
    assert results == [(200, hashlib.sha256(body).hexdigest())]


def test_without_a_door_the_stop_runs_alone_and_keeps_its_status(tmp_path):
    done = door_program("stop", "--socket", str(tmp_path / "none.sock"), "--drain", "5", "--", "sh", "-c", "exit 3")
    assert done.returncode == 3 and "no front door here" in done.stderr
    opened = door_program("open", "--socket", str(tmp_path / "none.sock"))
    assert opened.returncode == 0 and "no front door here" in opened.stderr
    assert json.loads(door_program("state", "--socket", str(tmp_path / "none.sock")).stdout) == {"door": None}


def test_the_door_lets_in_the_keys_it_knows_and_hands_vllm_the_deploys(door, tmp_path):
    """A client's key as a bearer token or x-api-key, or the deploy's own, reaches vLLM, which
    is handed the deploy's key; any other key, or none, is refused at the door (401) on the API,
    which vLLM alone keys; the maps are root's, mode 600, and no key is printed."""
    url, _, vllm, _ = door
    vllm.start()
    answers: list = []
    for key, header in ((LAPTOP_KEY, "Authorization"), (LAPTOP_KEY, "x-api-key"), (DEPLOY_KEY, "Authorization"),
                        ("x" * 43, "Authorization"), (None, "Authorization")):
        get(url + "/v1/whoami", answers, key=key, header=header)
    assert [(status, body) for status, body, _, _ in answers] == [(200, f"Bearer {DEPLOY_KEY}")] * 3 + [(401, '{"error": "Unauthorized"}')] * 2
    health: list = []
    get(url + "/health", health, key=None)
    assert health[0][0] == 200
    assert {(tmp_path / name).stat().st_mode & 0o777 for name in ("clients.map", "backend.map")} == {0o600}
    written = write_keys(tmp_path)
    assert written.stderr.strip() == "dual-spark door: the door lets in 2 key(s): deploy, laptop"
    assert LAPTOP_KEY not in written.stdout + written.stderr and DEPLOY_KEY not in written.stdout + written.stderr


def test_a_client_removed_is_refused_by_the_running_door_at_once_and_one_added_let_in(door, tmp_path):
    """The key files changed under a running door: the keys program replaces its maps in memory
    (no reload), so the removed client's key is refused as soon as the program returns, the new
    client's let in, the deploy's kept; a door that reads no such map is said, not failed."""
    url, socket, vllm, _ = door
    vllm.start()
    (tmp_path / "clients/laptop.key").unlink()
    (tmp_path / "clients/phone.key").write_text(PHONE_KEY + "\n")
    written = write_keys(tmp_path, socket)
    assert written.returncode == 0, written.stderr
    assert "the running door holds these keys from now on" in written.stderr
    answers: list = []
    for key in (LAPTOP_KEY, PHONE_KEY, DEPLOY_KEY):
        get(url + "/v1/whoami", answers, key=key)
    assert [status for status, _, _, _ in answers] == [401, 200, 200]
    assert (tmp_path / "clients.map").read_text() == f"{DEPLOY_KEY} deploy\n{PHONE_KEY} phone\n"
    assert PHONE_KEY not in written.stdout + written.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "api-key").write_text(DEPLOY_KEY + "\n")
    other = write_keys(elsewhere, socket)  # maps the running door never read
    assert other.returncode == 0, other.stderr
    assert f"does not read {elsewhere / 'clients.map'} or {elsewhere / 'backend.map'} yet: it does once reloaded" in other.stderr, other.stderr
    answers.clear()
    get(url + "/v1/whoami", answers, key=PHONE_KEY)
    assert answers[0][0] == 200


def test_a_socket_left_by_a_door_that_died_is_said_and_the_maps_are_written(tmp_path):
    (tmp_path / "api-key").write_text(DEPLOY_KEY + "\n")
    stale = tmp_path / "door.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as bound:
        bound.bind(str(stale))  # bound, never listening, then closed: the file stays, as a killed HAProxy leaves it
    written = write_keys(tmp_path, str(stale))
    assert written.returncode == 0, written.stderr
    assert f"no door answers at {stale}: the next one to start reads these keys" in written.stderr
    assert (tmp_path / "clients.map").read_text() == f"{DEPLOY_KEY} deploy\n"


def test_a_key_file_that_is_not_one_key_is_refused_without_showing_it(tmp_path):
    (tmp_path / "api-key").write_text("d" * 43 + "\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients/laptop.key").write_text("two words\n")
    refused = write_keys(tmp_path)
    assert refused.returncode != 0 and "clients/laptop.key" in refused.stderr and "two words" not in refused.stderr
    assert not (tmp_path / "clients.map").exists()
    (tmp_path / "clients/laptop.key").unlink()
    (tmp_path / "clients/laptop.key").symlink_to(tmp_path / "api-key")
    refused = write_keys(tmp_path)
    assert refused.returncode != 0 and "symbolic link" in refused.stderr and "d" * 43 not in refused.stderr


COUNTS_FIXTURE = Path(__file__).parent / "fixtures/door_counts.txt"  # the counts after the test below, as counts.lua served them


def post(url: str, body: dict, key: str = LAPTOP_KEY, header: str = "Authorization") -> tuple[int, list[tuple[float, str]]]:
    """POST ``body`` as JSON with ``key``: the status and each line of the answer with the time it arrived."""
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={
        "Content-Type": "application/json", header: f"Bearer {key}" if header == "Authorization" else key})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            lines = []
            while line := response.readline():
                lines.append((time.monotonic(), line.decode()))
            return response.status, lines
    except urllib.error.HTTPError as error:
        return error.code, [(time.monotonic(), error.read().decode())]


def test_the_door_counts_each_clients_answers_and_tokens_and_never_a_key(door, tmp_path):
    """Per client (the name its key maps to), each answer by class and the tokens vLLM's usage
    reports: a JSON answer (a "usage" inside its text is not counted), a stream whose last chunk
    has usage (cut in two on its way), Anthropic's stream (input tokens first, output last), a
    stream without usage (counted as such), vLLM's own 500; a GET has no tokens; an unknown key is
    refused and counted for no one. Streams pass as they come, and the counts name no key."""
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    assert per_client(door.metrics) == {**of_client("deploy"), **of_client("laptop")}  # each of the site's clients from the start
    status, lines = post(url + "/v1/chat/completions", {"usage": [5, 7]})
    assert status == 200 and json.loads(lines[0][1])["usage"]["completion_tokens"] == 7
    status, lines = post(url + "/v1/chat/completions", {"usage": [11, 13], "stream": True, "stream_options": {"include_usage": True}})
    chunks = [line for _, line in lines if line.startswith("data: {")]
    assert status == 200 and json.loads(chunks[-1][6:])["usage"] == {"prompt_tokens": 11, "completion_tokens": 13}
    assert lines[-1][0] - lines[0][0] > 1  # each chunk passed on as vLLM sent it, 0.3 s apart
    status, lines = post(url + "/v1/chat/completions", {"usage": [100, 100], "stream": True}, header="x-api-key")
    assert status == 200 and lines[-2][1] == "data: [DONE]\n"
    status, lines = post(url + "/v1/messages", {"usage": [17, 19], "stream": True})
    assert status == 200 and "message_delta" in "".join(line for _, line in lines)
    assert post(url + "/v1/fail", {})[0] == 500
    assert post(url + "/v1/chat/completions", {"usage": [3, 4]}, key=DEPLOY_KEY)[0] == 200
    results: list = []
    get(url + "/v1/models", results, key=DEPLOY_KEY)
    assert post(url + "/v1/chat/completions", {"usage": [50, 50]}, key="x" * 43)[0] == 401
    assert results[0][:2] == (200, "chunk0")
    assert per_client(door.metrics) == {**of_client("deploy", {"2xx": 2}, prompt=3, completion=4),
                                **of_client("laptop", {"2xx": 4, "5xx": 1}, prompt=5 + 11 + 17, completion=7 + 13 + 19, without_usage=1)}
    text = counts_text(door.metrics)
    assert LAPTOP_KEY not in text and DEPLOY_KEY not in text
    assert counts(door.metrics)["dual_spark_door_count_errors_total"] == 0
    (tmp_path / "counts.txt").write_text(text)
    promtool("check", "metrics", stdin=text)

    def shape(text: str) -> set[str]:
        return {line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")}

    assert shape(text) == shape(COUNTS_FIXTURE.read_text())  # the capture the rules' names are checked against


def test_a_held_request_is_counted_while_it_waits_and_its_wait_once_it_ends(door):
    """Held while vLLM is drained: counted as held now, with its wait so far; served once vLLM is
    ready, its wait goes into the histogram. One held past the bound (6 s) is refused with a 503,
    counted as refused and as its client's 5xx."""
    url, socket, vllm, _ = door
    vllm.start()
    seen_up(socket)
    set_state(socket, "drain")
    held: list = []
    thread = in_background(url + "/v1/models", held)
    deadline = time.monotonic() + 10
    while counts(door.metrics)["dual_spark_door_held_requests"] != 1:
        assert time.monotonic() < deadline, "the held request was never counted"
        time.sleep(0.1)
    time.sleep(2)  # HAProxy's Lua reads the time its event loop last woke: on two busy cores, up to half a second behind
    now = counts(door.metrics)
    assert now["dual_spark_door_held_longest_seconds"] >= 1.5 and now["dual_spark_door_held_seconds_count"] == 0 and not held
    seen = json.loads(door_program("state", "--socket", socket, "--counts", door.metrics + DOOR["counts_path"]).stdout)["door"]
    assert seen["held"] == 1 and seen["held_longest_seconds"] >= 1.5  # what tasks/status.py's front-door row shows
    set_state(socket, "ready")
    thread.join()
    assert held[0][:2] == (200, "chunk0")
    after = counts(door.metrics)
    assert after["dual_spark_door_held_requests"] == 0 and after["dual_spark_door_held_longest_seconds"] == 0
    assert after["dual_spark_door_held_seconds_count"] == 1 and after["dual_spark_door_held_seconds_sum"] >= 1.5
    assert [after[f'dual_spark_door_held_seconds_bucket{{le="{le}"}}'] for le in ("1", "5", "+Inf")] == [0, 1, 1]
    assert after["dual_spark_door_held_refused_total"] == 0
    set_state(socket, "drain")
    refused: list = []
    get(url + "/v1/models", refused)
    assert refused[0][0] == 503 and refused[0][2] >= 5  # the bound in whole seconds
    after = counts(door.metrics)
    assert after["dual_spark_door_held_seconds_count"] == 2 and after["dual_spark_door_held_refused_total"] == 1
    assert [after[f'dual_spark_door_held_seconds_bucket{{le="{le}"}}'] for le in ("5", "10")] == [1, 2]
    assert per_client(door.metrics) == {**of_client("deploy"), **of_client("laptop", {"2xx": 1, "5xx": 1})}
