"""Commands on the other nodes of the cluster, run from this one over the fabric. The head runs
its steps on the workers through these (and a worker on the next one down the chain), so that
the head composes calls instead of shell scripts.

    peers run --node NAME --user USER --rail ADDRESS [--rail ADDRESS ...] -- COMMAND...
        COMMAND on the node, over the first of its rails that answers over SSH, as USER (the
        deploy user, whose key each node trusts). stdin and stdout pass through. A rail that
        does not answer is named, and the next one is tried.
    peers all --what TEXT [--then TEXT] --job NAME WHERE COMMAND [--job ...]
        Runs every job's COMMAND (shell text) at the same time. WHERE is `here` (run it on this
        node) or USER@ADDRESS[,ADDRESS...] (run it on that node, as `run` does). Each job's
        output is printed once it ends, every line under its node's name. The step fails if
        any job failed, and names every node where one did.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from .constants import FABRIC_CIPHER, SSH_OPTIONS


class Unreachable(Exception):
    """The node answers on none of its rails."""


@dataclass
class Peer:
    """Another node: its name, the deploy user there, its fabric addresses in order, and the one
    it answered on once asked."""

    name: str
    user: str
    rails: tuple[str, ...]
    address: str | None = None

    def ssh(self) -> list[str]:
        return ["sudo", "-n", "-u", self.user, "ssh", *SSH_OPTIONS]

    def reach(self, out=None) -> str:
        """The first rail it answers on, each one skipped said to ``out`` (stderr); Unreachable
        when none does."""
        for address in self.rails if self.address is None else ():
            probe = subprocess.run([*self.ssh(), f"{self.user}@{address}", "true"], stdin=subprocess.DEVNULL,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            if probe.returncode == 0:
                self.address = address
                break
            print(f"{self.name} does not answer over SSH at {address}: trying the next rail", file=out or sys.stderr, flush=True)
        if self.address is None:
            raise Unreachable(f"{self.name} answers on no fabric rail: run pyinfra inventory.py tasks/verify.py")
        return self.address

    def command(self, text: str, out=None) -> list[str]:
        """The argv that runs shell ``text`` there, over the first rail that answers."""
        return [*self.ssh(), "-c", FABRIC_CIPHER, f"{self.user}@{self.reach(out)}", text]


def parse_where(name: str, where: str) -> Peer | None:
    """A job's WHERE: None for `here`, else the Peer USER@ADDRESS[,ADDRESS...] names."""
    if where == "here":
        return None
    user, _, rails = where.partition("@")
    if not user or not rails:
        raise SystemExit(f"peers: {name}'s WHERE {where!r} is neither `here` nor USER@ADDRESS[,ADDRESS...]")
    return Peer(name, user, tuple(rails.split(",")))


def job(peer: Peer | None, text: str, out) -> int:
    """Shell ``text`` here (``peer`` None) or on ``peer``, its output and errors to ``out``."""
    try:
        argv = ["sh", "-c", text] if peer is None else peer.command(text, out)
    except Unreachable as error:
        print(error, file=out, flush=True)
        return 1
    return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT).returncode


def all_at_once(jobs: list[tuple[str, Peer | None, str]], what: str, then: str) -> int:
    """Run the jobs at the same time, each one's output kept apart; print each after it ends, its
    lines under its name, after a line naming it when it failed; 1 when any failed, naming all."""
    outs = [tempfile.TemporaryFile("w+") for _ in jobs]
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        codes = list(pool.map(job, [peer for _, peer, _ in jobs], [text for _, _, text in jobs], outs))
    failed = []
    for (name, _, _), code, out in zip(jobs, codes, outs):
        if code != 0:
            failed.append(name)
            print(f"{what} failed on {name}:", file=sys.stderr)
        out.seek(0)
        for line in out.read().splitlines():
            print(f"{name}: {line}", file=sys.stderr)
        out.close()
    if failed:
        print(f"{what} failed on: {' '.join(failed)}{then}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    one = commands.add_parser("run", help="a command on another node")
    one.add_argument("--node", required=True)
    one.add_argument("--user", required=True)
    one.add_argument("--rail", action="append", required=True)
    one.add_argument("argv", nargs=argparse.REMAINDER)
    every = commands.add_parser("all", help="a command on several nodes at the same time")
    every.add_argument("--what", required=True)
    every.add_argument("--then", default="")
    every.add_argument("--job", nargs=3, action="append", required=True, metavar=("NAME", "WHERE", "COMMAND"))
    args = parser.parse_args(argv)
    if args.command == "all":
        sys.exit(all_at_once([(name, parse_where(name, where), text) for name, where, text in args.job], args.what, args.then))
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not command:
        parser.error("run: no COMMAND after --")
    try:
        argv = Peer(args.node, args.user, tuple(args.rail)).command(shlex.join(command))
    except Unreachable as error:
        print(error, file=sys.stderr)
        sys.exit(1)
    sys.exit(subprocess.run(argv).returncode)
