"""The sending side of a transfer: the worker's receiver started over SSH, then the chunks it
lacks sent over every reachable rail with parallel streams."""

from __future__ import annotations

import collections
import json
import secrets
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ..constants import FABRIC_CIPHER, SSH_OPTIONS
from ..progress import Progress
from .model import CHUNK, LABELS, SyncError, gib, parse_json, read_json, warn

SSH = ["ssh", *SSH_OPTIONS, "-c", FABRIC_CIPHER]


def send(root: Path, manifest_path: Path, peers: list[str], local: list[str], remote_dir: str, remote_state: str,
         streams: int, full: bool, remote_script: str, every: float | None = None) -> dict:
    started = time.monotonic()
    record = read_json(manifest_path) if str(manifest_path) != "-" else parse_json(sys.stdin.read())
    if not record:
        raise SyncError(f"no manifest at {manifest_path}: hash the model first (sync manifest)")
    control, via = None, None
    for peer in peers:
        command = [*SSH, peer, "python3", remote_script, "sync", "receive", "--dir", remote_dir, "--state", remote_state]
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        token = secrets.token_hex(16)
        try:
            process.stdin.write(json.dumps({"manifest": record, "full": full, "token": token,
                                            "listen": [p.split("@")[-1] for p in peers]}) + "\n")
            process.stdin.flush()
            reply = process.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if reply:
            control, via = process, peer
            break
        try:
            code = process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            code = 255
        if code != 255:  # ssh itself exits 255; anything else is the receiver's own exit
            raise SyncError(f"model_sync on the worker failed at {peer.split('@')[-1]} (exit {code}); its error is above")
        warn(f"the worker does not answer over SSH at {peer.split('@')[-1]}; trying the next rail")
    if control is None:
        raise SyncError(f"the worker answers on no rail ({', '.join(p.split('@')[-1] for p in peers)}): "
                        "run `pyinfra inventory.py tasks/verify.py` to see which link is down")
    plan = json.loads(reply)
    if "error" in plan:
        raise SyncError(plan["error"])
    needed = [(name, index) for name, index in plan["needed"]]
    total = sum(chunk_length(record, name, index) for name, index in needed)
    routes = []
    for mine, peer in zip(local, peers):
        address = peer.split("@")[-1]
        if address in plan["ports"]:
            routes.append((mine, address, plan["ports"][address]))
    if plan.get("removed"):
        warn(f"removed {len(plan['removed'])} file(s) the model does not have from the worker: {', '.join(plan['removed'][:5])}")
    sent = {"bytes": 0, "by_rail": {}}
    failed = None
    try:
        if needed:
            with Progress(LABELS["send"][0], total, every, measure=lambda: sent["bytes"]):
                transfer(root, record, needed, routes, streams, token, sent)
    except SyncError as error:
        failed = str(error)
        control.stdin.close()  # the worker stops too, and says why if it was its fault
    result = json.loads(control.stdout.readline() or '{"error": "the worker hung up"}')
    if not control.stdin.closed:
        control.stdin.close()
    control.wait(timeout=60)
    causes = [cause for cause in (result.get("error"), failed) if cause and not (cause == "interrupted" and failed)]
    if causes:
        raise SyncError(f"transfer interrupted after {gib(sent['bytes'])} of {gib(total)}: {'; '.join(causes)}. "
                        "Run the deploy again: it resumes where this stopped.")
    seconds = time.monotonic() - started
    return {"bytes": sent["bytes"], "chunks": len(needed), "files": len({name for name, _ in needed}),
            "seconds": round(seconds, 3), "rails": len(sent["by_rail"]), "via": via, "bytes_by_rail": sent["by_rail"],
            "gib_per_s": round(sent["bytes"] / (1 << 30) / seconds, 3) if sent["bytes"] else 0.0}


def chunk_length(record: dict, name: str, index: int) -> int:
    return max(0, min(CHUNK, record["files"][name]["size"] - index * CHUNK))



def transfer(root: Path, record: dict, needed: list, routes: list, streams: int, token: str, sent: dict) -> None:
    """Chunks, largest files first, dealt in turn to the reachable rails and sent over ``streams``
    connections on each. A stream whose rail has nothing left takes, from the back of another
    rail's share, only what that rail's streams cannot start now: every rail carries its part,
    a slower one is helped, and a rail whose streams are gone leaves all of its share to the others."""
    if not routes:
        raise SyncError("the worker could listen on none of its rail addresses")
    shares: list[collections.deque] = [collections.deque() for _ in routes]
    for position, (name, index) in enumerate(sorted(needed, key=lambda job: -record["files"][job[0]]["size"])):
        shares[position % len(routes)].append((name, index, 0))
    lock = threading.Lock()
    connected = [0] * len(routes)  # the live streams of each rail
    settled = threading.Semaphore(0)  # one release per stream, connected or failed
    outstanding = {"chunks": len(needed)}
    failures: list[str] = []
    corrupted: list[str] = []  # a chunk the sender's copy cannot give right: the transfer stops

    def take(rail: int):
        with lock:
            if shares[rail]:
                return shares[rail].popleft()
            for other, share in enumerate(shares):
                if len(share) > connected[other]:
                    return share.pop()
        return None

    def stream(rail: int, local: str, address: str, port: int) -> None:
        try:
            connection = socket.create_connection((address, port), timeout=30, source_address=(local, 0))
        except OSError as error:
            failures.append(f"{address}: {error}")
            settled.release()
            return
        with lock:
            connected[rail] += 1
        settled.release()
        gate.wait()
        with connection:
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            reader = connection.makefile("rb")
            connection.sendall(token.encode() + b"\n")
            while outstanding["chunks"]:
                job = take(rail)
                if job is None:
                    time.sleep(0.1)
                    continue
                name, index, attempt = job
                length = chunk_length(record, name, index)
                try:
                    connection.sendall(json.dumps({"file": name, "index": index, "length": length}).encode() + b"\n")
                    with open(root / name, "rb") as handle:
                        connection.sendfile(handle, offset=index * CHUNK, count=length)
                    answer = reader.readline()
                except OSError as error:
                    with lock:
                        connected[rail] -= 1
                        shares[rail].appendleft(job)
                    failures.append(f"{address}: {error}")
                    return
                if answer == b"ok\n":
                    with lock:
                        sent["bytes"] += length
                        sent["by_rail"][address] = sent["by_rail"].get(address, 0) + length
                        outstanding["chunks"] -= 1
                elif attempt < 2:
                    with lock:
                        shares[rail].append((name, index, attempt + 1))
                else:
                    corrupted.append(f"{name} chunk {index} arrives corrupted at {address} every time")
                    failures.append(corrupted[-1])
                    with lock:
                        outstanding["chunks"] = 0
                    return

    # Work starts once every stream has connected or failed (or after 2 s: a rail whose connections
    # hang counts as gone), so that no rail's share is taken while its streams are still connecting.
    gate = threading.Event()
    live = [threading.Thread(target=stream, args=(rail, *route), daemon=True)
            for rail, route in enumerate(routes) for _ in range(streams)]
    for thread in live:
        thread.start()
    deadline = time.monotonic() + 2
    for _ in live:
        settled.acquire(timeout=max(0.0, deadline - time.monotonic()))
    gate.set()
    for thread in live:
        thread.join()
    if corrupted or any(shares) or outstanding["chunks"] or (failures and not sent["bytes"]):
        raise SyncError("; ".join(sorted(set(failures)))[:500] or "no stream could send")
    for failure in sorted(set(failures)):
        warn(f"a stream failed and its chunks went over the others: {failure}")

