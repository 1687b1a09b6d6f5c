"""The front door as the deploy renders it (templates/door/, files/door/hold.lua), run by the real
HAProxy in front of a backend that stops and starts as vLLM does, with the door program's drain
and keys (files/dual_spark/door.py). As an ordinary user, the rendered configuration loses only
what needs root: its user, group and chroot, and its socket and maps in /run and /etc (moved
beside it)."""

from __future__ import annotations

import hashlib
import http.client
import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from layout import DOOR
from operations.door import door_settings
from tests.fake_host import site
from tests.net import free_port
from tests.programs import ARCHIVE

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="HAProxy is not installed (scripts/setup.sh installs it)")

BACKEND = """
import hashlib, http.server, os, sys, time
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
        digest = hashlib.sha256(body).hexdigest().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(digest)))
        self.end_headers()
        self.wfile.write(digest)
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


DEPLOY_KEY, LAPTOP_KEY = "d" * 43, "l" * 43


def door_program(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ARCHIVE), "door", *args], capture_output=True, text=True, timeout=60)


def write_keys(tmp_path: Path) -> subprocess.CompletedProcess:
    """The door's maps from the key files in ``tmp_path`` (api-key, clients/NAME.key), as the deploy writes them."""
    return door_program("keys", "--deploy-key", str(tmp_path / "api-key"), "--clients", str(tmp_path / "clients"),
                        "--map", str(tmp_path / "clients.map"), "--backend-map", str(tmp_path / "backend.map"))


@pytest.fixture
def door(tmp_path):
    """The rendered door on free ports, its hold bound 6 s, the deploy's key and client laptop's
    let in; yields (url, socket, vllm)."""
    ports = {"api_port": free_port(), "vllm_port": free_port(), "door_metrics_port": free_port()}
    settings = door_settings(site("pair", {**ports, "serving_ready_timeout": 6}))
    socket = tmp_path / "door.sock"
    (tmp_path / "api-key").write_text(DEPLOY_KEY + "\n")
    (tmp_path / "clients").mkdir()
    (tmp_path / "clients/laptop.key").write_text(LAPTOP_KEY + "\n")
    assert write_keys(tmp_path).returncode == 0
    config = settings.files[f"{DOOR['dir']}/haproxy.cfg"].replace(DOOR["socket"], str(socket))
    for name in ("clients_map", "backend_map"):
        config = config.replace(DOOR[name], str(tmp_path / Path(DOOR[name]).name))
    kept = [line for line in config.splitlines() if line.strip().split(" ")[0] not in ("user", "group", "chroot")]
    assert len(config.splitlines()) - len(kept) == 3
    (tmp_path / "haproxy.cfg").write_text("\n".join(kept) + "\n")
    (tmp_path / "hold.lua").write_text(settings.files[f"{DOOR['dir']}/hold.lua"])
    subprocess.run(["haproxy", "-c", "-q", "-C", str(tmp_path), "-f", "haproxy.cfg"], check=True)
    haproxy = subprocess.Popen(["haproxy", "-db", "-C", str(tmp_path), "-f", "haproxy.cfg"], stderr=subprocess.DEVNULL)
    vllm = Vllm(ports["vllm_port"], tmp_path)
    deadline = time.monotonic() + 10
    while not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{ports['api_port']}", str(socket), vllm
    vllm.stop()
    haproxy.kill()
    haproxy.wait()


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
    url, _, vllm = door
    results: list = []
    thread = in_background(url + "/v1/models", results)
    time.sleep(2)  # vLLM takes no connections yet: the door tries again each second
    vllm.start()
    thread.join()
    status, body, waited, _ = results[0]
    assert status == 200 and body == "chunk0" and waited >= 2


def test_a_request_that_waited_past_the_bound_fails_once_with_retry_after(door):
    url, _, _ = door
    results: list = []
    get(url + "/v1/models", results)
    status, body, waited, retry_after = results[0]
    assert status == 503 and retry_after == "30" and "did not serve within 6 s" in json.loads(body)["error"]["message"]
    assert waited >= 5


def seen_up(socket: str) -> None:
    """Until the door's health check sees vLLM up."""
    deadline = time.monotonic() + 15
    while json.loads(door_program("state", "--socket", socket).stdout)["door"]["health"] != "UP":
        assert time.monotonic() < deadline, "the door's health check never saw vLLM up"
        time.sleep(0.2)


def test_a_planned_stop_lets_the_request_in_flight_finish_and_holds_the_next(door):
    """The drain: the slow request in flight when it starts finishes whole; one sent during the
    drain is held, not sent to the vLLM about to stop, and served by the next one."""
    url, socket, vllm = door
    vllm.start()
    seen_up(socket)
    before = vllm.process
    slow: list = []
    held: list = []
    slow_thread = in_background(url + "/slow", slow)
    time.sleep(0.5)
    stopping = subprocess.Popen([sys.executable, str(ARCHIVE), "door", "stop", "--socket", socket, "--drain", "30", "--",
                                 "kill", str(vllm.process.pid)], stderr=subprocess.PIPE, text=True)
    time.sleep(0.5)
    held_thread = in_background(url + "/v1/models", held)
    assert stopping.wait(timeout=30) == 0
    assert "1 in flight" in stopping.stderr.read()
    slow_thread.join()
    assert slow[0][:2] == (200, "chunk0chunk1chunk2chunk3chunk4")  # finished before vLLM stopped
    assert before.wait(timeout=5) is not None and not held  # the held request was not sent to the stopped vLLM
    vllm.start()
    held_thread.join()
    assert held[0][:2] == (200, "chunk0")
    state = json.loads(door_program("state", "--socket", socket).stdout)["door"]
    assert state["status"] == "no check" and state["in_flight"] == 0 and state["requests"] >= 2


def test_a_vllm_whose_engine_died_is_seen_down_and_requests_wait_for_the_next(door, tmp_path):
    """A heal: vLLM answers 503 at /health (its engine died) while its API still takes requests.
    Once the door's check sees it down, a new request waits at the door instead of meeting the
    dead engine, and is served by the vLLM that follows."""
    url, socket, vllm = door
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
    url, socket, vllm = door
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
    assert json.loads(door_program("state", "--socket", str(tmp_path / "none.sock")).stdout) == {"door": None}


def test_the_door_lets_in_the_keys_it_knows_and_hands_vllm_the_deploys(door, tmp_path):
    """A client's key as a bearer token or x-api-key, or the deploy's own, reaches vLLM, which
    is handed the deploy's key; any other key, or none, is refused at the door (401) on the API,
    which vLLM alone keys; the maps are root's, mode 600, and no key is printed."""
    url, _, vllm = door
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
