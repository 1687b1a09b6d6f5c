"""Planned work as a silence in Alertmanager: while the head's mark of planned work (planned.py)
counts, the alerts whose rules wait for that mark (those labelled QUIET) are silenced there too,
until the mark lapses. A person sees in Alertmanager who silenced what and why, and nothing is
sent in the scrapes before the mark reaches Prometheus. The silence's ID is kept beside the mark
(MARK.silence). An Alertmanager that does not answer is said and passed over: the rules still
wait for the mark. Apart from planned.py, which the watchdog runs: a change here restarts no vLLM.

    silence begin --file MARK --alertmanager URL
        Silence the QUIET alerts until the mark at MARK lapses (the one held, extended).
    silence end --file MARK --alertmanager URL
        Expire the silence held for MARK.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import stat
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

from . import planned
from .atomic import write_atomically

# The label of the alert rules a planned restart would set off, which wait for the mark; the
# silence matches it (operations/observability.py renders it into those rules).
QUIET = ("planned_work", "quiet")
TIMEOUT = 5  # seconds for each call to Alertmanager: on the head's loopback
CREATED_BY = "dual-spark deploy"
SILENCE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def held(mark: Path) -> Path:
    """Where the ID of the silence of the mark at ``mark`` is kept."""
    return mark.with_name(f"{mark.name}.silence")


def begin(mark: Path, alertmanager: str, now: float) -> str | None:
    """Silence the QUIET alerts from ``now`` until the mark lapses, extending the silence held (Alertmanager
    may answer with a new ID); the ID kept, or None where there is no mark in force or Alertmanager took none."""
    work = planned.reading(mark, now)
    if work is None or not work["in_force"]:
        return None
    name, value = QUIET
    silence = {"matchers": [{"name": name, "value": value, "isRegex": False, "isEqual": True}],
               "startsAt": stamp(now), "endsAt": stamp(work["until"]), "createdBy": CREATED_BY,
               "comment": f"planned work: {work['what']}"}
    previous = kept(held(mark))
    answer = called(alertmanager, "POST", "/api/v2/silences", silence | ({"id": previous} if previous else {}))
    if previous and answer is None:  # the held one gone (Alertmanager restarted without its data): a new one
        answer = called(alertmanager, "POST", "/api/v2/silences", silence)
    identity = answer.get("silenceID") if isinstance(answer, dict) else None
    if isinstance(identity, str):
        write_atomically(held(mark), identity)
    return identity


def end(mark: Path, alertmanager: str) -> None:
    """Expire the silence held for the mark at ``mark``, and forget it."""
    identity = kept(held(mark))
    if identity:
        called(alertmanager, "DELETE", f"/api/v2/silence/{identity}")
    held(mark).unlink(missing_ok=True)


def kept(path: Path) -> str | None:
    """The silence ID held at ``path``: a regular file of this user's, reached through no link, that
    holds one UUID as Alertmanager makes them; None for anything else (the serving directory is
    the containers' too: what a file there holds is put in a URL only when it is an ID)."""
    try:  # O_NONBLOCK: a pipe planted there is passed over, not waited on
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        found = os.fstat(descriptor)
        data = os.read(descriptor, 64) if stat.S_ISREG(found.st_mode) and found.st_uid == os.geteuid() else b""
    finally:
        os.close(descriptor)
    text = data.decode("ascii", errors="replace").strip()
    return text if SILENCE_ID.fullmatch(text) else None


def called(alertmanager: str, method: str, path: str, body: dict | None = None) -> dict | None:
    """Alertmanager's JSON answer to one call (``{}`` for none); None, said on stderr, where it
    does not answer or refuses."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(alertmanager.rstrip("/") + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            text = response.read()
        return json.loads(text) if text.strip() else {}
    except (OSError, ValueError) as error:  # URLError and HTTPError are OSErrors
        print(f"silence: Alertmanager at {alertmanager} did not take {method} {path} ({error}); the alerts' rules "
              "still wait for the mark of planned work", file=sys.stderr)
        return None


def stamp(seconds: float) -> str:
    """RFC 3339, as Alertmanager's API takes times."""
    return datetime.fromtimestamp(seconds, UTC).isoformat().replace("+00:00", "Z")


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("begin", "end"))
    parser.add_argument("--file", required=True, type=Path, help="the mark of planned work (planned.py)")
    parser.add_argument("--alertmanager", required=True, help="Alertmanager's URL, on the head's loopback")
    args = parser.parse_args(argv)
    if args.command == "begin":
        begin(args.file, args.alertmanager, time.time())
    else:
        end(args.file, args.alertmanager)
