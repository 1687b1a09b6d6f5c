"""The model's bytes, hashed once on the head and copied down the chain of ranks over the fabric,
verified: `dual-spark.pyz sync COMMAND`.

    sync claim --dir D [--manifest M] [--state S]
        Make D a directory the deploy may clean: create it, or take it if it holds the marker
        .dual-spark-managed, is empty, or holds only what the deploy's records (the manifest M
        on the head, the verified record S on the worker) list; then write the marker. A
        directory holding anything else is refused, nothing touched.
    sync manifest --dir D --manifest M [--source JSON] [--full]
        Hash every file of D (SHA-256 of the whole file and of each 64 MiB chunk, files in
        parallel) into the manifest M. Files whose size and mtime match M are not hashed again
        (unless --full). Prints a JSON summary.
    sync status --dir D [--manifest M] --state S
        One JSON line: what is in D (and its bytes), whether it matches M (head) or the verified
        state S (worker) by size and mtime, and the free space.
    sync room --source D --store S --what TEXT --room NODE=FREE:HAVE [--room ...]
        Before a copy from D (its files but the deploy's own at its top): refuse, naming the
        node, its free space in the store S and what it needs, when TEXT does not fit on each
        node given (room.py).
    sync send --dir D --manifest M --peer USER@ADDR[,USER@ADDR] --local ADDR[,ADDR]
         --remote-dir D --remote-state S [--streams N] [--full] [--remote-script PATH]
        Copy what the worker lacks over every reachable rail at once, with N parallel TCP
        streams per rail bound to the point-to-point fabric addresses (a random token admits
        them; SSH carries only the control messages). The worker checks each chunk's SHA-256 as
        it lands, writes files as *.dsp-part and renames them only when every chunk matches, then
        records them as verified. A cut transfer resumes: chunks already right are not sent again.
        A worker passes the model on down the chain from its verified copy the same way, the
        head's manifest on its stdin (--manifest -, sent along by the head).
    sync receive --dir D --state S
        The worker's side of send, started by it over SSH. It claims D first (see claim).

manifest and send take --progress SECONDS: then they print a progress line that often while
they run (progress.py) and end with a summary line for people, not JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from ..room import short
from .claim import claim
from .manifest import manifest, source_bytes, status
from .model import LABELS, SyncError, read_json
from .receive import receive
from .send import send


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    o = commands.add_parser("room")
    o.add_argument("--source", type=Path, required=True)
    o.add_argument("--store", required=True)
    o.add_argument("--what", required=True)
    o.add_argument("--room", action="append", default=[])
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
    t.add_argument("--remote-script", default=os.path.abspath(sys.argv[0]),
                   help="where this program is on the worker (default: where it is here)")
    t.add_argument("--progress", type=float, metavar="SECONDS", help="a progress line this often; a summary line, not JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "claim":
            claim(args.dir, [read_json(path) or {} for path in (args.manifest, args.state) if path])
            return
        if args.command == "room":
            refusal = short(source_bytes(args.source), args.room, args.store, args.what)
            if refusal:
                raise SyncError(refusal)
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

