"""Keeps a multi-node vLLM (a head and its workers) serving without a person. Runs inside each
node's container beside vLLM (started by launch.sh) and ends vLLM, so that Docker restarts the
container, when this side can no longer serve. What multi-node vLLM does when a rank dies (the
lab's trials):

- a worker dies: the head's /health still answers 200 for minutes, and with more than one worker
  a request waits on the dead rank's collective for minutes instead of failing. So the head
  watches every worker's watchdog: one that answers with another session (it restarted) or not
  at all WORKER_SILENCE times in a row ends the head's vLLM at once. And the head generates one
  token every --interval seconds, ending its vLLM after two failures in a row during which the
  engine finished no step (see engine_state).
- a rank freezes (a hung GPU; SIGSTOP on the lab): it lives, holds its sockets and its watchdog
  answers, but every step waits on it, so a request hangs while /metrics still answers, frozen.
  The head ends its vLLM once a request has waited --stall seconds with no step finished: its
  own probe, or what vLLM counts as running or waiting. A busy engine finishes steps: a long
  prefill fills the KV cache chunk by chunk before any token counter moves.
- the head dies: a headless worker does not notice for minutes, and a new head waits for ever
  for a fresh worker. So each container's watchdog has a session of its own (a random ID, made at
  its start), served beside its state on the fabric; a worker records the head session it joined
  and ends its vLLM as soon as the head serves another one.
- a head must not start vLLM while a worker still belongs to an old session: it waits until
  every worker says it is waiting (fresh), then starts.
- a worker must not start vLLM long before the head: its rank retries the head's rendezvous with
  a backoff that grows by half each time (torch's TCPStore client), so a worker that waited a
  minute joins up to half a minute after the head is ready. A fresh worker waits until the head's
  watchdog says its vLLM is loading, then starts.
- vLLM ended by the watchdog is killed at once: the container restarts and nothing of the old run
  is kept, while vLLM's own shutdown waits about ten seconds on ranks stuck in a collective.

The head's watchdog says "waiting" (for fresh workers), "loading" (launch.sh has exec'd vLLM),
then "serving", "busy" or "failing"; a worker's says "waiting", then "joined".

Every status endpoint listens on the node's own fabric address only and carries no secret.

    watchdog head --ip HEAD_RAIL_IP --port P --url URL --key-file F --pid PID --state FILE
                  [--worker-ip WORKER_RAIL_IP ...]
    watchdog worker --ip WORKER_RAIL_IP --head-ip HEAD_RAIL_IP --port P --pid PID --state FILE
    watchdog wait-for-worker --worker-ip WORKER_RAIL_IP --port P --timeout S
    watchdog wait-for-head --head-ip HEAD_RAIL_IP --port P --timeout S
    watchdog backoff --state FILE --container-starts FILE
                                             (waits before a start when the last ones never served,
                                             and counts this container's restarts into FILE)
    watchdog check --ip RAIL_IP --port P     (Docker's health check: is this side serving?)
    watchdog status --ip RAIL_IP --port P --state FILE [--planned FILE]
                                             (one JSON line, for `tasks/status.py`)
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import urllib.request
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from . import planned
from .health import WAITING, engine_state

FAILURES_TO_RESTART = 2
WORKER_SILENCE = 5  # unanswered polls of a worker's watchdog, about 1 s apart
POLL = 0.5  # seconds between two looks at a peer while waiting for it
SHELLS = ("sh", "dash", "bash")  # what runs launch.sh before it execs vLLM


def log(message: str) -> None:
    print(f"dual-spark watchdog: {message}", file=sys.stderr, flush=True)


class Status:
    """This side's state, served as JSON on the fabric address."""

    def __init__(self, role: str):
        self.value = {"role": role, "session": uuid.uuid4().hex, "state": "waiting", "joined": None}
        self.lock = threading.Lock()

    def update(self, **changes) -> None:
        with self.lock:
            self.value.update(changes)

    def advance(self, before: str, after: str) -> None:
        """Set the state to ``after`` only if it is still ``before``."""
        with self.lock:
            if self.value["state"] == before:
                self.value["state"] = after

    def serve(self, address: str, port: int) -> None:
        status = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                with status.lock:
                    body = json.dumps(status.value).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        server = ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()


def peer_status(address: str, port: int, timeout: float = 3) -> dict | None:
    try:
        with urllib.request.urlopen(f"http://{address}:{port}/", timeout=timeout) as response:
            return json.loads(response.read())
    except (OSError, ValueError):
        return None


def end(pid: int, why: str) -> None:
    """Kill vLLM (the container's main process) at once: Docker restarts the container."""
    log(f"ending vLLM: {why}")
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(0)  # from whichever thread noticed


def loading(pid: int, status: Status) -> None:
    """Say "loading" once launch.sh (a shell) has exec'd vLLM in its process."""
    while True:
        try:
            program = os.path.basename(os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            return
        if program not in SHELLS:
            status.advance("waiting", "loading")
            return
        time.sleep(0.1)


def connections_to(address: str, besides: int) -> int:
    """Established TCP connections of this container's processes to ``address`` (IPv4), on any
    port but ``besides`` (the watchdogs' own, which wait-for-head polls), read from /proc: the
    sockets of the processes this PID namespace shows."""
    ours = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    ours.add(target[8:-1])
        except OSError:
            continue
    wanted = "".join(f"{int(octet):02X}" for octet in reversed(address.split(".")))
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        remote, state, inode = fields[2], fields[3], fields[9]
        host, port = remote.split(":")
        if state == "01" and host == wanted and int(port, 16) != besides and inode in ours:
            count += 1
    return count


def generates(url: str, key: str) -> bool:
    """One token through the API: the only proof that both ranks work."""
    def call(path: str, body: dict | None) -> dict:
        request = urllib.request.Request(url + path, data=json.dumps(body).encode() if body else None,
                                         headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            return json.loads(response.read())

    try:
        model = call("/v1/models", None)["data"][0]["id"]
        answer = call("/v1/completions", {"model": model, "prompt": "ok", "max_tokens": 1, "temperature": 0})
        return answer.get("usage", {}).get("completion_tokens", 0) >= 1
    except (OSError, ValueError, KeyError, IndexError):
        return False


def generated(url: str, serving: threading.Event) -> None:
    """Set ``serving`` once the engine has generated a token: the probe's, or any request's that
    vLLM counts. The watches start there, not at the probe's own first token, which can come
    seconds after a client's: a rank frozen in between would be found only at the start-up timeout.
    Not before it: a first step may compile kernels for minutes with no step finished."""
    while not serving.is_set():
        seen = engine_state(url)
        if seen is not None and seen["vllm:generation_tokens_total"] > 0:
            serving.set()
        serving.wait(1)


def watch_progress(args, serving: threading.Event, asking: threading.Event) -> None:
    """From the engine's first token on: end the head's vLLM when a request has waited --stall
    seconds and the engine finished no step meanwhile. A request waits while the probe asks
    (/metrics still says what it said before a frozen step) or while vLLM counts one running or
    waiting."""
    serving.wait()
    last, since = None, time.monotonic()
    while True:
        time.sleep(1)
        now, seen = time.monotonic(), engine_state(args.url)
        waiting = asking.is_set() or (seen is not None and sum(seen[name] for name in WAITING) > 0)
        if not waiting or (seen is not None and seen != last):
            since = now
        last = seen or last
        if now - since >= args.stall:
            end(args.pid, f"a request has waited {now - since:.0f} s and the engine finished no step: "
                          "a rank is frozen")


def watch_workers(args, serving: threading.Event) -> None:
    """From the engine's first token on: end the head's vLLM when a worker restarted (its watchdog answers
    with another session) or is gone (no answer WORKER_SILENCE times in a row)."""
    serving.wait()
    sessions, silent = {}, dict.fromkeys(args.worker_ip, 0)
    while True:
        for address in args.worker_ip:
            theirs = peer_status(address, args.port)
            if theirs is None:
                silent[address] += 1
                if silent[address] >= WORKER_SILENCE:
                    end(args.pid, f"the worker at {address} has not answered {silent[address]} times in a row")
                continue
            silent[address] = 0
            joined = sessions.setdefault(address, theirs["session"])
            if theirs["session"] != joined:
                end(args.pid, f"the worker at {address} restarted (session {theirs['session'][:8]}, "
                              f"it served in {joined[:8]})")
        time.sleep(args.worker_interval)


def head(args) -> None:
    status = Status("head")
    status.serve(args.ip, args.port)
    key = Path(args.key_file).read_text().strip()
    serving, asking = threading.Event(), threading.Event()
    threading.Thread(target=watch_workers, args=(args, serving), daemon=True).start()
    threading.Thread(target=watch_progress, args=(args, serving, asking), daemon=True).start()
    threading.Thread(target=loading, args=(args.pid, status), daemon=True).start()
    threading.Thread(target=generated, args=(args.url, serving), daemon=True).start()
    started, failures, served, work = time.monotonic(), 0, False, None
    while True:
        time.sleep(args.interval if served else min(2, args.interval))  # the first token is noticed at once
        asking.set()
        ok = generates(args.url, key)
        asking.clear()
        before, work = work, engine_state(args.url)
        if ok:
            failures = 0
            if not served:
                served = True
                serving.set()
                took = time.monotonic() - started
                log(f"serving after {took:.0f} s")
                healthy(args.state, took)
            status.update(state="serving")
        elif served and before is not None and work is not None and work != before:
            failures = 0
            status.update(state="busy")  # no token for the probe, but the engine works: a long request holds it
        elif served:
            failures += 1
            status.update(state="failing")
            if failures >= FAILURES_TO_RESTART:
                end(args.pid, f"no token generated {failures} times in a row and the engine finished no step: "
                              "the worker or the engine is gone")
        elif time.monotonic() - started > args.startup_timeout:
            end(args.pid, f"not serving {args.startup_timeout:.0f} s after the start")


def worker(args) -> None:
    status = Status("worker")
    status.serve(args.ip, args.port)
    joined = None
    while True:
        time.sleep(args.interval)
        theirs = peer_status(args.head_ip, args.port)
        if joined is None:
            if theirs and connections_to(args.head_ip, besides=args.port):
                joined = theirs["session"]
                status.update(state="joined", joined=joined)
                healthy(args.state)
                log(f"joined the head's session {joined[:8]}")
        elif theirs and theirs["session"] != joined:
            end(args.pid, f"the head runs a new session {theirs['session'][:8]} (this worker joined {joined[:8]})")


def wait_for_state(address: str, port: int, state: str, timeout: float, found: str, missing: str) -> None:
    """Return once the watchdog at ``address`` says ``state``, or after ``timeout`` s, saying which."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        theirs = peer_status(address, port)
        if theirs and theirs["state"] == state:
            log(found)
            return
        time.sleep(POLL)
    log(f"{missing} after {timeout:.0f} s: starting vLLM anyway")


def wait_for_worker(args) -> None:
    """The head starts vLLM only with a fresh worker waiting for it."""
    wait_for_state(args.worker_ip, args.port, "waiting", args.timeout,
                   "the worker is waiting: starting vLLM", "no fresh worker")


def wait_for_head(args) -> None:
    """A fresh worker starts vLLM once the head's is loading, so that its rank does not back off
    from a rendezvous that is not there yet."""
    wait_for_state(args.head_ip, args.port, "loading", args.timeout,
                   "the head's vLLM is loading: starting vLLM", "the head's vLLM is not loading")


def record(state: Path, **values) -> None:
    state.parent.mkdir(parents=True, exist_ok=True)
    state.write_text(json.dumps(values))


def last_record(state: Path) -> dict:
    try:
        last = json.loads(state.read_text())
    except (OSError, ValueError):
        return {}
    return last if isinstance(last, dict) else {}


def healthy(state: str, took: float | None = None) -> None:
    """This run served (or joined): the next start owes no backoff. The head records how long its
    start took to serve (``took`` seconds), from which a heal's expected time is judged."""
    measured = {"last_start_seconds": round(took, 1)} if took is not None else {}
    record(Path(state), **{**last_record(Path(state)), "failed_starts": 0, "healthy": True, **measured})


def restarted(starts: Path) -> int:
    """How many times Docker started this container again (the watchdog ending vLLM, a crash):
    counted in a file of the container's own layer, which a restart keeps and a new container (a
    deploy's change) starts without. The metrics collector reads it from the backoff record, so
    that it needs no access to Docker."""
    try:
        count = int(starts.read_text()) + 1
    except (OSError, ValueError):
        count = 0
    starts.write_text(str(count))
    return count


def backoff(args) -> None:
    """A side that keeps failing to come up waits longer before each start (10 s, doubling, at
    most 5 min), so it does not hammer the other; a run that served resets it. Restarts the
    watchdog asks for after a healthy run start at once. The last start's measured time is kept."""
    state = Path(args.state)
    last = last_record(state) or {"failed_starts": 0, "healthy": True}
    failed = 0 if last.get("healthy") else last.get("failed_starts", 0) + 1
    measured = {"last_start_seconds": last["last_start_seconds"]} if "last_start_seconds" in last else {}
    record(state, failed_starts=failed, healthy=False, restarts=restarted(Path(args.container_starts)), **measured)
    if failed:
        delay = min(300, 10 * 2 ** (failed - 1))
        log(f"the last {failed} start(s) never served: waiting {delay} s before starting again")
        time.sleep(delay)


def check(args) -> None:
    mine = peer_status(args.ip, args.port)
    sys.exit(0 if mine and mine["state"] in ("serving", "busy", "joined") else 1)


def status(args) -> None:
    """This side's live state (None when no watchdog answers), its backoff record, and the planned
    work marked on it (planned.py's, judged by this node's clock; None without a mark)."""
    try:
        starts = json.loads(Path(args.state).read_text())
    except (OSError, ValueError):
        starts = None
    work = planned.reading(Path(args.planned), time.time()) if args.planned else None
    print(json.dumps({"live": peer_status(args.ip, args.port), "starts": starts, "planned": work}))


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    h = commands.add_parser("head")
    h.add_argument("--ip", required=True)
    h.add_argument("--port", type=int, required=True)
    h.add_argument("--url", required=True)
    h.add_argument("--key-file", required=True)
    h.add_argument("--pid", type=int, required=True)
    h.add_argument("--interval", type=float, default=5, help="seconds between two probes")
    h.add_argument("--stall", type=float, default=20, help="seconds a request may wait on an engine that finishes no step")
    h.add_argument("--startup-timeout", type=float, default=1800)
    h.add_argument("--state", required=True, help="the backoff's state file")
    h.add_argument("--worker-ip", action="append", default=[], help="a worker's rail address (repeated)")
    h.add_argument("--worker-interval", type=float, default=1)
    w = commands.add_parser("worker")
    w.add_argument("--ip", required=True)
    w.add_argument("--head-ip", required=True)
    w.add_argument("--port", type=int, required=True)
    w.add_argument("--pid", type=int, required=True)
    w.add_argument("--interval", type=float, default=1)
    w.add_argument("--state", required=True, help="the backoff's state file")
    f = commands.add_parser("wait-for-worker")
    f.add_argument("--worker-ip", required=True)
    f.add_argument("--port", type=int, required=True)
    f.add_argument("--timeout", type=float, default=600)
    g = commands.add_parser("wait-for-head")
    g.add_argument("--head-ip", required=True)
    g.add_argument("--port", type=int, required=True)
    g.add_argument("--timeout", type=float, default=600)
    b = commands.add_parser("backoff")
    b.add_argument("--state", required=True)
    b.add_argument("--container-starts", required=True, help="a file in the container's own layer, not a volume")
    c = commands.add_parser("check")
    c.add_argument("--ip", required=True)
    c.add_argument("--port", type=int, required=True)
    s = commands.add_parser("status")
    s.add_argument("--ip", required=True)
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--state", required=True)
    s.add_argument("--planned", help="the mark of planned work (planned.py), on the head")
    args = parser.parse_args(argv)
    {"head": head, "worker": worker, "wait-for-worker": wait_for_worker, "wait-for-head": wait_for_head, "backoff": backoff, "check": check,
     "status": status}[args.command](args)

