"""Long-context reliability probe: non-guessable codes planted at several depths of a long
synthetic log, then an exact-match question for all of them; N trials per context size (in the
server's tokens, counted by its /tokenize) at temperature 0. Each answer is a pass, junk (every
code right, plus other text) or a real failure (a code wrong or missing).

    python -m bench.longctx --model deepseek-v4-flash --sizes 74000,110000,148000,184000 --trials 5
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass
from datetime import UTC, datetime

import click
import requests

from bench import cli
from bench.endpoint import Endpoint, read_api_key, room_for
from bench.prompts import CHARS_PER_TOKEN, Log, PromptError, fit, label, log_text

SCHEMA_VERSION = 1
STATIONS = ["Amber", "Birch", "Cobalt", "Dune", "Ember", "Fjord", "Garnet"]


@dataclass(frozen=True)
class Haystack:
    size: int
    trial: int
    needles: dict[str, str]  # station -> code
    depths: list[float]
    text: str
    question: str

    @property
    def prompt(self) -> str:
        return f"{self.text}\n\n{self.question}"


def code(rng: random.Random) -> str:
    """A code no model can guess: QX7-4821-MZP."""
    letters, digits = string.ascii_uppercase, string.digits
    return (f"{''.join(rng.choice(letters) for _ in range(2))}{rng.choice(digits)}-"
            f"{''.join(rng.choice(digits) for _ in range(4))}-{''.join(rng.choice(letters) for _ in range(3))}")


def make_haystack(size: int, trial: int, needles: int = 3, log: str | None = None) -> Haystack:
    """The codes of trial ``trial`` planted in ``log`` (default: about ``size`` tokens of the
    trial's synthetic log by characters; the probe fits it in the server's tokens)."""
    rng = random.Random(f"longctx:{size}:{trial}")
    stations = STATIONS[:needles]
    planted = {station: code(rng) for station in stations}
    depths = [(index + 1) / (needles + 1) for index in range(needles)]
    lines = (log_text(size * CHARS_PER_TOKEN, f"longctx:{size}:{trial}") if log is None else log).splitlines()
    for station, depth in zip(reversed(stations), reversed(depths)):
        lines.insert(int(len(lines) * depth), f"[NOTICE] The access code for station {station} is {planted[station]}.")
    question = (f"The log above contains access codes for stations {', '.join(stations)}. "
                "Reply with the codes only, one per line, in that order.")
    return Haystack(size, trial, planted, depths, "\n".join(lines), question)


def classify(needles: dict[str, str], answer: str) -> str:
    """pass, junk (all codes right plus other text) or fail (a code wrong or missing)."""
    if not all(value in answer for value in needles.values()):
        return "fail"
    rest = answer
    for value in needles.values():
        rest = rest.replace(value, "")
    for station in needles:
        rest = rest.replace(station, "")
    rest = re.sub(r"[\s,.:;\-*#>`'\"]|station|code|access", "", rest, flags=re.IGNORECASE)
    return "junk" if rest else "pass"


def ask(endpoint: Endpoint, haystack: Haystack, max_tokens: int) -> dict:
    body = {"model": endpoint.model, "temperature": 0.0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": haystack.prompt}]}
    try:
        response = requests.post(f"{endpoint.url}/v1/chat/completions", json=body, headers=endpoint.headers, timeout=endpoint.timeout)
        response.raise_for_status()
        reply = response.json()
    except requests.RequestException as error:
        return {"answer": None, "verdict": "fail", "error": str(error), "prompt_tokens": None}
    answer = reply["choices"][0]["message"].get("content") or ""
    return {"answer": answer, "verdict": classify(haystack.needles, answer), "error": None,
            "prompt_tokens": reply.get("usage", {}).get("prompt_tokens")}


def sized_haystack(endpoint: Endpoint, size: int, trial: int, needles: int) -> Haystack:
    """The trial's haystack with as much log as makes the whole chat prompt ``size`` tokens."""
    log = Log(f"longctx:{size}:{trial}")
    try:
        haystack, _ = fit(size, lambda h: endpoint.tokenize(h.prompt)["count"],
                          lambda chars: make_haystack(size, trial, needles, log.prefix(chars)))
    except PromptError as error:
        raise click.ClickException(f"--sizes: {error}") from None
    return haystack


def probe(endpoint: Endpoint, sizes: list[int], trials: int, needles: int, max_tokens: int) -> list[dict]:
    room_for(endpoint, sizes, max_tokens, "--sizes")
    rows = []
    with click.progressbar(length=len(sizes) * trials, label="trials") as bar:
        for size in sizes:
            for trial in range(trials):
                haystack = sized_haystack(endpoint, size, trial, needles)
                rows.append({"size": size, "trial": trial, "needles": haystack.needles, "depths": haystack.depths,
                             **ask(endpoint, haystack, max_tokens)})
                bar.update(1)
    return rows


def table(rows: list[dict]) -> list[dict]:
    """Per context size: trials, real failures, junk, passes."""
    sizes = sorted({row["size"] for row in rows})
    return [{
        "size": size, "label": label(size),
        "prompt_tokens": max((r["prompt_tokens"] or 0) for r in rows if r["size"] == size),
        **{verdict: sum(1 for r in rows if r["size"] == size and r["verdict"] == verdict) for verdict in ("fail", "junk", "pass")},
        "trials": sum(1 for r in rows if r["size"] == size),
    } for size in sizes]


@click.command()
@click.option("--url", type=cli.Url(), default="http://127.0.0.1:8888", show_default=True)
@click.option("--model", required=True)
@click.option("--api-key-env", default="VLLM_API_KEY", show_default=True)
@click.option("--api-key-file", type=cli.TextFile())
@click.option("--sizes", type=cli.PositiveIntList(max=cli.MAX_TOKENS, example="74000,110000"), default="74000,110000,148000,184000",
              show_default=True, help="Context sizes in tokens.")
@click.option("--trials", type=cli.count(1000), default=5, show_default=True)
@click.option("--needles", default=3, show_default=True, type=click.IntRange(1, len(STATIONS)))
@click.option("--max-tokens", type=cli.count(cli.MAX_TOKENS), default=64, show_default=True)
@click.option("--profile", type=cli.Name(), default="unknown", show_default=True)
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(url, model, api_key_env, api_key_file, sizes, trials, needles, max_tokens, profile, out_dir):
    """Probe needle retrieval at growing context sizes."""
    endpoint = Endpoint(url.rstrip("/"), model, read_api_key(api_key_env, api_key_file))
    started = datetime.now(UTC)
    rows = probe(endpoint, sizes, trials, needles, max_tokens)
    summary = table(rows)
    record = {"schema_version": SCHEMA_VERSION, "started": started.isoformat(), "profile": profile, "model": model,
              "git_revision": cli.git_revision(), "settings": {"trials": trials, "needles": needles, "max_tokens": max_tokens,
                                                           "temperature": 0.0}, "table": summary, "trials": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"longctx-{profile}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2))
    click.echo(f"{'context':>8} {'prompt tok':>10} {'real failures':>14} {'junk':>5} {'pass':>5}")
    for row in summary:
        click.echo(f"{row['label']:>8} {row['prompt_tokens']:>10} {row['fail']:>11}/{row['trials']:<2} {row['junk']:>5} {row['pass']:>5}")
    click.echo(f"--> raw results: {path}")


if __name__ == "__main__":
    main()
