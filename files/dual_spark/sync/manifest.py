"""The head's manifest (SHA-256 of every file and of each of its chunks), and what a node has
against its records, read without hashing."""

from __future__ import annotations

import hashlib
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..constants import OWN_FILES
from ..progress import Progress
from .model import BLOCK, CHUNK, HASH_WORKERS, LABELS, SyncError, model_files, read_json, write_json

MANIFEST_VERSION = 1


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



def status(root: Path, manifest_path: Path | None, state_path: Path) -> dict:
    """What a node has, read without hashing: sizes and mtimes against what was recorded."""
    existing = root.is_dir()
    probe = root if existing else next((p for p in root.parents if p.exists()), Path("/"))
    reading = {"exists": existing, "free_bytes": shutil.disk_usage(probe).free, "bytes": held(root) if existing else 0,
               "manifest": None, "verified": None, "changed": []}
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


def held(root: Path) -> int:
    """Bytes on disk of the model's files and partial copies under root (blocks, not lengths: a
    partial copy is as long as its file from the start)."""
    total = 0
    for path in root.rglob("*"):
        if path.is_file() and not path.relative_to(root).as_posix().startswith("."):
            info = path.stat()
            total += min(info.st_size, info.st_blocks * 512)
    return total


def source_bytes(root: Path) -> int:
    """The bytes a copy of root into the store takes: every file, the deploy's own at its top left
    out (as the copy leaves them out)."""
    if not root.is_dir():
        raise SyncError(f"{root} is not a directory: nothing to copy")
    return sum(path.stat().st_size for path in root.rglob("*")
               if path.is_file() and not path.is_symlink() and not path.relative_to(root).as_posix().startswith(OWN_FILES))


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

