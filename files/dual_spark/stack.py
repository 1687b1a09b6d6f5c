"""The states that served, kept on this node beside its stack (operations/records.py calls it on
every node):

    stack record --stack-dir DIR --cluster ID --stack HASH --profile NAME --image TAG
                 (--model-repo REPO --model-revision COMMIT | --model-path PATH) --model-digest HEX
        Record DIR's stack files as the state that serves: copied into DIR/served/ with
        state.json (what the arguments say, with the image's ID and the time added), and the
        canaries' answers (DIR/canary.json) when they passed on this state (its cluster ID); the
        record there before becomes DIR/rollback/. Nothing changes when served/ already holds
        this state.
    stack restore --stack-dir DIR --record NAME --starts FILE
        Install record NAME's stack files as the node's own (each one it replaces kept as
        FILE.previous), forget the watchdog's backoff (FILE), and start the stack fresh.

Either refuses a DIR that is not the deploy's: a real directory that only root (and whoever
runs this) can change, holding the deploy's marker, theirs too. Nothing is followed through a
link, and each file is written anew and renamed into place.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .atomic import write_atomically
from .constants import CANARY_ANSWERS, RECORD_STATE, STOP_TIMEOUT
from .own import Refused, guarded

FILES = {"compose.yaml": 0o644, "launch.sh": 0o755}


class StackError(Exception):
    """What stops a record or a restore, said in one line."""


def claimed(stack_dir: Path) -> Path:
    """``stack_dir`` if it is the deploy's, as `own guard` finds it: a real directory (no link on
    its way) that only root and this process's user can change, holding their marker."""
    try:
        os.close(guarded(str(stack_dir), "stack_dir", pwd.getpwuid(os.geteuid()).pw_name))
    except Refused as error:
        raise StackError(str(error)) from None
    return stack_dir


def image_id(tag: str) -> str:
    """Docker's ID of the image ``tag``, "" when Docker has none."""
    found = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", tag], capture_output=True, text=True)
    return found.stdout.strip() if found.returncode == 0 else ""


def record(stack_dir: Path, state: dict) -> bool:
    """Record the stack as ``state``; False when served/ holds it already."""
    served = stack_dir / "served"
    try:
        if json.loads((served / RECORD_STATE).read_text()).get("cluster") == state["cluster"]:
            return False
    except (OSError, ValueError, AttributeError):
        pass
    staged = stack_dir / "served.new"
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(mode=0o755)
    for name in FILES:
        shutil.copy2(stack_dir / name, staged / name, follow_symlinks=False)
    canaries = passed_canaries(stack_dir, state["cluster"])
    if canaries is not None:
        write_atomically(staged / CANARY_ANSWERS, json.dumps(canaries, sort_keys=True) + "\n")
        state = {**state, "canaries": {"passed": sorted(canaries["answers"]), "when": canaries["when"]}}
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_atomically(staged / RECORD_STATE, json.dumps({**state, "image_id": image_id(state["image"]), "since": since},
                                                       sort_keys=True, separators=(",", ":")) + "\n")
    if served.is_dir() and not served.is_symlink():
        shutil.rmtree(stack_dir / "rollback", ignore_errors=True)
        served.rename(stack_dir / "rollback")
    staged.rename(served)
    return True


def passed_canaries(stack_dir: Path, cluster: str) -> dict | None:
    """The canaries' answers in ``stack_dir`` when every canary passed on state ``cluster``; None
    otherwise (none ran, they ran on another state, or one failed). Read through no link."""
    try:
        descriptor = os.open(stack_dir / CANARY_ANSWERS, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    with os.fdopen(descriptor) as handle:
        try:
            found = json.loads(handle.read())
        except ValueError:
            return None
    if not isinstance(found, dict) or found.get("cluster") != cluster or found.get("failed") or not isinstance(found.get("answers"), dict):
        return None
    return found


def restore(stack_dir: Path, name: str, starts: Path) -> None:
    """Install record ``name`` as the stack and start it fresh, owing no backoff."""
    kept = stack_dir / name
    if not all((kept / file).is_file() and not (kept / file).is_symlink() for file in FILES):
        raise StackError(f"{stack_dir} holds no record {name} (its compose.yaml and launch.sh): nothing was changed")
    for file, mode in FILES.items():
        target = stack_dir / file
        if target.is_file() and not target.is_symlink():
            shutil.copy2(target, stack_dir / f"{file}.previous", follow_symlinks=False)
        write_atomically(target, (kept / file).read_text(), mode)
    starts.unlink(missing_ok=True)
    compose = ["docker", "compose", "--project-directory", str(stack_dir), "-f", str(stack_dir / "compose.yaml"),
               "up", "-d", "--force-recreate", "--remove-orphans", "--timeout", str(STOP_TIMEOUT)]
    if subprocess.run(compose).returncode != 0:
        raise StackError(f"`{' '.join(compose)}` failed: see its output above")


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    kept = commands.add_parser("record", help="record the stack as the state that serves")
    kept.add_argument("--stack-dir", type=Path, required=True)
    for name in ("cluster", "stack", "profile", "image", "model-digest"):
        kept.add_argument(f"--{name}", required=True)
    for name in ("model-repo", "model-revision", "model-path"):
        kept.add_argument(f"--{name}")
    back = commands.add_parser("restore", help="install a record as the stack and start it fresh")
    back.add_argument("--stack-dir", type=Path, required=True)
    back.add_argument("--record", required=True, choices=("served", "rollback"))
    back.add_argument("--starts", type=Path, required=True, help="the watchdog's backoff record, forgotten")
    args = parser.parse_args(argv)
    try:
        stack_dir = claimed(args.stack_dir)
        if args.command == "record":
            model = {key: value for key in ("repo", "revision", "path") if (value := getattr(args, f"model_{key}")) is not None}
            record(stack_dir, {"cluster": args.cluster, "stack": args.stack, "profile": args.profile, "image": args.image,
                               "model": model, "model_digest": args.model_digest})
        else:
            restore(stack_dir, args.record, args.starts)
    except (StackError, OSError) as error:
        print(f"stack {args.command}: {error}", file=sys.stderr)
        sys.exit(1)
