"""Speculation tuned to the load: measure the running profile at every concurrency, derive the draft
length per batch size the measurement favours, and prove it with an A/B on the same prompts.

    python -m bench.tune                                  # the site's head, published prompt sizes
    python -m bench.tune --site site.toml --prompt-tokens 9028 --requests 3
    python -m bench.tune --schedule '[[1, 1, 7], [2, 4, 3]]'   # A/B this schedule instead

1. The profile the head serves (it drafts a fixed speculative_tokens N) is measured at each
   concurrency from 1 to its max_num_seqs with bench.serving: decode tok/s per stream, aggregate
   tok/s, and vLLM's acceptance per draft position.
2. bench.speculation.schedule fits the decode step and derives k per batch size; printed with the
   figures behind each k and written as a site.toml snippet: a profile `<running>-tuned`.
3. The A/B (unless --no-ab, or the schedule is the fixed N everywhere): the deploy's own profile
   switch serves that profile from a copy of the site file that adds it, the same prompts are
   measured again, then the running profile is switched back. Per concurrency: decode per stream
   and aggregate for both, the ratios, and plainly where the schedule does not win.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path

import click

from bench import cli, speculation
from bench.endpoint import Endpoint, fit_prompts, served_model, through_site
from bench.load import run_benchmark, warm_up
from bench.prompts import PUBLISHED_SIZES
from cluster import Cluster, Profile
from site_config import SITE_ENV, SiteError, load_site

REPO = Path(__file__).resolve().parents[1]
SCHEMA_VERSION = 1


def tunable(cluster: Cluster, name: str) -> Profile:
    """The running profile, refused when there is nothing to tune or no fixed draft length to measure."""
    profile = cluster.profiles.get(name)
    if profile is None:
        raise click.ClickException(f"the head serves profile {name!r}, which {cluster.path} does not define. "
                                   "Fix: tune with the site file the nodes were deployed from")
    if not profile.speculative_tokens:
        raise click.ClickException(f"profile {name} drafts no tokens (speculative_tokens = 0): nothing to tune. "
                                   "Fix: switch to a profile that speculates (adaptive)")
    if profile.speculative_schedule is not None:
        raise click.ClickException(f"profile {name} already has a speculative_schedule: the tuner measures a fixed draft length. "
                                   f"Fix: switch to the profile it starts from (tasks/profile.py), then tune")
    if profile.max_num_seqs < 2:
        raise click.ClickException(f"profile {name} serves one sequence (max_num_seqs = 1): a schedule per batch size has one range. "
                                   "Fix: tune a profile that batches (adaptive), or set speculative_tokens")
    return profile


def parse_schedule(text: str | None) -> list[list[int]] | None:
    """--schedule's text as a schedule, refused (click.BadParameter) as bench.cli.Schedule refuses it."""
    return None if text is None else cli.Schedule().convert(text, None, None)


def fitting(cluster: Cluster | None, schedule: list[list[int]] | None) -> list[list[int]] | None:
    """A --schedule some profile of the site the tuner can measure would take (k at most its
    speculative_tokens, the last range covering its max_num_seqs), refused before any contact;
    the running profile's own fit is checked once the head says which it is."""
    if schedule is None or cluster is None:
        return schedule
    profiles = {name: profile for name, profile in cluster.profiles.items()
                if profile.speculative_tokens and profile.speculative_schedule is None and profile.max_num_seqs >= 2}
    (start, end, _), most = schedule[-1], max(k for _, _, k in schedule)
    if not any(most <= profile.speculative_tokens and start <= profile.max_num_seqs <= end for profile in profiles.values()):
        raise click.BadParameter(
            f"{json.dumps(schedule)} fits no profile of {cluster.path} the tuner can measure ("
            + (", ".join(f"{name}: k at most {profile.speculative_tokens}, last range covering {profile.max_num_seqs}"
                         for name, profile in profiles.items()) or "none speculates with a fixed draft length and batches")
            + "). Fix: draft at most the profile's speculative_tokens and end the last range at its max_num_seqs")
    return schedule


def snippet(name: str, running: str, schedule: list[list[int]], why: str) -> str:
    """The site.toml tables that serve ``schedule`` as profile ``name``."""
    ranges = ", ".join(f"[{start}, {end}, {k}]" for start, end, k in schedule)
    return (f"# {why}\n# Serve it: pyinfra inventory.py tasks/profile.py --data profile={name} (or [settings] profile = \"{name}\").\n"
            f"[profile.{name}]\nbase = \"{running}\"\nspeculative_schedule = [{ranges}]\n")


def free_name(cluster: Cluster, running: str) -> str:
    taken = cluster.profiles
    return next(name for n in range(1, len(taken) + 2) if (name := f"{running}-tuned" + (f"-{n}" if n > 1 else "")) not in taken)


def with_profile(stack: ExitStack, site_file: Path, text: str) -> Path:
    """A copy of the site file, beside it (its relative paths hold), that adds ``text``; validated
    as the deploy validates it."""
    copy = stack.enter_context(tempfile.NamedTemporaryFile("w", dir=site_file.resolve().parent, prefix=".tune-", suffix=".toml"))
    copy.write(site_file.read_text() + "\n" + text)
    copy.flush()
    try:
        load_site(Path(copy.name))
    except SiteError as error:
        raise click.ClickException(f"the schedule is refused: {error}") from None
    return Path(copy.name)


def switch(site: Path, profile: str) -> None:
    """The deploy's own profile switch (tasks/profile.py): restarts every node only if the stack changed."""
    click.echo(f"--> switching to profile {profile}: pyinfra -y inventory.py tasks/profile.py --data profile={profile}")
    pyinfra = Path(sys.executable).parent / "pyinfra"
    result = subprocess.run([str(pyinfra), "-y", "inventory.py", "tasks/profile.py", "--data", f"profile={profile}"], cwd=REPO,
                            env={**os.environ, SITE_ENV: str(site)}, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise click.ClickException(f"the switch to profile {profile} failed (its output is above). Fix what it names, then run "
                                   f"`pyinfra inventory.py tasks/profile.py --data profile={profile}` to see it again")


def cells_of(measured: dict) -> list[dict]:
    return [{"prompt": c["prompt"], "concurrency": c["concurrency"], "decode_tok_s": c["decode_tok_s"]["mean"], "spec": c["spec_decode"]}
            for c in measured["cells"]]


def drafted(cell: dict) -> float | None:
    spec = cell["spec_decode"]
    return spec["draft_tokens"] / spec["drafts"] if spec["drafts"] else None


def compare(fixed: dict, scheduled: dict) -> list[dict]:
    """Per prompt and concurrency: decode per stream and aggregate of both runs, the ratios, and the
    draft tokens per draft vLLM counted in each (the schedule at work)."""
    rows = []
    for a, b in zip(fixed["cells"], scheduled["cells"]):
        row = {"prompt": a["prompt"], "concurrency": a["concurrency"]}
        for metric in ("decode_tok_s", "aggregate_tok_s"):
            x, y = a[metric]["mean"], b[metric]["mean"]
            row[metric] = {"fixed": x, "schedule": y, "ratio": y / x if x and y is not None else None}
        row["draft_tokens_per_draft"] = {"fixed": drafted(a), "schedule": drafted(b)}
        rows.append(row)
    return rows


def print_derivation(derived: dict) -> None:
    measured = derived["measured_length"]
    for prompt, fitted in derived["fits"].items():
        click.echo(f"  prompt {prompt}: decode step " + (f"{fitted['base_step_ms']:.1f} ms + {fitted['per_token_ms']:.3f} ms per token in the batch"
                                                        if fitted else "does not fit base + per-token cost (noise, or prefill inside the decode window)"))
    for row in derived["rows"]:
        click.echo(f"  C{row['concurrency']}: k = {row['favoured_length']}" + (f" ({row['why']})" if row["why"] else ""))
        for behind in row["behind"]:
            predicted = behind["predicted_decode_tok_s"]
            click.echo(f"      {behind['prompt']}: step {behind['step_ms']:.1f} ms; acceptance by position "
                       + " ".join(f"{rate:.0%}" for rate in behind["acceptance_per_position"])
                       + (f"; predicted decode tok/s for k = 0..{measured}: " + " ".join(f"{v:.1f}" for v in predicted) if predicted else ""))


def print_ab(rows: list[dict], fixed_k: int, schedule: list[list[int]]) -> list[str]:
    """The A/B table; returns the plain sentences of where the schedule does not win."""
    click.echo(f"A/B: fixed k = {fixed_k} against speculative_schedule = {json.dumps(schedule)}")
    click.echo(f"{'prompt':>8} {'C':>3} {'decode fixed':>13} {'schedule':>9} {'ratio':>6} {'aggregate fixed':>16} {'schedule':>9} {'ratio':>6} {'drafted/draft':>14}")

    def number(value, digits=2):
        return "-" if value is None else f"{value:.{digits}f}"

    losses = []
    for row in rows:
        d, a, k = row["decode_tok_s"], row["aggregate_tok_s"], row["draft_tokens_per_draft"]
        click.echo(f"{row['prompt']:>8} {row['concurrency']:>3} {number(d['fixed']):>13} {number(d['schedule']):>9} {number(d['ratio']):>5}x "
                   f"{number(a['fixed']):>16} {number(a['schedule']):>9} {number(a['ratio']):>5}x {number(k['fixed'], 1):>6} -> {number(k['schedule'], 1)}")
        lost = {name: ratio for name, ratio in (("decode per stream", d["ratio"]), ("aggregate", a["ratio"])) if ratio is None or ratio <= 1}
        if lost:
            losses.append(f"the schedule does not beat k = {fixed_k} at C{row['concurrency']} ({row['prompt']}-token prompt): "
                          + ", ".join(f"{name} x{number(ratio)}" for name, ratio in lost.items()))
    for sentence in losses:
        click.echo(sentence)
    if not losses:
        click.echo(f"the schedule beats k = {fixed_k} at every concurrency measured, per stream and in aggregate")
    return losses


@click.command()
@cli.site_option(help=f"The site file the nodes were deployed from (default: ${SITE_ENV}, else site.toml).")
@click.option("--accept-new-host-key", is_flag=True, help="Record the head's SSH host key seen for the first time (else an error).")
@click.option("--prompt-tokens", "sizes", type=cli.PositiveIntList(max=cli.MAX_TOKENS, example="9028"),
              default=",".join(map(str, PUBLISHED_SIZES)), show_default=True, help="Prompt sizes in the server's tokens, comma-separated.")
@click.option("--requests", "groups", type=cli.count(1000), default=3, show_default=True, help="Requests (C1) or groups (C>1) per cell.")
@click.option("--max-tokens", type=cli.count(cli.MAX_TOKENS), default=256, show_default=True, help="Output length of every request.")
@click.option("--schedule", "given", type=cli.Schedule(), callback=lambda ctx, _, value: fitting(ctx.params.get("cluster"), value),
              help="A/B this schedule (JSON, e.g. '[[1, 1, 7], [2, 4, 3]]') instead of the derived one.")
@click.option("--ab/--no-ab", default=True, show_default=True, help="Serve the schedule and measure it against the fixed k (two switches of every node).")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(cluster, accept_new_host_key, sizes, groups, max_tokens, given, ab, out_dir):
    """Measure speculation at every concurrency, derive a per-batch-size schedule, A/B it."""
    site_file, prompt_tokens = cluster.path, ",".join(map(str, sizes))
    started = datetime.now(UTC)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    with ExitStack() as stack:
        url, key, identity = through_site(stack, cluster, accept_new_host_key)
        running = identity["profile"]
        profile = tunable(cluster, running)
        fixed_k, concurrencies = profile.speculative_tokens, list(range(1, profile.max_num_seqs + 1))
        endpoint = Endpoint(url, None, key)
        endpoint.model = served_model(endpoint)
        name = free_name(cluster, running)
        given_site = with_profile(stack, site_file, snippet(name, running, given, "given with --schedule")) if given else None
        prompts = fit_prompts(endpoint, sizes, max_tokens)
        click.echo(f"--> measuring profile {running} (k = {fixed_k}) at C{concurrencies[0]}..C{concurrencies[-1]} on prompts of {prompt_tokens} tokens")
        warm_up(endpoint, prompts[0])
        fixed = run_benchmark(endpoint, prompts, concurrencies, groups, max_tokens, True)
        derived = speculation.schedule(cells_of(fixed))
        if not derived["rows"]:
            raise click.ClickException(f"vLLM counted no drafts while serving profile {running} (its /metrics spec_decode counters): "
                                       "nothing to derive. Fix: check the speculative_method and the drafter the image serves")
        click.echo(f"the measurement favours speculative_schedule = {json.dumps(derived['schedule'])} (k per batch size):")
        print_derivation(derived)
        why = (f"bench.tune {stamp}: {running} measured at k = {fixed_k}, C1..C{concurrencies[-1]}, prompts of {prompt_tokens} tokens"
               + (", derived " + json.dumps(derived["schedule"]) if given else ""))
        tried = given or derived["schedule"]
        text = snippet(name, running, tried, why)
        record = {"schema_version": SCHEMA_VERSION, "started": started.isoformat(), "site": str(site_file), "profile": running,
                  "model": endpoint.model, "model_revision": identity["model_revision"], "runtime_image_id": identity["image_id"],
                  "git_revision": cli.git_revision(), "speculative_tokens": fixed_k,
                  "settings": {"prompt_tokens": sizes, "concurrency": concurrencies, "requests_per_cell": groups, "max_tokens": max_tokens},
                  "fixed": fixed, "derived": derived, "schedule_tried": tried, "snippet": text, "ab": None}
        if tried == [[1, concurrencies[-1], fixed_k]]:
            click.echo(f"the measurement favours the fixed k = {fixed_k} at every concurrency: nothing to apply, no A/B")
        elif ab:
            run_ab(given_site or with_profile(stack, site_file, text), site_file, running, name, record, endpoint, prompts, groups, max_tokens)
    snippet_path = out_dir / f"tune-{running}-{stamp}.toml"
    snippet_path.write_text(text)
    path = out_dir / f"tune-{running}-{stamp}.json"
    path.write_text(json.dumps(record, indent=2))
    click.echo(f"--> the site.toml snippet ({snippet_path}):\n{text}--> raw results: {path}")


def run_ab(scheduled_site: Path, site_file: Path, running: str, name: str, record: dict, endpoint: Endpoint,
           prompts, groups: int, max_tokens: int) -> None:
    """Serve the schedule as profile ``name`` (from ``scheduled_site``), measure the same cells,
    switch back to ``running``; the comparison goes into ``record``."""
    try:
        switch(scheduled_site, name)
        warm_up(endpoint, prompts[0])
        scheduled = run_benchmark(endpoint, prompts, record["settings"]["concurrency"], groups, max_tokens, True)
    finally:
        switch(site_file, running)
    rows = compare(record["fixed"], scheduled)
    losses = print_ab(rows, record["speculative_tokens"], record["schedule_tried"])
    record["ab"] = {"profile": name, "scheduled": scheduled, "comparison": rows, "losses": losses}


if __name__ == "__main__":
    main()
