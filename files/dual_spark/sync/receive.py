"""The worker's side of a transfer: it plans what is missing, takes verified chunks from the
streams, and records the copy as verified when it is complete."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .claim import claim
from .manifest import chunk_hashes
from .model import BLOCK, CHUNK, HASH_WORKERS, PART, SyncError, gib, read_json, write_json


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

