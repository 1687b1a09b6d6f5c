"""The serving watchdog (files/dual_spark/watchdog.py) as it runs beside vLLM: the real program
against stand-ins for what it watches (an API that generates or not, whose token counters move
or not; a head's status endpoint; workers' status endpoints), ending a stand-in for vLLM (a
sleeping process). With several workers, each runs its own watchdog and launch.sh waits for each
worker in turn (templates/serving/launch.sh.j2)."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from dual_spark.watchdog import healthy

from tests.net import QuietServer, free_port
from tests.programs import ARCHIVE

# The head, as workers see it: an address no other test connects to, since a worker watchdog counts
# every link of this host's processes to it as its vLLM's. Tests run side by side in several
# processes (pytest-xdist's gw0, gw1, ...), this file's too: one address for each.
HEAD_IP = f"127.0.42.{int(os.environ.get('PYTEST_XDIST_WORKER', 'gw0').removeprefix('gw')) + 1}"


class FakeApi:
    """vLLM's API as the head's watchdog sees it: ``mode`` "ok" generates; "dead" fails and its
    counters stand still (a dead rank); "busy" fails the probe while its counters move; "frozen"
    holds the probe and stands still (a frozen rank); "prefilling" holds the probe while the KV
    cache fills (a long prefill ahead of it). ``running`` is what vLLM counts as running."""

    def __init__(self):
        self.mode, self.work, self.kv, self.running = "ok", 100.0, 0.0, 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, body: str, kind: str = "application/json"):
                data = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/metrics":
                    if api.mode == "busy":
                        api.work += 512
                    if api.mode == "prefilling":
                        api.kv += 0.01
                    self.reply(200, f'vllm:generation_tokens_total{{engine="0"}} {api.work}\n'
                                    f'vllm:kv_cache_usage_perc{{engine="0"}} {api.kv}\n'
                                    f'vllm:num_requests_running{{engine="0"}} {api.running}\n', "text/plain")
                else:
                    self.reply(200, json.dumps({"data": [{"id": "tiny"}]}))

            def do_POST(self):
                self.rfile.read(int(self.headers["Content-Length"]))
                while api.mode in ("frozen", "prefilling"):
                    time.sleep(0.05)
                if api.mode == "ok":
                    api.work += 1
                    self.reply(200, json.dumps({"usage": {"completion_tokens": 1}}))
                else:
                    self.reply(500, json.dumps({"error": {"message": "EngineCore encountered an issue"}}))

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() in 0.05 s, not 0.5
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


class FakeHead:
    """A head watchdog's status endpoint on HEAD_IP, whose session and state can change."""

    def __init__(self, port: int, state: str = "serving"):
        self.session, self.state = "a" * 32, state
        head = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                data = json.dumps({"role": "head", "session": head.session, "state": head.state, "joined": None}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = QuietServer((HEAD_IP, port), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() in 0.05 s, not 0.5



def state_of(port: int, address: str = "127.0.0.1") -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/", timeout=2) as response:
            return json.loads(response.read())
    except OSError:
        return None


def wait_for(predicate, seconds: float = 15) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def vllm():
    """The process the watchdog ends (vLLM in the container)."""
    process = subprocess.Popen(["sleep", "300"])
    yield process
    process.kill()
    process.wait()


def watchdog(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ARCHIVE), "watchdog", *args], stderr=subprocess.PIPE, text=True)


def head_started(api: FakeApi, vllm, tmp_path, interval: str = "0.2"):
    """The head's watchdog against ``api``, its stall 2 s: its process and status port."""
    port, key = free_port(), tmp_path / "key"
    key.write_text("secret")
    process = watchdog("head", "--ip", "127.0.0.1", "--port", str(port), "--url", api.url, "--key-file", str(key),
                       "--pid", str(vllm.pid), "--interval", interval, "--stall", "2", "--state", str(tmp_path / "head-starts"))
    return process, port


def head_watching(api: FakeApi, vllm, tmp_path, interval: str = "0.2"):
    """The head's watchdog, once it has seen a token: its process and status port."""
    process, port = head_started(api, vllm, tmp_path, interval)
    assert wait_for(lambda: (state_of(port) or {}).get("state") == "serving"), "the head watchdog never saw a token"
    return process, port


def ended_for_a_frozen_rank(process, vllm) -> None:
    assert wait_for(lambda: vllm.poll() is not None, 10), "vLLM was left running with a frozen rank"
    process.wait(timeout=10)
    assert "a rank is frozen" in process.stderr.read()


@pytest.fixture
def head_watchdog(vllm, tmp_path):
    api = FakeApi()
    process, port = head_watching(api, vllm, tmp_path)
    yield api, port, process, tmp_path
    api.mode = "ok"  # lets a held probe go
    process.kill()
    process.wait()


def test_the_head_ends_vllm_after_two_probes_without_token_or_work(head_watchdog, vllm):
    api, port, process, tmp_path = head_watchdog
    record = json.loads((tmp_path / "head-starts").read_text())
    assert record.pop("last_start_seconds") < 5 and record == {"failed_starts": 0, "healthy": True}  # its start, measured
    api.mode = "dead"
    assert wait_for(lambda: vllm.poll() is not None), "vLLM was left running with a dead rank"
    process.wait(timeout=10)
    assert "no token generated 2 times in a row and the engine finished no step" in process.stderr.read()


def test_a_busy_engine_is_not_taken_for_a_dead_one(head_watchdog, vllm):
    api, port, process, _ = head_watchdog
    api.mode = "busy"
    assert wait_for(lambda: (state_of(port) or {}).get("state") == "busy")
    time.sleep(1)  # about five probes without a token: two end an engine whose counters stand still
    assert vllm.poll() is None and state_of(port)["state"] == "busy"
    api.mode = "ok"
    assert wait_for(lambda: state_of(port)["state"] == "serving")
    assert vllm.poll() is None


def test_a_frozen_rank_ends_vllm_once_the_probe_has_waited_the_stall(head_watchdog, vllm):
    """The probe hangs and /metrics answers what it said before: the stall (2 s), not the
    probe's own timeout (60 s), ends vLLM."""
    api, _, process, _ = head_watchdog
    api.mode = "frozen"
    frozen = time.monotonic()
    assert wait_for(lambda: vllm.poll() is not None, 10), "vLLM was left running with a frozen rank"
    assert time.monotonic() - frozen >= 2, "ended before the stall"
    process.wait(timeout=10)
    assert "and the engine finished no step: a rank is frozen" in process.stderr.read()


def test_a_long_prefill_ahead_of_the_probe_is_not_taken_for_a_frozen_rank(head_watchdog, vllm):
    """No token for three stalls, but the KV cache fills at every step: the engine works."""
    api, port, _, _ = head_watchdog
    api.mode = "prefilling"
    time.sleep(6)
    assert vllm.poll() is None, "a long prefill was taken for a frozen rank"
    api.mode = "ok"
    assert wait_for(lambda: state_of(port)["state"] == "serving") and vllm.poll() is None


@pytest.mark.parametrize("mode", ["frozen", "prefilling"])
def test_a_request_in_flight_is_watched_between_probes(vllm, tmp_path, mode):
    """Probes 60 s apart: vLLM counting a request running is enough to watch. Frozen, it is
    ended after the stall; filling its KV cache, it is left alone."""
    api = FakeApi()
    process, _ = head_watching(api, vllm, tmp_path, interval="60")
    try:
        api.running, api.mode = 1, mode
        if mode == "frozen":
            ended_for_a_frozen_rank(process, vllm)
        else:
            time.sleep(6)
            assert vllm.poll() is None, "a long prefill was taken for a frozen rank"
    finally:
        api.mode = "ok"
        process.kill()
        process.wait()


@pytest.mark.parametrize("tokens", [100.0, 0.0], ids=["a client's token counted", "no token yet"])
def test_a_rank_frozen_before_the_probes_first_token_is_found_once_the_engine_generated(vllm, tmp_path, tokens):
    """The probe's first request hangs from the start. Where vLLM already counts tokens (a
    client's request was served first), the watch is on: vLLM is ended after the stall (2 s), not
    at the start-up timeout. Where it counts none, a first step may be compiling kernels: it is
    left to the start-up timeout."""
    api = FakeApi()
    api.work, api.mode = tokens, "frozen"
    process, _ = head_started(api, vllm, tmp_path)
    try:
        if tokens:
            ended_for_a_frozen_rank(process, vllm)
        else:
            time.sleep(6)
            assert vllm.poll() is None, "a first step with no token yet was taken for a frozen rank"
    finally:
        api.mode = "ok"
        process.kill()
        process.wait()


def test_the_worker_leaves_a_head_session_that_is_gone(vllm, tmp_path):
    """It joins the session of the head it is connected to; a new head session ends it."""
    port = free_port()
    head = FakeHead(port)
    listener = socket.create_server((HEAD_IP, 0))  # the head's vLLM rendezvous
    links = [socket.create_connection((HEAD_IP, port))]  # wait-for-head's, on the watchdogs' port: no link
    process = watchdog("worker", "--ip", "127.0.0.1", "--head-ip", HEAD_IP, "--port", str(port),
                       "--pid", str(vllm.pid), "--interval", "0.2", "--state", str(tmp_path / "worker-starts"))
    try:
        assert wait_for(lambda: state_of(port) is not None), "the worker's watchdog never answered"  # its Python started, however loaded the machine
        time.sleep(1)  # five looks at its links
        assert state_of(port)["state"] == "waiting", "a poll of the head's watchdog was taken for vLLM's link"
        links.append(socket.create_connection(listener.getsockname()))  # vLLM's connection to the head
        assert wait_for(lambda: (state_of(port) or {}).get("joined") == head.session)
        assert state_of(port)["state"] == "joined" and vllm.poll() is None
        head.session = "b" * 32  # the head restarted: same address, a new session
        assert wait_for(lambda: vllm.poll() is not None), "the worker stayed in a session that is gone"
        process.wait(timeout=10)
        assert "the head runs a new session bbbbbbbb (this worker joined aaaaaaaa)" in process.stderr.read()
    finally:
        for each in (*links, listener):
            each.close()
        process.kill()
        head.server.shutdown()


class FakeWorker:
    """A worker watchdog's status endpoint on ``address``, whose state can change: to ``then`` as
    it gives its first answer, when that is given. ``asked`` counts the requests."""

    def __init__(self, address: str, port: int, state: str = "joined", then: str | None = None):
        self.state, self.then, self.session, self.asked = state, then, "c" * 32, 0
        lock, worker = threading.Lock(), self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                with lock:
                    worker.asked += 1
                    state, worker.state = worker.state, worker.then or worker.state
                data = json.dumps({"role": "worker", "session": worker.session, "state": state, "joined": None}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = QuietServer((address, port), Handler)
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()  # shutdown() in 0.05 s, not 0.5


def test_a_head_waits_for_a_fresh_worker_only(tmp_path):
    """wait-for-worker returns once the worker says it is waiting (a fresh start): not at its
    first answer (joined: still in an old session), at the next (waiting)."""
    port = free_port()
    worker = FakeWorker("127.0.0.2", port, "joined", then="waiting")
    process = watchdog("wait-for-worker", "--worker-ip", "127.0.0.2", "--port", str(port), "--timeout", "60")
    try:
        process.wait(timeout=15)
        assert worker.asked == 2, "the head started vLLM with the worker still in an old session"
        assert "the worker is waiting: starting vLLM" in process.stderr.read()
    finally:
        process.kill()
        worker.server.shutdown()


def test_a_worker_starts_vllm_only_once_the_heads_is_loading():
    """wait-for-head returns neither while the old head still serves nor while the new one waits
    for its workers: only once the head's vLLM is loading, so the worker's rank meets the head's
    rendezvous without a long backoff."""
    port = free_port()
    head = FakeHead(port)
    process = watchdog("wait-for-head", "--head-ip", HEAD_IP, "--port", str(port), "--timeout", "60")
    try:
        time.sleep(1)
        head.session, head.state = "b" * 32, "waiting"
        time.sleep(1)
        assert process.poll() is None, "the worker started vLLM before the head's"
        head.state = "loading"
        process.wait(timeout=5)
        assert "the head's vLLM is loading: starting vLLM" in process.stderr.read()
    finally:
        process.kill()
        head.server.shutdown()


def test_the_head_says_loading_once_its_launch_script_has_execd_vllm(tmp_path):
    """The head's watchdog waits (for its workers) while launch.sh, a shell, runs; once the shell
    has exec'd vLLM in the same process it says "loading"."""
    launch = subprocess.Popen(["sh", "-c", "read go; exec sleep 300"], stdin=subprocess.PIPE, text=True)
    api, port, key = FakeApi(), free_port(), tmp_path / "key"
    api.mode = "dead"
    key.write_text("secret")
    process = watchdog("head", "--ip", "127.0.0.1", "--port", str(port), "--url", api.url, "--key-file", str(key),
                       "--pid", str(launch.pid), "--interval", "0.2", "--state", str(tmp_path / "head-starts"))
    try:
        assert wait_for(lambda: state_of(port) is not None)
        time.sleep(0.5)
        assert state_of(port)["state"] == "waiting", "the head said loading while its launch script still waited"
        launch.stdin.write("go\n")
        launch.stdin.flush()
        assert wait_for(lambda: state_of(port)["state"] == "loading", 5)
    finally:
        process.kill()
        launch.kill()
        launch.wait()


def test_a_head_waits_for_every_worker_as_its_launch_script_does(tmp_path):
    """The head's launch.sh runs wait-for-worker for each worker in rank order: vLLM starts only
    when both are fresh, whichever was last."""
    port = free_port()
    workers = [FakeWorker("127.0.0.2", port, "waiting"), FakeWorker("127.0.0.3", port, "joined", then="waiting")]
    waits = "; ".join(f"{sys.executable} {ARCHIVE} watchdog wait-for-worker --worker-ip 127.0.0.{n} --port {port} --timeout 60"
                      for n in (2, 3))
    process = subprocess.Popen(["sh", "-c", f"set -e; {waits}; echo started vLLM >&2"], stderr=subprocess.PIPE, text=True)
    try:
        process.wait(timeout=15)
        assert [worker.asked for worker in workers] == [1, 2], "the head started vLLM with its second worker still in an old session"
        said = process.stderr.read()
        assert said.count("the worker is waiting: starting vLLM") == 2 and said.endswith("started vLLM\n"), said
    finally:
        process.kill()
        for worker in workers:
            worker.server.shutdown()


def test_every_worker_leaves_a_head_session_that_is_gone(tmp_path):
    """Two workers join the head's session; a new head session ends both their vLLMs."""
    port = free_port()
    head = FakeHead(port)
    listener = socket.create_server((HEAD_IP, 0))  # the head's vLLM rendezvous
    link = socket.create_connection(listener.getsockname())  # the ranks' connection to it
    sleepers = [subprocess.Popen(["sleep", "300"]) for _ in range(2)]
    processes = [watchdog("worker", "--ip", f"127.0.0.{n}", "--head-ip", HEAD_IP, "--port", str(port),
                          "--pid", str(sleeper.pid), "--interval", "0.2", "--state", str(tmp_path / f"worker-{n}-starts"))
                 for n, sleeper in zip((3, 4), sleepers)]
    try:
        for n in (3, 4):
            assert wait_for(lambda n=n: (state_of(port, f"127.0.0.{n}") or {}).get("joined") == head.session)
        head.session = "b" * 32
        assert wait_for(lambda: all(sleeper.poll() is not None for sleeper in sleepers)), "a worker stayed in a session that is gone"
        for process in processes:
            process.wait(timeout=10)
            assert "the head runs a new session bbbbbbbb (this worker joined aaaaaaaa)" in process.stderr.read()
    finally:
        link.close()
        listener.close()
        for process, sleeper in zip(processes, sleepers):
            process.kill()
            sleeper.kill()
            sleeper.wait()
        head.server.shutdown()


@pytest.mark.parametrize("fault", ["restarted", "gone"])
def test_the_head_ends_vllm_at_once_when_a_worker_restarts_or_goes(vllm, tmp_path, fault):
    """A rank's collective can hang a request for minutes, so the head does not wait for its probe:
    a worker whose watchdog answers with a new session, or stops answering, ends the head's vLLM."""
    port = free_port()
    workers = [FakeWorker("127.0.0.2", port), FakeWorker("127.0.0.3", port)]
    api, key = FakeApi(), tmp_path / "key"
    key.write_text("secret")
    process = watchdog("head", "--ip", "127.0.0.1", "--port", str(port), "--url", api.url, "--key-file", str(key),
                       "--pid", str(vllm.pid), "--interval", "1", "--worker-interval", "0.2",
                       "--state", str(tmp_path / "head-starts"), "--worker-ip", "127.0.0.2", "--worker-ip", "127.0.0.3")
    try:
        assert wait_for(lambda: (state_of(port) or {}).get("state") == "serving"), "the head watchdog never saw a token"
        time.sleep(1)  # several rounds of the watch with both workers as they served
        assert vllm.poll() is None, "a worker in its session ended the head"
        if fault == "restarted":
            workers[1].session = "d" * 32
        else:
            workers[1].server.shutdown()
            workers[1].server.server_close()
        assert wait_for(lambda: vllm.poll() is not None, 10), "the head kept serving without its worker"
        process.wait(timeout=10)
        said = {"restarted": "the worker at 127.0.0.3 restarted (session dddddddd, it served in cccccccc)",
                "gone": "the worker at 127.0.0.3 has not answered 5 times in a row"}[fault]
        assert said in process.stderr.read()
    finally:
        process.kill()
        workers[0].server.shutdown()


def test_backoff_counts_the_restarts_of_one_container_and_serving_keeps_the_count(tmp_path):
    """Each start of the container runs backoff: the count file lives in the container's own layer,
    so Docker's restart finds it (one more) and a new container (a deploy's change) starts from 0."""
    state, layer = tmp_path / "head-starts", tmp_path / "layer"

    def start(container: Path) -> dict:
        container.mkdir(exist_ok=True)
        subprocess.run([sys.executable, str(ARCHIVE), "watchdog", "backoff", "--state", str(state),
                        "--container-starts", str(container / "starts")], check=True, timeout=30)
        return json.loads(state.read_text())

    assert start(layer) == {"failed_starts": 0, "healthy": False, "restarts": 0}
    healthy(str(state))
    assert json.loads(state.read_text()) == {"failed_starts": 0, "healthy": True, "restarts": 0}
    assert start(layer) == {"failed_starts": 0, "healthy": False, "restarts": 1}  # Docker restarted it after it served
    healthy(str(state))
    assert start(layer)["restarts"] == 2
    healthy(str(state))
    assert start(tmp_path / "new-layer")["restarts"] == 0  # a new container


def test_a_start_measured_is_kept_through_the_starts_after_it(tmp_path):
    """The head's start that served says how long it took; a start after it (a heal, a failed
    one) keeps that measure, from which a heal's expected time is judged, and the next that serves
    replaces it."""
    state = tmp_path / "head-starts"

    def start() -> dict:
        subprocess.run([sys.executable, str(ARCHIVE), "watchdog", "backoff", "--state", str(state),
                        "--container-starts", str(tmp_path / "starts")], check=True, timeout=30)
        return json.loads(state.read_text())

    start()
    healthy(str(state), 412.04)
    assert start() == {"failed_starts": 0, "healthy": False, "restarts": 1, "last_start_seconds": 412.0}
    healthy(str(state), 380)
    assert json.loads(state.read_text())["last_start_seconds"] == 380


def test_the_status_says_the_planned_work_marked_and_when_it_stops_counting(tmp_path):
    """`watchdog status --planned`: the deploy's mark (planned.py) judged by this node's clock:
    in force while the run holds it; one past its end is shown, not in force; none is None."""
    mark, port = tmp_path / "planned-work", str(free_port())

    def planned() -> dict | None:
        done = subprocess.run([sys.executable, str(ARCHIVE), "watchdog", "status", "--ip", "127.0.0.1", "--port", port, "--state",
                               str(tmp_path / "head-starts"), "--planned", str(mark)], check=True, timeout=30, capture_output=True, text=True)
        return json.loads(done.stdout)["planned"]

    def run(*args: str) -> None:
        subprocess.run([sys.executable, str(ARCHIVE), "planned", *args, "--file", str(mark)], check=True, timeout=30)

    assert planned() is None
    run("begin", "--seconds", "600", "--what", "profile fast")
    first = planned()
    assert first["in_force"] and first["what"] == "profile fast" and 0 <= first["age_seconds"] <= 5
    assert 595 <= first["until"] - time.time() <= 600
    run("begin", "--seconds", "900", "--what", "rollback")  # extended: it keeps its start
    assert planned()["since"] == first["since"] and planned()["what"] == "rollback"
    mark.write_text(json.dumps({**first, "until": time.time() - 1}))  # a run that died: its mark expired
    assert planned()["in_force"] is False
    run("end")
    assert planned() is None and not mark.exists()
