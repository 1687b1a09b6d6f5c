"""Planned work: a deploy run that stops or restarts serving marks it on the head while it runs.
The collector exports the mark, so that the alerts a restart causes wait for it, and
`tasks/status.py` says so. The mark holds when the work began and when it stops counting, by
the node's own clock: a run that dies leaves a mark that expires on its own.

    planned begin --file FILE --seconds S --what TEXT
        Mark planned work for S seconds from now (a mark still in force keeps its start).
    planned end --file FILE
        The work is done: remove the mark.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from .atomic import write_atomically


def parsed(text: str | None) -> dict | None:
    """A mark as written: {"since", "until", "what"}; None for none, or for one that is not a mark."""
    try:
        mark = json.loads(text or "")
    except ValueError:
        return None
    if not isinstance(mark, dict) or not isinstance(mark.get("what"), str):
        return None
    times = [mark.get("since"), mark.get("until")]
    if not all(isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) for value in times):
        return None
    return {"since": float(mark["since"]), "until": float(mark["until"]), "what": mark["what"]}


def read(path: Path) -> dict | None:
    try:
        return parsed(path.read_text())
    except (OSError, UnicodeDecodeError):
        return None


def reading(path: Path, now: float) -> dict | None:
    """The mark at ``path`` as `tasks/status.py` shows it: what, how long ago it began, and
    whether it is still in force at ``now``; None without one."""
    mark = read(path)
    if mark is None:
        return None
    return {**mark, "age_seconds": round(now - mark["since"]), "in_force": mark["since"] <= now < mark["until"]}


def begin(path: Path, seconds: float, what: str, now: float) -> dict:
    """Write the mark: in force from now (or from the start of one still in force) for ``seconds``."""
    held = read(path)
    since = held["since"] if held is not None and held["since"] <= now < held["until"] else now
    mark = {"since": since, "until": now + seconds, "what": what}
    write_atomically(path, json.dumps(mark))
    return mark


def end(path: Path) -> None:
    path.unlink(missing_ok=True)


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("begin")
    b.add_argument("--file", required=True, type=Path)
    b.add_argument("--seconds", required=True, type=float, help="how long the mark counts if no `end` comes")
    b.add_argument("--what", required=True, help="what the work is, for the status")
    e = commands.add_parser("end")
    e.add_argument("--file", required=True, type=Path)
    args = parser.parse_args(argv)
    if args.command == "begin":
        begin(args.file, args.seconds, args.what, time.time())
    else:
        end(args.file)
