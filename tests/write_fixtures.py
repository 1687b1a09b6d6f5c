"""Write what the fast tier expects of the code from the code as it is now, for a change that
means to change it: each operation case's outcome in tests/operations/ (its commands, or its
no-op description, or its error; the printed lines where the case holds them) and what the
pair's site renders in tests/pair/expected/ (netplan, and the stacks of every profile). What a case is about (its site, arguments and readings) is
never written here. The pair's stacks name their two digests (the watchdog's, the stack's) for
what each digests, once checked, so a change of a program does not rewrite them. Review the diff
as data before committing it.

    .venv/bin/python -m tests.write_fixtures              # every case and the pair's files
    .venv/bin/python -m tests.write_fixtures CASE.json... # those cases only
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import io
import json
import re
import sys
from pathlib import Path

from pyinfra.api import OperationError

from operations.fabric import render_netplan
from operations.stack import desired, stack_settings
from programs import digest
from site_config import load_site
from tests.fake_host import load, run_operation

TESTS = Path(__file__).parent
PAIR = TESTS / "pair"
PAIR_DIGEST, PAIR_GID = "0123456789ab", 3  # as tests/test_serving_pair.py renders them
PROFILES = ("adaptive", "fast", "long-c4")


def outcome(case_path: Path) -> dict:
    """What the operation of the case at ``case_path`` does now: {"exception"} or {"commands",
    "noop" (with no command), "printed" (where the case holds printed lines)}."""
    case = load(case_path)
    module, name = case_path.parent.name.rsplit(".", 1)
    op = getattr(importlib.import_module(f"operations.{module}"), name)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the tables verification and status print
            commands, host = run_operation(op, case)
    except OperationError as error:
        return {"exception": str(error)}
    found = {"commands": commands}
    if not commands:
        found["noop"] = host.noop_description
    if "printed" in case:
        found["printed"] = host.printed
    return found


def write_case(case_path: Path) -> bool:
    """The case's own file with its outcome as the code gives it; whether it changed. A key its
    base already holds with the same value is left to the base; a file whose values stay is left
    as it was written."""
    merged, own = load(case_path), json.loads(case_path.read_text())
    updated = dict(own)
    for key, value in outcome(case_path).items():
        if key in own or merged.get(key) != value:
            updated[key] = value
    if updated == own:
        return False
    case_path.write_text(json.dumps(updated, indent=2, ensure_ascii=False) + "\n")
    return True


# The two digests in a stack that no one can read: what the watchdog runs (launch.sh's comment),
# and the stack's own hash (compose.yaml's label: its text with the label '', then launch.sh).
WATCHDOG_DIGEST = re.compile(r"(\(watchdog\.py, sha256 )([0-9a-f]{16})(\.\.\.\))")
STACK_LABEL = re.compile(r"^(\s+dual-spark\.stack: )([0-9a-f]{16})$", re.M)
# Their names, each a YAML scalar as the digest was (the pinned compose.yaml still parses).
NAMED_WATCHDOG, NAMED_STACK = "<what the watchdog runs, programs.digest>", "<sha256 of this file with this label blank, then launch.sh>"


def readable(compose: str, launch: str) -> tuple[str, str]:
    """A stack's compose.yaml and launch.sh with each digest named for what it digests, once it is
    checked to be that: the pinned files then read as data, and change with what they show."""
    [(_, watchdog, _)] = WATCHDOG_DIGEST.findall(launch)
    assert watchdog == digest("watchdog.py")[:16], f"launch.sh names the watchdog {watchdog}, not what it runs"
    [(_, label)] = STACK_LABEL.findall(compose)
    unlabelled = STACK_LABEL.sub(lambda match: f"{match.group(1)}''", compose)
    assert label == hashlib.sha256((unlabelled + launch).encode()).hexdigest()[:16], f"the stack's label {label} is not its hash"
    return (STACK_LABEL.sub(lambda match: match.group(1) + NAMED_STACK, compose),
            WATCHDOG_DIGEST.sub(lambda match: match.group(1) + NAMED_WATCHDOG + match.group(3), launch))


def pair_files() -> dict[str, str]:
    """What the pair's site renders, by the name tests/pair/expected/ gives it: each node's
    netplan, and its compose.yaml and launch.sh per profile, their digests named (``readable``)."""
    files = {}
    for profile in PROFILES:
        cluster = load_site(PAIR / "site.toml", overrides={"profile": profile})
        for node in cluster.nodes:
            others = [other.hostname for other in cluster.others(node.hostname)]
            files[f"{node.role}.netplan.yaml"] = render_netplan(node.hostname, others, node.rail_data, cluster.settings.fabric_mtu)
            stack = desired(stack_settings(cluster, node.hostname), PAIR_GID, PAIR_DIGEST)
            files[f"{node.role}.{profile}.compose.yaml"], files[f"{node.role}.{profile}.launch.sh"] = readable(stack.compose, stack.launch)
    return files


def write_pair(expected: Path = PAIR / "expected") -> list[Path]:
    """``expected`` as the pair's site renders it (``pair_files``); the files rewritten."""
    written = []
    for name, text in pair_files().items():
        path = expected / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            written.append(path)
    return written


def main(arguments: list[str]) -> None:
    cases = [Path(argument) for argument in arguments] or sorted((TESTS / "operations").glob("[!_]*/[!_]*.json"))
    written = [case for case in cases if write_case(case)]
    if not arguments:
        written += write_pair()
    for path in written:
        print(f"wrote {path}")
    print(f"{len(written)} file(s) changed of {len(cases)} case(s){'' if arguments else ' and the pair'}")


if __name__ == "__main__":
    main(sys.argv[1:])
