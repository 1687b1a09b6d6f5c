"""The front door's side of a planned stop, through HAProxy's runtime API (its stats socket).

    door stop --socket S --drain SECONDS -- COMMAND...
        Drain vLLM at the door (new requests are held there, hold.lua), wait up to SECONDS for
        the requests in flight to finish, and run COMMAND (the stop). vLLM stays drained: the
        requests held wait for `door open`, which the change runs once its new state has served
        and passed its canaries (or the state before is back), so that no client is answered by
        a state the canaries refuse. Where COMMAND fails, vLLM is made ready again at once. Exits
        with COMMAND's status. Where there is no door yet (no socket): COMMAND alone.
    door open --socket S
        Make vLLM ready at the door: the requests held go on, tried each second until vLLM
        takes them. A door left drained by a run that never got here opens by itself once the
        change's time has lapsed (hold.lua).
    door state --socket S [--counts URL]
        One JSON line: the door's view of vLLM (its state, its health as the door's check sees
        it, requests in flight, the requests it retried and those it answered with an error; with
        URL, its counts, the requests held now and the oldest one's wait), or {"door": null}
        without a door.
    door keys --deploy-key F --clients DIR --map M --backend-map B [--socket S]
        Write the door's two maps (root's, mode 600, whole or not at all): M takes each key the
        door lets in to its client's name (the deploy's own key F as "deploy", each DIR/NAME.key
        as NAME), B the key the door hands vLLM (F). With a running door at S, its maps are
        replaced in memory too, in one commit: a key removed is refused from then on, not once a
        reload has ended. No key is ever printed.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from .atomic import write_atomically
from .secret import KEY_FIX, SecretError, read_secret

BACKEND, SERVER, HEALTH = "vllm", "vllm", "vllm_health"  # haproxy.cfg's names
KEY = re.compile(r"[A-Za-z0-9_-]{16,256}")  # secrets.token_urlsafe's alphabet: no space, so one map line each


def log(message: str) -> None:
    print(f"dual-spark door: {message}", file=sys.stderr, flush=True)


def ask(path: str, command: str, timeout: float = 10) -> str:
    """One command to the runtime API; its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        connection.settimeout(timeout)
        connection.connect(path)
        connection.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := connection.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def server_row(path: str, backend: str = BACKEND) -> dict:
    """vLLM's row of `show stat` in ``backend`` (HAProxy's CSV: scur in flight, status, wretr, eresp, ...)."""
    lines = ask(path, "show stat").lstrip("# ").splitlines()
    for row in csv.DictReader(lines):
        if row.get("pxname") == backend and row.get("svname") == SERVER:
            return row
    raise OSError(f"the door has no server {backend}/{SERVER}")


def set_state(path: str, state: str) -> None:
    answer = ask(path, f"set server {BACKEND}/{SERVER} state {state}").strip()
    if answer:
        raise OSError(f"the door refused 'state {state}': {answer}")


def stop(args) -> None:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        sys.exit("door stop: no command to run after the drain")
    if not os.path.exists(args.socket):
        log(f"no front door here ({args.socket}): stopping without a drain")
        sys.exit(subprocess.run(command).returncode)
    set_state(args.socket, "drain")
    code = 1
    try:
        deadline, flight = time.monotonic() + args.drain, int(server_row(args.socket)["scur"] or 0)
        log(f"drained: new requests wait at the door; {flight} in flight")
        while flight and time.monotonic() < deadline:
            time.sleep(0.5)
            flight = int(server_row(args.socket)["scur"] or 0)
        if flight:
            log(f"{flight} request(s) still in flight after {args.drain:g} s: stopping anyway, they fail once")
        else:
            log("no request in flight: stopping vLLM")
        code = subprocess.run(command).returncode
    finally:
        if code:
            set_state(args.socket, "ready")
            log("the stop failed: vLLM is ready at the door again")
    if not code:
        log("vLLM stopped: new requests wait at the door until the change has served and passed its canaries")
    sys.exit(code)


def open_door(args) -> None:
    if not os.path.exists(args.socket):
        log(f"no front door here ({args.socket}): nothing held")
        return
    try:
        set_state(args.socket, "ready")
    except ConnectionError:  # a socket left by a door that died: the one that starts is ready
        log(f"no door answers at {args.socket}: the next one to start is open")
        return
    except OSError as error:
        sys.exit(f"door open: the door at {args.socket} did not make vLLM ready: {error}. "
                 "Fix: `sudo systemctl reload haproxy` on the head (a reload starts with vLLM ready)")
    log("open: held requests go on as soon as vLLM takes them")


def state(args) -> None:
    if not os.path.exists(args.socket):
        print(json.dumps({"door": None}))
        return
    row = server_row(args.socket)

    def number(key: str) -> int:
        return int(row.get(key) or 0)

    health = server_row(args.socket, HEALTH)["status"]
    print(json.dumps({"door": {"status": row.get("status", ""), "health": health, "in_flight": number("scur"), "requests": number("stot"),
                               "retried": number("wretr"), "connection_errors": number("econ"), "response_errors": number("eresp"),
                               **(held(args.counts) if args.counts else {})}}))


HELD = {"dual_spark_door_held_requests": "held", "dual_spark_door_held_longest_seconds": "held_longest_seconds"}


def held(url: str) -> dict:
    """The requests held at the door now, and how long the oldest has waited, from its counts
    (counts.lua); None for each where they do not answer."""
    found: dict = dict.fromkeys(HELD.values())
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            text = response.read().decode()
    except OSError:
        return found
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in HELD:
            try:
                found[HELD[name]] = float(value)
            except ValueError:
                continue
    return found


def key_of(path: Path) -> str:
    """A key file's one line (read as a secret: no link, one line); refused naming the file, never its content."""
    try:
        text = read_secret(path, "the key", KEY_FIX)
    except SecretError as error:
        raise SystemExit(f"door keys: {error}") from None
    if not KEY.fullmatch(text):
        raise SystemExit(f"door keys: the key {path} is not 16 to 256 of letters, digits, '-' and '_'. {KEY_FIX}")
    return text


def loaded(path: str, name: str, lines: list[str]) -> bool:
    """Map ``name`` of the door running at ``path`` replaced by ``lines`` in one commit (a new
    version prepared, filled, then made current); False where that door has no such map (its
    configuration names it once it is reloaded)."""
    prepared = re.fullmatch(r"New version created: (\d+)", ask(path, f"prepare map {name}").strip())
    if not prepared:
        return False
    version = prepared.group(1)
    for line in lines:
        answer = ask(path, f"add map @{version} {name} {line}").strip()
        if answer:
            raise OSError(f"the door refused a line of {name}: {answer[:200]}")
    answer = ask(path, f"commit map @{version} {name}").strip()
    if answer:
        raise OSError(f"the door refused to commit {name}: {answer[:200]}")
    return True


def keys(args) -> None:
    deploy = key_of(Path(args.deploy_key))
    lines = [f"{deploy} deploy"]
    clients = Path(args.clients)
    for path in sorted(clients.glob("*.key")) if clients.is_dir() else []:
        lines.append(f"{key_of(path)} {path.stem}")
    maps = {args.map: lines, args.backend_map: [f"vllm {deploy}"]}
    for name, content in maps.items():
        write_atomically(Path(name), "\n".join(content) + "\n", 0o600)
    log(f"the door lets in {len(lines)} key(s): deploy" + "".join(f", {line.rsplit(' ', 1)[1]}" for line in lines[1:]))
    if not args.socket or not os.path.exists(args.socket):
        return
    try:
        unread = [name for name, content in maps.items() if not loaded(args.socket, name, content)]
    except ConnectionError:  # a socket left by a door that died: the one that starts reads the files
        log(f"no door answers at {args.socket}: the next one to start reads these keys")
        return
    except OSError as error:
        sys.exit(f"door keys: the running door at {args.socket} did not take the keys: {error}")
    if unread:
        log(f"the running door does not read {' or '.join(unread)} yet: it does once reloaded")
    else:
        log("the running door holds these keys from now on")


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="action", required=True)
    s = commands.add_parser("stop")
    s.add_argument("--socket", required=True)
    s.add_argument("--drain", type=float, required=True, help="seconds to wait for the requests in flight")
    s.add_argument("command", nargs=argparse.REMAINDER)
    o = commands.add_parser("open")
    o.add_argument("--socket", required=True)
    t = commands.add_parser("state")
    t.add_argument("--socket", required=True)
    t.add_argument("--counts", help="the URL of the door's counts (counts.lua), for the requests it holds")
    k = commands.add_parser("keys")
    k.add_argument("--deploy-key", required=True, help="the deploy's own key, which vLLM takes too")
    k.add_argument("--clients", required=True, help="a directory of NAME.key files, one a client")
    k.add_argument("--map", required=True)
    k.add_argument("--backend-map", required=True)
    k.add_argument("--socket", help="the running door's runtime API, whose maps are replaced too")
    args = parser.parse_args(argv)
    {"stop": stop, "open": open_door, "state": state, "keys": keys}[args.action](args)
