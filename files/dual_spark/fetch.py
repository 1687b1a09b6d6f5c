"""Fetch a model repository at a pinned revision from the Hugging Face hub into a directory,
once, on the head. Runs inside the runtime image (which has huggingface_hub); the hub is
$HF_ENDPOINT. Before any byte moves it checks what a user gets wrong: a gated repository without
a token (or with one that has no access), a revision that does not exist, a disk too small on any
node that receives the model (the hub's sizes for the revision against each --room, room.py).
Files already complete are not fetched again; LFS files are checked against the hub's SHA-256.
huggingface_hub takes a file over Xet when the hub serves it so (hf_xet, set up by the deploy's
docker run), else over plain HTTP; the check is the same.

    fetch --repo ORG/NAME --revision COMMIT --dest DIR --store PATH --room NODE=FREE:HAVE [--room ...]
          [--token-file FILE] [--workers N] [--progress SECONDS]

It prints a JSON summary; with --progress, a progress line that often while the bytes move
(progress.py) and a summary line for people instead.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from .progress import Progress
from .room import short


def fail(message: str) -> None:
    print(f"fetch_model: {message}", file=sys.stderr)
    sys.exit(1)


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(8 << 20):
            digest.update(block)
    return digest.hexdigest()


def tree_bytes(root: Path) -> int:
    """The bytes written to the files under root, the download's partial files included: their
    blocks, not their length, which runs ahead of what is written when parts land at their offsets
    out of order (Xet's writer does). The length bounds it (blocks round up)."""
    total = 0
    for path in root.rglob("*"):
        try:
            info = path.stat()
            total += min(info.st_size, info.st_blocks * 512) if path.is_file() else 0
        except OSError:  # renamed or removed as we looked
            pass
    return total


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision", required=True)
    parser.add_argument("--dest", type=Path, required=True)
    parser.add_argument("--store", required=True, help="the model store on every node (its messages name it)")
    parser.add_argument("--room", action="append", default=[], help="NODE=FREE:HAVE, bytes, for each node that receives it")
    parser.add_argument("--token-file", type=Path)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--progress", type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    started = time.monotonic()
    token = args.token_file.read_text().strip() if args.token_file and args.token_file.is_file() else None
    where = f"{args.repo} at {args.revision[:12]}"
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT"))
    try:
        info = api.model_info(args.repo, revision=args.revision, files_metadata=True, token=token)
    except GatedRepoError:
        if token:
            fail(f"{where} is gated and this token has no access. Fix: accept the model's terms on its hub page "
                 "with the account the token belongs to, or use a token of an account that has.")
        fail(f"{where} is gated: a token is needed. Fix: accept the model's terms on its hub page, create a read "
             "token, and put it on the head in the file hf_token_file names (mode 600), e.g. with `hf auth login`.")
    except RevisionNotFoundError:
        fail(f"{args.repo} has no revision {args.revision}. Fix: set model.revision in site.toml to a commit of "
             "the repository (its history on the hub lists them).")
    except RepositoryNotFoundError:
        fail(f"no repository {args.repo} (or it is private to others). Fix: check model.repo in site.toml.")
    except HfHubHTTPError as error:
        fail(f"the hub refused {where}: {error}")
    except OSError as error:
        fail(f"cannot reach the hub at {api.endpoint}: {error}. Fix: check the head's network (or hf_endpoint).")

    files = [(s.rfilename, s.size or 0, s.lfs.sha256 if s.lfs else None) for s in info.siblings]
    refusal = short(sum(size for _, size, _ in files), args.room, args.store, where)
    if refusal:
        fail(refusal)
    args.dest.mkdir(parents=True, exist_ok=True)
    wanted = {name for name, _, _ in files}
    for path in args.dest.rglob("*"):  # the directory mirrors the revision: another model's files go
        relative = path.relative_to(args.dest).as_posix()
        if path.is_file() and not relative.startswith(".") and relative not in wanted:
            path.unlink()

    def complete(name: str, size: int) -> bool:
        path = args.dest / name
        return path.is_file() and path.stat().st_size == size

    missing = [(name, size, lfs) for name, size, lfs in files if not complete(name, size)]
    needed = sum(size for _, size, _ in missing)

    def fetch(item) -> int:
        name, size, lfs = item
        path = Path(hf_hub_download(args.repo, name, revision=info.sha, local_dir=args.dest, token=token))
        if lfs and sha256(path) != lfs:
            path.unlink()
            raise ValueError(f"{name} does not match the hub's SHA-256: removed, run again")
        return size

    before = tree_bytes(args.dest)
    watch = Progress(f"fetching {args.repo}", needed, args.progress, measure=lambda: tree_bytes(args.dest) - before)
    try:
        with watch, ThreadPoolExecutor(args.workers) as pool:
            moved = sum(pool.map(fetch, missing))
    except (HfHubHTTPError, OSError, ValueError, RuntimeError) as error:  # RuntimeError: hf_xet's
        fail(f"fetching {where} stopped: {error}. Run the deploy again: files already complete are kept.")
    summary = {"commit": info.sha, "files": len(files), "bytes": sum(size for _, size, _ in files),
               "fetched_files": len(missing), "fetched_bytes": moved, "seconds": round(time.monotonic() - started, 3)}
    if args.progress:
        print(f"fetched {args.repo}: " + ", ".join(f"{key} {value}" for key, value in summary.items()), flush=True)
    else:
        print(json.dumps(summary))

