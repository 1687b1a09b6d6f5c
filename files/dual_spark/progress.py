"""Progress lines for the deploy's long steps (hub fetch, image build, pull and stream, model
hashing and replication): what, bytes done of total, rate and time left, every EVERY seconds
while the step runs, so that pyinfra prints them as they come (the operations run these steps
with their output shown live). sync and fetch use its Progress.

    progress pipe --what TEXT [--total BYTES] [--fd N]
        Copy stdin to stdout, counting the bytes; progress lines and a final one go to fd N.
    progress run --what TEXT -- COMMAND...
        Run COMMAND, saying every EVERY seconds how long it has run and its latest output line
        (carriage returns end lines too, as rsync's progress writes them); its last lines go to
        stderr if it fails, with its exit status.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable

EVERY = 10.0


def size(n: float) -> str:
    """Bytes as a person reads them: 1.50 GiB, 12.3 MiB, 512 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):.{2 if shift == 30 else 1}f} {unit}"
    return f"{int(n)} B"


def duration(seconds: float) -> str:
    """A time span: 42 s, 3 min 05 s, 2 h 07 min."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def line(what: str, done: int, total: int | None, seconds: float) -> str:
    """One progress line: done of total, the rate so far, and the time left at that rate."""
    rate = done / seconds if seconds > 0 else 0.0
    parts = [f"{size(done)} of {size(total)} ({100 * done / total:.0f}%)" if total else size(done), f"{size(rate)}/s"]
    if total and rate > 0 and done < total:
        parts.append(f"{duration((total - done) / rate)} left")
    return f"{what}: " + ", ".join(parts)


def final(what: str, done: int, seconds: float) -> str:
    """The line a step ends with."""
    rate = f" ({size(done / seconds)}/s)" if seconds > 0 and done else ""
    return f"{what}: {size(done)} in {duration(seconds)}{rate}"


class Progress:
    """Bytes done of a total, said every ``every`` seconds while the block runs (a stalled step
    keeps saying so; None: silent). ``measure``, if given, is asked for the bytes done instead
    of ``add``."""

    def __init__(self, what: str, total: int | None = None, every: float | None = EVERY, out=None,
                 measure: Callable[[], int] | None = None):
        self.what, self.total, self.every, self.measure = what, total, every, measure
        self.out = out or sys.stdout
        self.done = 0
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.ticker = threading.Thread(target=self._tick, daemon=True)
        self.started = time.monotonic()

    def add(self, n: int) -> None:
        with self.lock:
            self.done += n

    def seconds(self) -> float:
        return time.monotonic() - self.started

    def now(self) -> str:
        if self.measure is not None:
            self.done = self.measure()
        return line(self.what, self.done, self.total, self.seconds())

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        if self.every:
            self.ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        if self.ticker.is_alive():
            self.ticker.join()  # its last line before the caller's summary, never inside it

    def _tick(self) -> None:
        while not self.stopped.wait(self.every):
            self.say(self.now())


def pipe(what: str, total: int | None, out) -> None:
    with Progress(what, total, out=out) as progress:
        while block := os.read(0, 1 << 20):
            view = memoryview(block)
            while view:
                view = view[os.write(1, view):]
            progress.add(len(block))
    progress.say(final(what, progress.done, progress.seconds()))


def run(what: str, command: list[str], every: float = EVERY) -> int:
    tail: collections.deque[str] = collections.deque(maxlen=40)
    started = time.monotonic()
    stopped = threading.Event()

    def tick() -> None:
        while not stopped.wait(every):
            latest = f"; latest: {' '.join(tail[-1].split())[:120]}" if tail else ""
            print(f"{what}: {duration(time.monotonic() - started)} so far{latest}", flush=True)

    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    except OSError as error:
        print(f"{what}: cannot run {command[0]}: {error.strerror}", file=sys.stderr, flush=True)
        return 127
    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    pending = b""
    while block := process.stdout.read1(1 << 16):
        pieces = (pending + block).replace(b"\r", b"\n").split(b"\n")
        pending = pieces.pop()
        tail.extend(piece.decode(errors="replace") for piece in pieces if piece.strip())
    if pending.strip():
        tail.append(pending.decode(errors="replace"))
    code = process.wait()
    stopped.set()
    ticker.join()  # its last line before the summary, never inside it
    if code:
        print("\n".join(tail), file=sys.stderr)
        print(f"{what}: failed after {duration(time.monotonic() - started)} (exit {code})", file=sys.stderr, flush=True)
    else:
        print(f"{what}: done in {duration(time.monotonic() - started)}", flush=True)
    return code


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    p = commands.add_parser("pipe")
    p.add_argument("--what", required=True)
    p.add_argument("--total", type=int)
    p.add_argument("--fd", type=int, default=2)
    r = commands.add_parser("run")
    r.add_argument("--what", required=True)
    r.add_argument("argv", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "pipe":
        pipe(args.what, args.total or None, os.fdopen(args.fd, "w", closefd=False))
        return
    argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not argv:
        parser.error("run needs a command after --")
    sys.exit(run(args.what, argv))

