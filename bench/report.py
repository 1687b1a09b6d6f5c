"""Compare profiles from a folder of raw serving JSONs: a Markdown table and SVG charts of
C1 decode tok/s, aggregate tok/s at the widest concurrency, and TTFT, per prompt and profile;
speculative acceptance per draft position and the draft length each concurrency favours.
With --reference, the published runs (bench.reference) beside ours, matched by profile, prompt
tokens and concurrency, with the ratio ours/published per cell and in the charts.

    python -m bench.report bench/results --out bench/results/report
    python -m bench.report bench/results --reference ~/dual-spark-optimizations
"""

from __future__ import annotations

import json
import math
import re
from html import escape
from pathlib import Path

import click

from bench import cli, speculation
from bench.prompts import TOLERANCE
from bench.reference import (
    COUNT,
    LIST,
    NUMBER,
    NUMBER_OR_NULL,
    NUMBERS,
    OBJECT,
    TEXT,
    ReferenceError,
    check,
    load_json,
    optional,
    read_reference,
    refuse,
)

MATCH_TOLERANCE = 2 * TOLERANCE  # ours are sized within TOLERANCE of the published prompt tokens
PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
RERUN = "Fix: write it again with python -m bench.serving, or move it out of the folder"
# What the report reads of a bench.serving record, in order (a table before its keys).
SPEC_FIELDS = (("drafts", NUMBER), ("draft_tokens", NUMBER), ("accepted_tokens", NUMBER),
               ("generation_tokens", optional(NUMBER)), ("accepted_per_position", optional(NUMBERS)))
RUN_FIELDS = (("profile", TEXT), ("model", TEXT), ("git_revision", TEXT), ("settings", OBJECT), ("settings.max_tokens", COUNT),
              ("spec_decode", OBJECT), ("cells", (lambda cells: isinstance(cells, list) and bool(cells), "a list of at least one cell")))
CELL_FIELDS = (("prompt", (lambda prompt: isinstance(prompt, str) and bool(re.fullmatch(r"\d+K?", prompt)), "a prompt name like 300 or 10K")),
               ("concurrency", COUNT), ("requests", LIST), ("spec_decode", optional(OBJECT)),
               *((stat, OBJECT) for stat in ("prompt_tokens", "decode_tok_s", "aggregate_tok_s", "ttft_s")),
               *((f"{stat}.mean", NUMBER_OR_NULL) for stat in ("prompt_tokens", "decode_tok_s", "aggregate_tok_s", "ttft_s")),
               ("ttft_s.p50", NUMBER_OR_NULL))


def load_runs(folder: Path) -> list[dict]:
    runs = []
    for path in sorted(folder.glob("serving-*.json")):
        try:
            record = load_json(path, RERUN)
            version = record.get("schema_version")
            if type(version) is not int or version != 1:
                raise ReferenceError(f"{path}: schema_version {version!r}, this report reads 1. "
                                     "Fix: report it with the bench.report of the revision that wrote it")
            runs.append({**checked_run(path, record), "_file": path.name})
        except ReferenceError as error:
            raise click.ClickException(str(error)) from None
    if not runs:
        raise click.ClickException(f"{folder}: no serving-*.json files")
    return runs


def checked_run(path: Path, record: dict) -> dict:
    """A bench.serving record whose every field the report reads is of its kind; speculation
    figures worked out again from its counters (bench.speculation), not read."""
    check(path, record, RUN_FIELDS, RERUN)
    check(path, record["spec_decode"], SPEC_FIELDS, RERUN, "spec_decode.")
    cells = []
    for index, cell in enumerate(record["cells"]):
        where = f"cells[{index}]"
        if not isinstance(cell, dict):
            refuse(path, where, cell, "an object", RERUN)
        check(path, cell, CELL_FIELDS, RERUN, where + ".")
        if cell.get("spec_decode") is not None:
            check(path, cell["spec_decode"], SPEC_FIELDS, RERUN, where + ".spec_decode.")
        cells.append({**cell, "spec_decode": spec_figures(cell.get("spec_decode"))})
    return {**record, "cells": cells, "spec_decode": spec_figures(record["spec_decode"])}


def spec_figures(counted: dict | None) -> dict | None:
    """Acceptance overall, per position and per draft length from a checked record's counters."""
    if counted is None:
        return None
    counters = {key: counted[key] for key, _ in SPEC_FIELDS if counted.get(key) is not None}
    return speculation.summary({**counters, "accepted_per_position": counters.get("accepted_per_position", [])})


def comparable_cells(runs: list[dict]) -> dict[tuple, dict[str, dict]]:
    """{(prompt, max_tokens, concurrency): {profile: cell}}: only like with like."""
    table: dict[tuple, dict[str, dict]] = {}
    for run in runs:
        for cell in run["cells"]:
            key = (cell["prompt"], run["settings"]["max_tokens"], cell["concurrency"])
            table.setdefault(key, {})[run["profile"]] = cell
    return table


def fmt(value, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def markdown(runs: list[dict]) -> str:
    profiles = sorted({run["profile"] for run in runs})
    lines = [
        "# Serving benchmark",
        "",
        "Runs: " + ", ".join(f"`{run['_file']}` ({run['profile']}, model {run['model']}, git {run['git_revision']})" for run in runs),
        "",
        "| prompt | output | C | " + " | ".join(
            f"{p} decode tok/s | {p} aggregate tok/s | {p} TTFT p50 s" for p in profiles) + " |",
        "|---|---|---|" + "---|---|---|" * len(profiles),
    ]
    for (prompt, output, concurrency), cells in sorted(comparable_cells(runs).items(), key=lambda i: (sort_key(i[0][0]), i[0][1], i[0][2])):
        row = [prompt, str(output), str(concurrency)]
        for profile in profiles:
            cell = cells.get(profile)
            row += [fmt(cell["decode_tok_s"]["mean"]), fmt(cell["aggregate_tok_s"]["mean"]), fmt(cell["ttft_s"]["p50"], 3)] if cell else ["-"] * 3
        lines.append("| " + " | ".join(row) + " |")
    lines += ["", "| profile | drafts | acceptance | accepted per draft |", "|---|---|---|---|"]
    for run in runs:
        spec = run["spec_decode"]
        rate = spec["acceptance_rate"]
        lines.append(f"| {run['profile']} | {spec['drafts']:.0f} | {'-' if rate is None else f'{rate:.1%}'} "
                     f"| {fmt(spec['accepted_per_draft'])} |")
    return "\n".join(lines) + "\n"


def sort_key(prompt: str) -> int:
    return int(prompt[:-1]) * 1000 if prompt.endswith("K") else int(prompt)


def number(value: float) -> str:
    """1147.45 -> "1147", 34.54 -> "34.5", 0.0123 -> "0.0123"."""
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.3g}"


def nice_ceiling(value: float) -> float:
    """The axis top: the next 1, 2, 2.5 or 5 times a power of ten at or above value."""
    scale = 10 ** math.floor(math.log10(value))
    return next(step * scale for step in (1, 2, 2.5, 5, 10) if step * scale >= value)


def bar_chart(title: str, unit: str, groups: list[str], series: dict[str, list[float | None]],
              captions: dict[str, list[str]] | None = None) -> str:
    """A grouped bar chart as standalone SVG: one group per prompt, one bar per series, each bar
    labelled with its value (or its caption, when given)."""
    per_row = 3  # legend entries per line
    legend_rows = -(-len(series) // per_row)
    width, left, top = 720, 70, 50
    bottom = 32 + 18 * legend_rows
    height = 310 + bottom
    plot_w, plot_h = width - left - 20, height - top - bottom
    peak = nice_ceiling(max([v for values in series.values() for v in values if v is not None] + [1e-9]))
    slot = plot_w / max(len(groups), 1)
    bar = slot * 0.8 / max(len(series), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{width / 2}" y="24" text-anchor="middle" font-size="16">{escape(title)}</text>']
    for tick in range(5):
        value = peak * tick / 4
        y = top + plot_h - plot_h * tick / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - 20}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{number(value)}</text>')
    parts.append(f'<text x="16" y="{top + plot_h / 2}" transform="rotate(-90 16 {top + plot_h / 2})" text-anchor="middle">{escape(unit)}</text>')
    for g, group in enumerate(groups):
        x0 = left + g * slot + slot * 0.1
        parts.append(f'<text x="{left + g * slot + slot / 2:.1f}" y="{top + plot_h + 20}" text-anchor="middle">{escape(group)}</text>')
        for s, (name, values) in enumerate(series.items()):
            value = values[g]
            if value is None:
                continue
            h = plot_h * value / peak
            x = x0 + s * bar
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar * 0.92:.1f}" height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}"/>')
            caption = (captions or {}).get(name, [None] * len(groups))[g] or number(value)
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{top + plot_h - h - 4:.1f}" text-anchor="middle" font-size="10">{escape(caption)}</text>')
    for s, name in enumerate(series):
        x, y = left + (s % per_row) * (width - left) / per_row, height - 18 * (legend_rows - s // per_row)
        parts.append(f'<rect x="{x:.1f}" y="{y}" width="12" height="12" fill="{PALETTE[s % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 16:.1f}" y="{y + 10}">{escape(name)}</text>')
    parts.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{width - 20}" y2="{top + plot_h}" stroke="black"/>')
    return "\n".join(parts + ["</svg>"]) + "\n"


def charts(runs: list[dict]) -> dict[str, str]:
    """SVG files by name: C1 decode, aggregate at the widest concurrency, and TTFT at C1."""
    table = comparable_cells(runs)
    profiles = sorted({run["profile"] for run in runs})
    prompts = sorted({key[0] for key in table}, key=sort_key)
    widest = max(key[2] for key in table)

    def series(concurrency: int, stat: str, field: str) -> dict[str, list]:
        return {
            profile: [next((cells[profile][stat][field] for key, cells in table.items()
                            if key[0] == prompt and key[2] == concurrency and profile in cells), None) for prompt in prompts]
            for profile in profiles
        }

    return {
        "c1_decode.svg": bar_chart("C1 decode (mean)", "tok/s", prompts, series(1, "decode_tok_s", "mean")),
        f"c{widest}_aggregate.svg": bar_chart(f"C{widest} aggregate (mean)", "tok/s", prompts, series(widest, "aggregate_tok_s", "mean")),
        "ttft.svg": bar_chart("Time to first token at C1 (p50)", "seconds", prompts, series(1, "ttft_s", "p50")),
    }


def our_cells(runs: list[dict]) -> list[dict]:
    """Our cells in the shape bench.reference gives the published ones (means throughout)."""
    return [{"source": "ours", "profile": run["profile"], "file": run["_file"], "prompt": cell["prompt"],
             "prompt_tokens": cell["prompt_tokens"]["mean"], "concurrency": cell["concurrency"],
             "max_tokens": run["settings"]["max_tokens"], "requests": len(cell["requests"]),
             "decode_tok_s": cell["decode_tok_s"]["mean"], "aggregate_tok_s": cell["aggregate_tok_s"]["mean"],
             "ttft_s": cell["ttft_s"]["mean"], "spec": cell.get("spec_decode")}
            for run in runs for cell in run["cells"]]


def matches(ours: list[dict], published: list[dict]) -> list[dict]:
    """Each of our cells beside the published cell of the same profile, concurrency and output
    length whose prompt tokens are within MATCH_TOLERANCE of ours, with ours/published ratios."""
    rows = []
    for cell in ours:
        theirs = next((other for other in published if other["profile"] == cell["profile"]
                       and other["concurrency"] == cell["concurrency"] and other["max_tokens"] in (None, cell["max_tokens"])
                       and cell["prompt_tokens"] is not None
                       and abs(cell["prompt_tokens"] - other["prompt_tokens"]) <= MATCH_TOLERANCE * other["prompt_tokens"]), None)
        ratios = {metric: cell[metric] / theirs[metric] if theirs and cell[metric] and theirs[metric] else None
                  for metric in ("decode_tok_s", "aggregate_tok_s", "ttft_s")}
        rows.append({"ours": cell, "published": theirs, "ratio": ratios})
    return rows


def ratio(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def speculation_markdown(cells: list[dict]) -> list[str]:
    """Acceptance per draft position, accepted tokens per step for each shorter draft, and the
    length each concurrency favours (bench.speculation)."""
    measured = [cell for cell in cells if cell["spec"] and cell["spec"]["drafts"]]
    if not measured:
        return []
    lines = ["", "## Speculative decoding per draft position", "",
             "Acceptance at position k: drafts whose first k+1 tokens were all accepted. Accepted per step at n: "
             "what a draft of n tokens would have carried (the first n positions).", "",
             "| source | profile | prompt | C | drafts | acceptance by position | accepted per step at n = 1, 2, ... |",
             "|---|---|---|---|---|---|---|"]
    for cell in measured:
        spec = cell["spec"]
        lines.append(f"| {cell['source']} | {cell['profile']} | {cell['prompt']} | {cell['concurrency']} | {spec['drafts']:.0f} "
                     f"| {' '.join(f'{rate:.0%}' for rate in spec['acceptance_per_position'])} "
                     f"| {' '.join(format(length['expected_accepted'], '.2f') for length in spec['draft_lengths'][1:])} |")
    favoured = favoured_rows(cells)
    if favoured:
        lines += ["", "Draft length the measurement favours: step time fitted as base + per-token cost x C x (n + 1) "
                  "through C1 and the wider cell of the same prompt; n maximising C x tokens per step / step time "
                  "(0 = no speculation; the longest measured is the most it can say).", "",
                  "| source | profile | prompt | C | fitted with | base step ms | per token ms | favours n |", "|---|---|---|---|---|---|---|---|"]
        for row in favoured:
            verdict = row["why"] or f"{row['favoured_length']} of {row['measured_length']}"
            lines.append(f"| {row['source']} | {row['profile']} | {row['prompt']} | {row['concurrency']} "
                         f"| C{' and C'.join(map(str, row['fitted_with']))} | {row['base_step_ms']:.1f} | {row['per_token_ms']:.2f} | {verdict} |")
    return lines


def favoured_rows(cells: list[dict]) -> list[dict]:
    rows = []
    for source, profile in dict.fromkeys((cell["source"], cell["profile"]) for cell in cells):
        own = [cell for cell in cells if (cell["source"], cell["profile"]) == (source, profile)]
        rows += [{"source": source, "profile": profile, **row} for row in speculation.favoured_lengths(own)]
    return rows


def reference_markdown(reference: list[dict], rows: list[dict], folder: Path) -> list[str]:
    lines = ["", f"## Published runs (`{folder}`)", "",
             "| profile | stamp | prompt | prompt tokens | C | requests | decode tok/s | aggregate tok/s | TTFT s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in reference:
        for cell in run["cells"]:
            lines.append(f"| {run['profile']} | {run['stamp']} | {cell['prompt']} | {cell['prompt_tokens']:.0f} | {cell['concurrency']} "
                         f"| {cell['requests'] or '-'} | {fmt(cell['decode_tok_s'])} | {fmt(cell['aggregate_tok_s'])} | {fmt(cell['ttft_s'])} |")
    lines += [""] + [f"- {run['profile']} settings (`profile.env`): " + (", ".join(f"{key}={value}" for key, value in run["env"].items()) or "none kept")
                     for run in reference]
    lines += ["", "| profile | node | samples | mean GPU util % | mean power W | peak temperature C | peak memory used MiB |",
              "|---|---|---|---|---|---|---|"]
    for run in reference:
        for node, seen in run["telemetry"].items():
            lines.append(f"| {run['profile']} | {node} | {seen['samples']} | {fmt(seen['mean_utilization_pct'], 1)} "
                         f"| {fmt(seen['mean_power_w'], 1)} | {fmt(seen['peak_temperature_c'], 0)} | {fmt(seen['peak_memory_used_mib'], 0)} |")
    lines += ["", "## Ours against the published runs", "",
              "Matched by profile, concurrency, output length and prompt tokens (within 1%). Ratio = ours / published "
              "(above 1 is faster for decode and aggregate, slower for TTFT).", "",
              "| profile | prompt | C | prompt tokens ours / published | decode ours | published | ratio "
              "| aggregate ours | published | ratio | TTFT ours s | published | ratio |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        ours, theirs = row["ours"], row["published"]
        if theirs is None:
            lines.append(f"| {ours['profile']} | {ours['prompt']} | {ours['concurrency']} | {ours['prompt_tokens'] or 0:.0f} / none published "
                         "| " + " | ".join(["-"] * 9) + " |")
            continue
        cells = [f"{ours['prompt_tokens']:.0f} / {theirs['prompt_tokens']:.0f}"]
        for metric in ("decode_tok_s", "aggregate_tok_s", "ttft_s"):
            cells += [fmt(ours[metric]), fmt(theirs[metric]), ratio(row["ratio"][metric])]
        lines.append(f"| {ours['profile']} | {ours['prompt']} | {ours['concurrency']} | " + " | ".join(cells) + " |")
    return lines


def charts_against(rows: list[dict]) -> dict[str, str]:
    """Ours beside the published per prompt, one chart per concurrency for decode and aggregate;
    our bars carry the ratio ours/published."""
    drawn = {}
    matched = [row for row in rows if row["published"]]
    for concurrency in sorted({row["ours"]["concurrency"] for row in matched}):
        at = [row for row in matched if row["ours"]["concurrency"] == concurrency]
        prompts = sorted({row["ours"]["prompt"] for row in at}, key=sort_key)
        for metric, title in (("decode_tok_s", "decode"), ("aggregate_tok_s", "aggregate")):
            series, captions = {}, {}
            for profile in sorted({row["ours"]["profile"] for row in at}):
                by_prompt = {row["ours"]["prompt"]: row for row in at if row["ours"]["profile"] == profile}
                ours, theirs = f"{profile} (ours)", f"{profile} (published)"
                series[ours] = [by_prompt[p]["ours"][metric] if p in by_prompt else None for p in prompts]
                series[theirs] = [by_prompt[p]["published"][metric] if p in by_prompt else None for p in prompts]
                captions[ours] = [caption(by_prompt[p]["ours"][metric], by_prompt[p]["ratio"][metric], len(at) > len(prompts))
                                  if p in by_prompt and by_prompt[p]["ratio"][metric] else None for p in prompts]
            drawn[f"c{concurrency}_{title}_vs_published.svg"] = bar_chart(
                f"C{concurrency} {title} (mean): ours vs published, with the ratio ours/published", "tok/s", prompts, series, captions)
    return drawn


def caption(value: float, against: float, crowded: bool) -> str:
    """An ours bar's label: its value and the ratio, or only the ratio where bars are narrow."""
    return ratio(against) if crowded else f"{number(value)} ({ratio(against)})"


def default_out(folder: Path | None) -> Path | None:
    """FOLDER/report, proved writable as an --out given is (bench.cli)."""
    return cli.writable_directory(folder / "report") if folder else None


@click.command()
@click.argument("folder", type=cli.InputDir())
@click.option("--out", type=cli.OutputDir(), callback=lambda ctx, _, out: out or default_out(ctx.params.get("folder")),
              help="Where to write report.md and the charts (default FOLDER/report).")
@click.option("--reference", type=cli.InputDir(),
              help="A results directory in the format of the published dual-spark-optimizations runs, to compare against.")
def main(folder: Path, out: Path | None, reference: Path | None) -> None:
    """Write report.md, report.json and SVG charts comparing the profiles in FOLDER (and the published runs)."""
    runs = load_runs(folder)
    try:
        published = read_reference(reference) if reference else []
    except ReferenceError as error:
        raise click.ClickException(f"--reference: {error}") from None
    ours = our_cells(runs)
    published_cells = [cell for run in published for cell in run["cells"]]
    rows = matches(ours, published_cells) if reference else []
    text = markdown(runs) + "\n".join((reference_markdown(published, rows, reference) if reference else [])
                                       + speculation_markdown(ours + published_cells)) + "\n"
    drawn = {**charts(runs), **charts_against(rows)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.md").write_text(text)
        (out / "report.json").write_text(json.dumps({
            "cells": ours, "published": published, "against_published": rows,
            "favoured_draft_lengths": favoured_rows(ours + published_cells)}, indent=2))
        for name, svg in drawn.items():
            (out / name).write_text(svg)
    except OSError as error:
        raise click.ClickException(f"--out {out}: cannot write {error.filename} ({error.strerror}). Fix: give --out a folder you can write") from None
    click.echo(f"--> {out / 'report.md'}, report.json and {len(drawn)} charts: {', '.join(drawn)}")
    if reference:
        matched = sum(1 for row in rows if row["published"])
        click.echo(f"--> {matched} of {len(rows)} cells matched a published one ({len(published)} published profiles)")


if __name__ == "__main__":
    main()
