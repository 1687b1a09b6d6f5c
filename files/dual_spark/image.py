"""A runtime image sent from this node to the next one down the chain of ranks.

    image send --tag TAG --node NAME --user USER --rail ADDRESS [--rail ADDRESS ...] [--from NAME]

`docker save TAG` streams into `docker load` on the node (over the first of its rails that
answers, as `peers run` reaches it), with progress lines. Then both image IDs are compared:
the same ID is the same bytes, so the node may send the image on. A different ID fails the step,
and the image is sent again on the next run.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from .peers import Peer, Unreachable
from .progress import Progress, final
from .smoke import image_id

BLOCK = 1 << 20


def size_of(tag: str) -> int | None:
    found = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", tag], capture_output=True, text=True)
    return int(found.stdout) if found.returncode == 0 and found.stdout.strip().isdecimal() else None


def send(tag: str, peer: Peer, sender: str) -> str | None:
    """Stream the image to ``peer`` and compare the IDs; None when they match, else why not."""
    mine = image_id(tag)
    if mine is None:
        return f"{tag} is not on {sender}: it cannot be sent on"
    what = f"streaming {tag} to {peer.name}"
    save = subprocess.Popen(["docker", "save", tag], stdout=subprocess.PIPE)
    load = subprocess.Popen(peer.command("sudo -n docker load"), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    with Progress(what, size_of(tag)) as progress:
        try:
            while block := save.stdout.read(BLOCK):
                load.stdin.write(block)
                progress.add(len(block))
        except BrokenPipeError:
            pass
        load.stdin.close()
    saved, loaded = save.wait(), load.wait()
    if saved or loaded:
        return f"{what} failed: docker save exited {saved}, docker load on {peer.name} {loaded}"
    progress.say(final(what, progress.done, progress.seconds()))
    theirs = subprocess.run(peer.command(shlex.join(["sudo", "-n", "docker", "image", "inspect", "-f", "{{.Id}}", tag])), capture_output=True, text=True)
    if theirs.stdout.strip() != mine:
        return f"{tag} reached {peer.name} with another image ID than {sender}'s: it is sent again next run"
    return None


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    sending = commands.add_parser("send", help="the image to the next node down the chain")
    sending.add_argument("--tag", required=True)
    sending.add_argument("--node", required=True)
    sending.add_argument("--user", required=True)
    sending.add_argument("--rail", action="append", required=True)
    sending.add_argument("--from", dest="sender", default="the head")
    args = parser.parse_args(argv)
    try:
        failed = send(args.tag, Peer(args.node, args.user, tuple(args.rail)), args.sender)
    except Unreachable as error:
        failed = str(error)
    if failed:
        print(failed, file=sys.stderr)
        sys.exit(1)
