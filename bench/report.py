"""Compare profiles from a folder of raw serving JSONs: a Markdown table and SVG charts of
C1 decode tok/s, aggregate tok/s at the widest concurrency, and TTFT, per prompt and profile.

    python -m bench.report bench/results --out bench/results/report
"""

from __future__ import annotations

import json
import math
from html import escape
from pathlib import Path

import click

PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def load_runs(folder: Path) -> list[dict]:
    runs = []
    for path in sorted(folder.glob("serving-*.json")):
        record = json.loads(path.read_text())
        if record.get("schema_version") != 1:
            raise click.ClickException(f"{path}: schema_version {record.get('schema_version')!r}, this report reads 1")
        record["_file"] = path.name
        runs.append(record)
    if not runs:
        raise click.ClickException(f"{folder}: no serving-*.json files")
    return runs


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


def bar_chart(title: str, unit: str, groups: list[str], series: dict[str, list[float | None]]) -> str:
    """A grouped bar chart as standalone SVG: one group per prompt, one bar per profile."""
    width, height, left, bottom, top = 720, 360, 70, 50, 50
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
        for s, values in enumerate(series.values()):
            value = values[g]
            if value is None:
                continue
            h = plot_h * value / peak
            x = x0 + s * bar
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bar * 0.92:.1f}" height="{h:.1f}" fill="{PALETTE[s % len(PALETTE)]}"/>')
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{top + plot_h - h - 4:.1f}" text-anchor="middle" font-size="10">{number(value)}</text>')
    for s, name in enumerate(series):
        x = left + s * 150
        parts.append(f'<rect x="{x}" y="{height - 18}" width="12" height="12" fill="{PALETTE[s % len(PALETTE)]}"/>')
        parts.append(f'<text x="{x + 16}" y="{height - 8}">{escape(name)}</text>')
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


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), help="Where to write report.md and the charts (default FOLDER/report).")
def main(folder: Path, out: Path | None) -> None:
    """Write report.md and SVG charts comparing the profiles in FOLDER."""
    runs = load_runs(folder)
    out = out or folder / "report"
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.md").write_text(markdown(runs))
    drawn = charts(runs)
    for name, svg in drawn.items():
        (out / name).write_text(svg)
    click.echo(f"--> {out / 'report.md'} and {len(drawn)} charts: {', '.join(drawn)}")


if __name__ == "__main__":
    main()
