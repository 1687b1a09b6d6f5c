"""Fetch a model repository at a pinned revision from the Hugging Face hub into a directory,
once, on the head. Runs inside the runtime image (which has huggingface_hub); the hub is
$HF_ENDPOINT. Before any byte moves it checks what a user gets wrong: a gated repository without
a token (or with one that has no access), a revision that does not exist, a disk too small on any
node that receives the model (the hub's sizes for the revision against each --room, room.py).
Files already complete are not fetched again; LFS files are checked against the hub's SHA-256.
huggingface_hub takes a file over Xet when the hub serves it so (hf_xet, set up by the deploy's
docker run), else over plain HTTP; the check is the same.

    fetch --repo ORG/NAME --revision COMMIT --dest DIR --store PATH --room NODE=FREE:HAVE [--room ...]
          [--token-file FILE [--allow-http-token]] [--workers N] [--progress SECONDS]

The token file is read as secret.py reads secrets (no link, one line); the token goes to the hub
over HTTPS only, unless --allow-http-token, and is masked in every message, a library's included.

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
from typing import NoReturn
from urllib.parse import urlsplit

from huggingface_hub import HfApi, hf_hub_download
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from .progress import Progress
from .room import short
from .secret import SecretError, masked, read_secret

HUB = "https://huggingface.co"  # huggingface_hub's endpoint when HF_ENDPOINT is not set
TOKEN_FIX = ("Fix: as the deploy user, put the token alone in the file hf_token_file names (mode 600), "
             "e.g. with `hf auth login`, or remove the file if the repository is public")


class Stop(Exception):
    """A problem with a message for the user; the program exits 1 with it."""


def fail(message: str) -> NoReturn:
    raise Stop(message)


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
    parser.add_argument("--allow-http-token", action="store_true", help="send the token to an http:// HF_ENDPOINT too")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--progress", type=float, metavar="SECONDS")
    args = parser.parse_args(argv)
    token = None
    try:
        token = hub_token(args.token_file, os.environ.get("HF_ENDPOINT") or HUB, args.allow_http_token)
        fetch_model(args, token)
    except Exception as error:  # a library's words too: whatever of the token they hold is masked
        words = str(error) if isinstance(error, (Stop, SecretError)) else f"{type(error).__name__}: {error}"
        print(f"fetch_model: {masked(words, token)}", file=sys.stderr)
        sys.exit(1)


def hub_token(path: Path | None, endpoint: str, allow_http: bool) -> str | None:
    """The token in the file at ``path`` (None: no file); refused for an endpoint that is not
    https:// unless ``allow_http``."""
    if path is None or not os.path.lexists(path):
        return None
    token = read_secret(path, "the hub token file", TOKEN_FIX)
    if urlsplit(endpoint).scheme != "https" and not allow_http:
        fail(f"HF_ENDPOINT {endpoint} is not https://: the hub token would cross the network readable. Fix: serve the hub "
             "over https, or set hf_endpoint_insecure_http = true in site.toml to send it anyway")
    return token


def fetch_model(args: argparse.Namespace, token: str | None) -> None:
    """The revision into args.dest, its summary printed."""
    started = time.monotonic()
    auth = token or False  # no token: huggingface_hub sends none, not even one it finds itself
    where = f"{args.repo} at {args.revision[:12]}"
    api = HfApi(endpoint=os.environ.get("HF_ENDPOINT"))
    try:
        info = api.model_info(args.repo, revision=args.revision, files_metadata=True, token=auth)
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
        path = Path(hf_hub_download(args.repo, name, revision=info.sha, local_dir=args.dest, token=auth))
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

