"""Are the answers still the ones recorded while the head serves? Every --every seconds, each
watched canary (--canary NAME) is asked again exactly as the state that serves answered it when
its change was kept (stack_dir/served/canary.json: prompt, length, tokens), and its greedy answer
is compared with that one over the first --agree-tokens tokens; one that differs is asked again
once (a near tie moved by other requests in its batch does not repeat). The result goes to --out,
a node-exporter textfile: dual_spark_answers_changed 1 for a canary whose answer changed, and the
token where it did. Nothing restarts: the alert says so, and a person decides. Nothing is compared
while the deploy's planned work is marked (its change records new answers; the mark is looked at
again every 10 s, so that the state after it is watched at once), without a record that passed on
the state that serves, or while the API does not answer. An API that refuses the key ends the
program, so that systemd starts it again with the key as it is now.

    answers watch --url URL --key-file FILE --stack-dir DIR --planned FILE [--canary NAME ...]
                  --agree-tokens N --every SECONDS --out FILE [--once]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

from . import planned
from .atomic import write_atomically
from .canary import ASKED_WITH, DIFFERS, CanaryError, answer, comparable, first_difference, settled
from .constants import RECORD_STATE
from .health import call
from .metrics import Metrics
from .secret import KEY_FIX, SecretError, read_secret
from .stack import passed_canaries

REFUSED = (401, 403)  # the API refuses the key: read again at the next start
PLANNED = "not compared: planned work in progress"
PLANNED_POLL = 10  # seconds between two looks at planned work in progress: the state after it is watched at once


def recorded(stack_dir: Path) -> dict | None:
    """The answers that passed on the state that serves (served/): by canary name; None when that
    state was recorded without canaries that passed."""
    served = stack_dir / "served"
    try:
        cluster = json.loads((served / RECORD_STATE).read_text()).get("cluster")
    except (OSError, ValueError, AttributeError):
        return None
    kept = passed_canaries(served, cluster) if isinstance(cluster, str) else None
    return kept["answers"] if kept is not None else None


def compared(url: str, key: str, answers: dict, names: list[str], agree_tokens: int, timeout: float) -> dict[str, int | None]:
    """Each watched canary with a recorded greedy answer, asked again: the token where its answer
    changed, None where it agrees."""
    _, models = call(url, key, "/v1/models", None, timeout)
    model = models["data"][0]["id"]
    changed = {}
    for name in names:
        kept = answers.get(name) if isinstance(answers.get(name), dict) else {}
        canary = {"name": name, "checks": ["greedy"], **{field: kept.get(field) for field in ("prompt", "max_tokens", "ignore_eos")},
                  **{field: kept[field] for field in ASKED_WITH if kept.get(field)}}
        if not (isinstance(canary["prompt"], str) and isinstance(canary["max_tokens"], int) and comparable(canary, kept)):
            continue
        got, failures = settled(canary, kept, agree_tokens, functools.partial(answer, url, key, model, canary, timeout))
        changed[name] = first_difference(got["tokens"][:agree_tokens], kept["tokens"][:agree_tokens]) if any(
            found.startswith(DIFFERS) for found in failures) else None
    return changed


def textfile(changed: dict[str, int | None], checked_at: float | None) -> str:
    metrics = Metrics()
    for name, position in sorted(changed.items()):
        metrics.add("dual_spark_answers_changed", "gauge", "1 when a watched canary's greedy answer differs from the one recorded "
                    "with the state that serves (asked twice), 0 when it agrees.", {"canary": name}, int(position is not None))
        metrics.add("dual_spark_answers_first_difference_tokens", "gauge", "The first token where a watched canary's answer "
                    "differs from the recorded one.", {"canary": name}, position)
    metrics.add("dual_spark_answers_checked_timestamp_seconds", "gauge", "When the watched canaries were last compared with the "
                "recorded answers.", {}, checked_at)
    return metrics.text()


def watch_round(args, key: str) -> tuple[dict[str, int | None] | None, str]:
    """One round: what was compared ({} for nothing to compare now; None when the API did not
    answer, the last result standing), and a line saying it."""
    if not args.canary:
        return {}, "not compared: no canary is watched (watch = true in its [canary.NAME])"
    mark = planned.read(args.planned)
    if mark is not None and mark["since"] <= time.time() < mark["until"]:
        return {}, f"{PLANNED} ({mark['what']})"
    answers = recorded(args.stack_dir)
    if answers is None:
        return {}, "not compared: the state that serves was recorded without canaries that passed"
    try:
        changed = compared(args.url.rstrip("/"), key, answers, args.canary, args.agree_tokens, args.timeout)
    except CanaryError as error:
        if error.status in REFUSED:
            sys.exit(f"answers: {error}: the key is read again at the next start")
        return None, f"not compared: {error}"
    except (OSError, ValueError, KeyError, IndexError) as error:
        return None, f"not compared: no answer at {args.url}: {error}"
    if not changed:
        return {}, f"not compared: no watched canary ({', '.join(args.canary)}) has a recorded greedy answer"
    moved = [f"{name} from token {position}" for name, position in changed.items() if position is not None]
    return changed, (f"answers changed while serving: {', '.join(moved)}" if moved else
                     f"{', '.join(changed)}: the same answers as recorded")


def watch(args) -> None:
    try:
        key = read_secret(args.key_file, "the API key file", KEY_FIX)
    except SecretError as error:
        sys.exit(f"answers: {error}")
    said, checked_at, last = None, None, {}
    while True:
        changed, line = watch_round(args, key)
        if changed is not None:
            last, checked_at = changed, time.time() if changed else checked_at
        write_atomically(args.out, textfile(last, checked_at))
        if line != said:
            print(f"answers: {line}", flush=True)
            said = line
        if args.once:
            return
        time.sleep(min(args.every, PLANNED_POLL) if line.startswith(PLANNED) else args.every)


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    watching = commands.add_parser("watch", help="compare the watched canaries' answers with the recorded ones, again and again")
    watching.add_argument("--url", required=True, help="vLLM's API")
    watching.add_argument("--key-file", type=Path, required=True)
    watching.add_argument("--stack-dir", type=Path, required=True, help="where served/ holds the state that serves and its answers")
    watching.add_argument("--planned", type=Path, required=True, help="the mark of the deploy's planned work")
    watching.add_argument("--canary", action="append", default=[], help="a watched canary's name (none: the watch idles)")
    watching.add_argument("--agree-tokens", type=int, required=True, help="how many first tokens must agree")
    watching.add_argument("--every", type=float, required=True, help="seconds between two rounds")
    watching.add_argument("--out", type=Path, required=True, help="the textfile written")
    watching.add_argument("--timeout", type=float, default=300, help="seconds for each request")
    watching.add_argument("--once", action="store_true", help="one round, then exit")
    watch(parser.parse_args(argv))
