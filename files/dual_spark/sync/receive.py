#!/usr/bin/env python3
# Managed by the dual-spark deploy (tasks/runtime.py): edits here are overwritten.
"""The model's bytes, fetched once and copied to the worker over the fabric, verified.

    model_sync.py claim --dir D [--manifest M] [--state S]
        Make D a directory the deploy may clean: create it, or take it if it holds the marker
        .dual-spark-managed, is empty, or holds only what the deploy's records (the manifest M
        on the head, the verified record S on the worker) list; then write the marker. A
        directory holding anything else is refused, nothing touched.
    model_sync.py manifest --dir D --manifest M [--source JSON] [--full]
        Hash every file of D (SHA-256 of the whole file and of each 64 MiB chunk, files in
        parallel) into the manifest M. Files whose size and mtime match M are not hashed again
        (unless --full). Prints a JSON summary.
    model_sync.py status --dir D [--manifest M] --state S
        One JSON line: what is in D, whether it matches M (head) or the verified state S
        (worker) by size and mtime, and the free space.
    model_sync.py send --dir D --manifest M --peer USER@ADDR[,USER@ADDR] --local ADDR[,ADDR]
                  --remote-dir D --remote-state S [--streams N] [--full] [--remote-script PATH]
        Copy what the worker lacks over every reachable rail at once, with N parallel TCP
        streams per rail bound to the point-to-point fabric addresses (a random token admits
        them; SSH carries only the control messages). The worker checks each chunk's SHA-256 as
        it lands, writes files as *.dsp-part and renames them only when every chunk matches, then
        records them as verified. A cut transfer resumes: chunks already right are not sent again.
        A worker passes the model on down the chain from its verified copy the same way, the
        head's manifest on its stdin (--manifest -, sent along by the head).
    model_sync.py receive --dir D --state S
        The worker's side of send, started by it over SSH. It claims D first (see claim).

manifest and send take --progress SECONDS: then they print a progress line that often while
they run (progress.py, beside this file) and end with a summary line for people, not JSON.

Python 3.10+, standard library only: it runs on the Sparks' own Python.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from progress import Progress

CHUNK = 64 << 20
BLOCK = 4 << 20
PART = ".dsp-part"
MANIFEST_VERSION = 1
HASH_WORKERS = min(16, os.cpu_count() or 2)
SSH = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=5", "-c", "aes128-gcm@openssh.com"]
REMOTE_SCRIPT = "/var/lib/dual-spark/bin/model_sync.py"
MARKER = ".dual-spark-managed"
LABELS = {"manifest": ("hashing the model", "model hashed"), "send": ("replicating the model", "model replicated")}


class SyncError(Exception):
    """A problem with a message for the user; the program exits 1 with it."""


def gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def model_files(root: Path) -> list[str]:
    """Every regular file under root, relative, sorted; our partial files and hidden caches left out."""
    found = []
    for path in root.rglob("*"):
        relative = path.relative_to(root).as_posix()
        if path.is_file() and not path.name.endswith(PART) and not relative.startswith("."):
            found.append(relative)
    return sorted(found)


def hash_file(path: Path, progress: Progress | None = None) -> tuple[str, list[str]]:
    """SHA-256 of the whole file and of each CHUNK-sized piece, in one read."""
    whole = hashlib.sha256()
    chunks = []
    with open(path, "rb", buffering=0) as handle:
        while True:
            piece = hashlib.sha256()
            read = 0
            while read < CHUNK:
                block = handle.read(min(BLOCK, CHUNK - read))
                if not block:
                    break
                whole.update(block)
                piece.update(block)
                read += len(block)
                if progress is not None:
                    progress.add(len(block))
            if read == 0:
                break
            chunks.append(piece.hexdigest())
            if read < CHUNK:
                break
    return whole.hexdigest(), chunks or [hashlib.sha256(b"").hexdigest()]


def chunk_hashes(path: Path, size: int) -> list[str]:
    """SHA-256 of each chunk of the first ``size`` bytes of a (possibly partial) file."""
    hashes = []
    with open(path, "rb", buffering=0) as handle:
        for offset in range(0, max(size, 1), CHUNK):
            piece = hashlib.sha256()
            remaining = min(CHUNK, size - offset)
            while remaining > 0:
                block = handle.read(min(BLOCK, remaining))
                if not block:
                    break
                piece.update(block)
                remaining -= len(block)
            hashes.append(piece.hexdigest())
    return hashes


def digest_of(files: dict) -> str:
    """One SHA-256 naming the whole model: path, size and hash of every file."""
    listing = "".join(f"{name}\0{entry['size']}\0{entry['sha256']}\n" for name, entry in sorted(files.items()))
    return hashlib.sha256(listing.encode()).hexdigest()


def write_json(path: Path, value: dict) -> None:
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(value, indent=1, sort_keys=True))
    os.replace(temporary, path)


def read_json(path: Path) -> dict | None:
    try:
        return parse_json(path.read_text())
    except OSError:
        return None


def parse_json(text: str) -> dict | None:
    try:
        return json.loads(text)
    except ValueError:
        return None


# -- claim (both) ----------------------------------------------------------------------------

def claim(root: Path, records: list[dict]) -> None:
    """Let the deploy clean root (delete what the model does not have, own it all) only if it
    made root: root carries its marker, or is new or empty, or holds only files its records
    (``{"files": {name: ...}}``: the head's manifest, the worker's verified record, the
    manifest being received) list, their partial copies and its own hidden files (an older
    version of the deploy wrote no marker). Then the marker is written; anything else is refused."""
    marker = root / MARKER
    if marker.is_file():
        return
    if root.exists() and not root.is_dir():
        raise SyncError(f"model_dir {root} is not a directory. Fix: move it away, or set model_dir in site.toml to another path.")
    root.mkdir(parents=True, exist_ok=True)
    listed = {name for record in records for name in record.get("files", {})}
    foreign = []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        ours = (relative.removesuffix(PART) in listed or relative.startswith((".dual-spark-", ".cache/huggingface/")))
        if not (path.is_dir() and not path.is_symlink()) and not ours:
            foreign.append(relative)
    if foreign:
        raise SyncError(
            f"{socket.gethostname()}: model_dir {root} holds files the deploy did not put there ({', '.join(foreign[:3])}"
            f"{', ...' if len(foreign) > 3 else ''}; {len(foreign)} in all) and no {MARKER} marker: the deploy deletes files "
            f"the model does not have from its model directory, so it leaves this one alone. Fix: move those files away "
            f"(or, to have the deploy copy a model from there, set model.path to it), or set model_dir in site.toml to "
            f"an empty or new directory.")
    marker.write_text("This directory is the dual-spark deploy's model directory: it deletes files here that the "
                      "model does not have.\n")


# -- manifest (head) -------------------------------------------------------------------------

def manifest(root: Path, out: Path, source: dict, full: bool, every: float | None = None) -> dict:
    started = time.monotonic()
    if not root.is_dir():
        raise SyncError(f"{root} is not a directory: nothing to hash")
    old = read_json(out) or {}
    reuse = {} if full or old.get("source") != source else old.get("files", {})
    files, todo = {}, []
    for name in model_files(root):
        stat = (root / name).stat()
        kept = reuse.get(name)
        if kept and kept["size"] == stat.st_size and kept["mtime_ns"] == stat.st_mtime_ns:
            files[name] = kept
        else:
            todo.append((name, stat))

    progress = Progress(LABELS["manifest"][0], sum(stat.st_size for _, stat in todo), every)

    def one(item):
        name, stat = item
        whole, chunks = hash_file(root / name, progress)
        return name, {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": whole, "chunks": chunks}

    with progress, ThreadPoolExecutor(HASH_WORKERS) as pool:
        files.update(pool.map(one, todo))
    record = {"version": MANIFEST_VERSION, "chunk_bytes": CHUNK, "source": source, "files": files, "digest": digest_of(files)}
    write_json(out, record)
    return {"files": len(files), "bytes": sum(f["size"] for f in files.values()), "hashed_files": len(todo),
            "hashed_bytes": sum(stat.st_size for _, stat in todo), "seconds": round(time.monotonic() - started, 3),
            "digest": record["digest"]}


# -- status (both) ---------------------------------------------------------------------------

def status(root: Path, manifest_path: Path | None, state_path: Path) -> dict:
    """What a node has, read without hashing: sizes and mtimes against what was recorded."""
    existing = root.is_dir()
    probe = root if existing else next((p for p in root.parents if p.exists()), Path("/"))
    reading = {"exists": existing, "free_bytes": shutil.disk_usage(probe).free, "manifest": None, "verified": None,
               "changed": []}
    if manifest_path is not None:
        record = read_json(manifest_path)
        if record:
            reading["manifest"] = {"digest": record["digest"], "files": len(record["files"]),
                                   "bytes": sum(f["size"] for f in record["files"].values()), "source": record.get("source")}
            reading["changed"] = changed(root, {name: (f["size"], f["mtime_ns"]) for name, f in record["files"].items()})
    state = read_json(state_path)
    if state:
        reading["verified"] = state["digest"]
        reading["changed"] = changed(root, {name: tuple(v) for name, v in state["files"].items()})
    return reading


def changed(root: Path, recorded: dict[str, tuple[int, int]]) -> list[str]:
    """Recorded files that are missing or whose size or mtime moved, and files not recorded."""
    moved = []
    for name, (size, mtime_ns) in recorded.items():
        try:
            stat = (root / name).stat()
        except OSError:
            moved.append(name)
            continue
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime_ns):
            moved.append(name)
    if root.is_dir():
        moved += [name for name in model_files(root) if name not in recorded]
    return sorted(moved)


# -- receive (worker) ------------------------------------------------------------------------

class Receiver:
    """The worker's side: plans what is missing, takes verified chunks from the streams."""

    def __init__(self, root: Path, state_path: Path):
        self.root, self.state_path = root, state_path
        self.lock = threading.Lock()
        self.fds: dict[str, int] = {}
        self.pending: dict[str, set[int]] = {}
        self.received = 0
        self.done = threading.Event()
        self.failure: str | None = None

    def plan(self, record: dict, full: bool, budget_check: bool = True) -> list[tuple[str, int]]:
        self.files = record["files"]
        self.digest = record["digest"]
        state = read_json(self.state_path) or {}
        claim(self.root, [record, state])
        trusted = {} if full or state.get("digest") != self.digest else state.get("files", {})
        self.removed = self._remove_strays()
        needed, growth = [], 0
        todo = []
        for name, entry in self.files.items():
            final, part = self.root / name, self.root / (name + PART)
            if not full and name in trusted and final.exists():
                stat = final.stat()
                if [stat.st_size, stat.st_mtime_ns] == list(trusted[name]):
                    continue
            if final.exists():
                final.rename(part)  # repaired in place below, renamed back when right
            if part.exists():
                todo.append(name)
            else:
                growth += entry["size"]
                self.pending[name] = set(range(len(entry["chunks"])))
        with ThreadPoolExecutor(HASH_WORKERS) as pool:
            for name, bad in zip(todo, pool.map(self._bad_chunks, todo)):
                growth += max(0, self.files[name]["size"] - (self.root / (name + PART)).stat().st_size)
                self.pending[name] = bad
        free = shutil.disk_usage(self.root).free
        if budget_check and growth > free:
            raise SyncError(f"{socket.gethostname()}: {self.root} has {gib(free)} free; the model needs {gib(growth)} more. "
                            "Fix: free space there, or set model_dir in site.toml to a disk with room.")
        for name, bad in self.pending.items():
            needed += [(name, index) for index in sorted(bad)]
        for name in self.pending:
            part = self.root / (name + PART)
            part.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, self.files[name]["size"])
            self.fds[name] = fd
        for name in [name for name, chunks in self.pending.items() if not chunks]:
            self._finish(name)  # already right: the record is written once the last of them is back in place
        return needed

    def _remove_strays(self) -> list[str]:
        """The copy mirrors the manifest: files the model does not have (an older model's shards,
        which vLLM would try to load) go, and so do our partial files of them."""
        strays = []
        for path in self.root.rglob("*"):
            relative = path.relative_to(self.root).as_posix()
            name = relative.removesuffix(PART)
            if path.is_file() and not relative.startswith(".") and name not in self.files:
                path.unlink()
                strays.append(relative)
        return strays

    def _bad_chunks(self, name: str) -> set[int]:
        entry, part = self.files[name], self.root / (name + PART)
        size = min(part.stat().st_size, entry["size"])
        have = chunk_hashes(part, size) if size else []
        expected = entry["chunks"]
        return {i for i in range(len(expected)) if i >= len(have) or have[i] != expected[i]
                or (i + 1) * CHUNK > size and size < entry["size"]}

    def take(self, connection: socket.socket, reader) -> None:
        """One stream: header line, then the chunk's bytes, hashed and written as they arrive."""
        buffer = bytearray(BLOCK)
        view = memoryview(buffer)
        while True:
            header = reader.readline()
            if not header:
                return
            job = json.loads(header)
            name, index, length = job["file"], job["index"], job["length"]
            offset = index * CHUNK
            piece = hashlib.sha256()
            remaining = length
            fd = self.fds.get(name)  # None: a resent chunk of a file already complete
            while remaining:
                got = reader.readinto(view[:min(BLOCK, remaining)])
                if not got:
                    raise ConnectionError("stream ended inside a chunk")
                piece.update(view[:got])
                if fd is not None:
                    os.pwrite(fd, view[:got], offset + length - remaining)
                remaining -= got
            good = piece.hexdigest() == self.files[name]["chunks"][index]
            connection.sendall(b"ok\n" if good else b"bad\n")
            if good and fd is not None:
                with self.lock:
                    self.received += length
                    self.pending[name].discard(index)
                    if not self.pending[name]:
                        self._finish(name)

    def _finish(self, name: str) -> None:
        fd = self.fds.pop(name)
        os.fsync(fd)
        os.close(fd)
        os.replace(self.root / (name + PART), self.root / name)
        if all(not chunks for chunks in self.pending.values()) and not self.fds:
            self._record()
            self.done.set()

    def _record(self) -> None:
        files = {}
        for name in self.files:
            stat = (self.root / name).stat()
            files[name] = [stat.st_size, stat.st_mtime_ns]
        write_json(self.state_path, {"digest": self.digest, "files": files})


def receive(root: Path, state_path: Path) -> None:
    """Control messages on stdin/stdout (JSON lines); data on TCP streams over the rails."""
    request = json.loads(sys.stdin.readline())
    receiver = Receiver(root, state_path)
    try:
        needed = receiver.plan(request["manifest"], request["full"])
    except SyncError as error:
        print(json.dumps({"error": str(error)}), flush=True)
        return
    listeners, ports = [], {}
    for address in request["listen"]:
        try:
            listener = socket.create_server((address, 0), backlog=64)
        except OSError:
            continue
        listeners.append(listener)
        ports[address] = listener.getsockname()[1]
    print(json.dumps({"needed": needed, "ports": ports, "removed": receiver.removed}), flush=True)
    if not needed:
        try:
            receiver._record()
        except OSError as error:
            print(json.dumps({"error": f"{socket.gethostname()}: {error}"}), flush=True)
            return
        print(json.dumps({"done": {"bytes": 0}}), flush=True)
        return
    token = request["token"].encode()

    def serve(connection: socket.socket) -> None:
        with connection:
            reader = connection.makefile("rb", buffering=BLOCK)
            if reader.readline().strip() != token:
                return
            try:
                receiver.take(connection, reader)
            except (ConnectionError, TimeoutError):
                return  # this stream is gone; the sender sends its chunks over the others
            except (OSError, ValueError, KeyError) as error:  # a write here failed: the transfer stops, saying why
                receiver.failure = f"{socket.gethostname()}: {error}"
                receiver.done.set()

    def accept(listener: socket.socket) -> None:
        while not receiver.done.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=serve, args=(connection,), daemon=True).start()

    for listener in listeners:
        threading.Thread(target=accept, args=(listener,), daemon=True).start()
    # The sender hangs up the control channel when it gives up; then so do we.
    watcher = threading.Thread(target=lambda: (sys.stdin.read(), receiver.done.set()), daemon=True)
    watcher.start()
    receiver.done.wait()
    for listener in listeners:
        listener.close()
    complete = all(not chunks for chunks in receiver.pending.values())
    if receiver.failure or not complete:
        print(json.dumps({"error": receiver.failure or "interrupted"}), flush=True)
    else:
        print(json.dumps({"done": {"bytes": receiver.received}}), flush=True)


# -- send (head) -----------------------------------------------------------------------------

def send(root: Path, manifest_path: Path, peers: list[str], local: list[str], remote_dir: str, remote_state: str,
         streams: int, full: bool, remote_script: str = REMOTE_SCRIPT, every: float | None = None) -> dict:
    started = time.monotonic()
    record = read_json(manifest_path) if str(manifest_path) != "-" else parse_json(sys.stdin.read())
    if not record:
        raise SyncError(f"no manifest at {manifest_path}: hash the model first (model_sync.py manifest)")
    control, via = None, None
    for peer in peers:
        command = [*SSH, peer, "python3", remote_script, "receive", "--dir", remote_dir, "--state", remote_state]
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


def warn(message: str) -> None:
    print(f"model_sync: {message}", file=sys.stderr, flush=True)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    c = commands.add_parser("claim")
    c.add_argument("--dir", type=Path, required=True)
    c.add_argument("--manifest", type=Path)
    c.add_argument("--state", type=Path)
    m = commands.add_parser("manifest")
    m.add_argument("--dir", type=Path, required=True)
    m.add_argument("--manifest", type=Path, required=True)
    m.add_argument("--source", default="{}")
    m.add_argument("--full", action="store_true")
    m.add_argument("--progress", type=float, metavar="SECONDS", help="a progress line this often; a summary line, not JSON")
    s = commands.add_parser("status")
    s.add_argument("--dir", type=Path, required=True)
    s.add_argument("--manifest", type=Path)
    s.add_argument("--state", type=Path, required=True)
    r = commands.add_parser("receive")
    r.add_argument("--dir", type=Path, required=True)
    r.add_argument("--state", type=Path, required=True)
    t = commands.add_parser("send")
    t.add_argument("--dir", type=Path, required=True)
    t.add_argument("--manifest", type=Path, required=True, help="the manifest's path; - reads it from stdin")
    t.add_argument("--peer", required=True, help="user@address of the worker on each rail, comma-separated")
    t.add_argument("--local", required=True, help="this node's address on each rail, comma-separated")
    t.add_argument("--remote-dir", required=True)
    t.add_argument("--remote-state", required=True)
    t.add_argument("--streams", type=int, default=4)
    t.add_argument("--full", action="store_true")
    t.add_argument("--remote-script", default=REMOTE_SCRIPT, help="where this program is on the worker")
    t.add_argument("--progress", type=float, metavar="SECONDS", help="a progress line this often; a summary line, not JSON")
    args = parser.parse_args()
    try:
        if args.command == "claim":
            claim(args.dir, [read_json(path) or {} for path in (args.manifest, args.state) if path])
            return
        if args.command == "manifest":
            result = manifest(args.dir, args.manifest, json.loads(args.source), args.full, args.progress)
        elif args.command == "status":
            result = status(args.dir, args.manifest, args.state)
        elif args.command == "receive":
            receive(args.dir, args.state)
            return
        else:
            result = send(args.dir, args.manifest, args.peer.split(","), args.local.split(","), args.remote_dir,
                          args.remote_state, args.streams, args.full, args.remote_script, args.progress)
    except SyncError as error:
        print(f"model_sync: {error}", file=sys.stderr)
        sys.exit(1)
    if getattr(args, "progress", None):
        print(f"{LABELS[args.command][1]}: " + ", ".join(f"{key} {value}" for key, value in result.items()), flush=True)
    else:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
