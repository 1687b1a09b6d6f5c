"""Published runs, read from a results directory in the format of the public
dual-spark-optimizations repository, into the rows bench.report compares:

    results/raw/<profile>/<stamp>/book-context-<size>-c<N>.json      summary + per-request groups
    results/raw/<profile>/<stamp>/book-context-<size>-c<N>.speculative-delta.json
    results/raw/<profile>/<stamp>/<node>-telemetry.csv                 nvidia-smi --format=csv
    results/raw/<profile>/<stamp>/profile.env                          KEY=VALUE

The newest stamp of each profile is the published one. A file that does not read as this format
is an error naming the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

from bench import speculation
from bench.parsers import parse_nvidia_smi_csv, parse_prometheus

CELL_FILE = re.compile(r"book-context-(\d+)k-c(\d+)\.json")
SUMMARY_FIELDS = ("mean_prompt_tokens", "mean_ttft_seconds", "mean_decode_tokens_per_second",
                  "mean_group_aggregate_tokens_per_second")


class ReferenceError(Exception):
    """The directory or one of its files is not in the published format."""


def raw_dir(folder: Path) -> Path:
    """``folder`` itself, its ``raw/`` or its ``results/raw/``: the one holding <profile>/<stamp>/."""
    for candidate in (folder / "results" / "raw", folder / "raw", folder):
        if any(candidate.glob("*/*/book-context-*-c*.json")):
            return candidate
    raise ReferenceError(f"{folder}: no <profile>/<stamp>/book-context-<size>-c<N>.json under it, its raw/ "
                         "or its results/raw/. Fix: give the published repository's checkout or its results/raw")


def read_reference(folder: Path) -> list[dict]:
    """One run per profile (its newest stamp): {"profile", "stamp", "dir", "env", "cells", "telemetry"}."""
    runs = []
    for profile_dir in sorted(path for path in raw_dir(folder).iterdir() if path.is_dir()):
        stamps = sorted(path for path in profile_dir.iterdir() if path.is_dir() and any(path.glob("book-context-*-c*.json")))
        if not stamps:
            continue
        newest = stamps[-1]
        cells = [read_cell(path, profile_dir.name) for path in sorted(newest.glob("book-context-*-c*.json"))
                 if CELL_FILE.fullmatch(path.name)]
        runs.append({
            "profile": profile_dir.name, "stamp": newest.name, "dir": str(newest),
            "env": read_env(newest / "profile.env"),
            "cells": sorted(cells, key=lambda cell: (cell["prompt_tokens"], cell["concurrency"])),
            "telemetry": {path.name.removesuffix("-telemetry.csv"): telemetry_summary(parse_nvidia_smi_csv(path.read_text().splitlines()))
                          for path in sorted(newest.glob("*-telemetry.csv"))},
        })
    return runs


def read_cell(path: Path, profile: str) -> dict:
    """A cell in the shape bench.report compares: means as published, the speculative delta beside it."""
    size, concurrency = CELL_FILE.fullmatch(path.name).groups()
    data = load_json(path)
    summary = data.get("summary")
    if not isinstance(summary, dict):
        raise ReferenceError(f"{path}: no 'summary' object")
    missing = [name for name in SUMMARY_FIELDS if not isinstance(summary.get(name), int | float)]
    if missing:
        raise ReferenceError(f"{path}: summary.{missing[0]} is missing or not a number")
    configuration = data.get("configuration") if isinstance(data.get("configuration"), dict) else {}
    delta_path = path.with_name(path.name.removesuffix(".json") + ".speculative-delta.json")
    return {
        "source": "published", "profile": profile, "file": str(path),
        "prompt": f"{size}K", "prompt_tokens": summary["mean_prompt_tokens"], "concurrency": int(concurrency),
        "max_tokens": configuration.get("max_tokens"),
        "requests": summary.get("request_count"),
        "decode_tok_s": summary["mean_decode_tokens_per_second"],
        "aggregate_tok_s": summary["mean_group_aggregate_tokens_per_second"],
        "ttft_s": summary["mean_ttft_seconds"],
        "spec": read_delta(delta_path) if delta_path.exists() else None,
    }


def read_delta(path: Path) -> dict:
    """A speculative delta: its Prometheus series (one per draft position among them) as counters."""
    data = load_json(path)
    series = data.get("series_deltas")
    if not isinstance(series, dict):
        raise ReferenceError(f"{path}: no 'series_deltas' object")
    metrics = parse_prometheus("\n".join(f"{name} {value}" for name, value in series.items()))
    if metrics.unreadable:
        raise ReferenceError(f"{path}: series_deltas has an entry that is not a Prometheus sample: {metrics.unreadable[0]}")
    return speculation.summary(speculation.delta(parse_prometheus(""), metrics))


def read_env(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def telemetry_summary(rows: list[dict]) -> dict:
    """Samples, mean GPU utilisation and power, peak temperature; None where nvidia-smi said [N/A]."""
    def values(field):
        return [row[field] for row in rows if isinstance(row.get(field), float)]

    def mean(field):
        return sum(values(field)) / len(values(field)) if values(field) else None

    return {"samples": len(rows), "mean_utilization_pct": mean("utilization.gpu"), "mean_power_w": mean("power.draw"),
            "peak_temperature_c": max(values("temperature.gpu"), default=None),
            "peak_memory_used_mib": max(values("memory.used"), default=None)}


def load_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except ValueError as error:
        raise ReferenceError(f"{path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise ReferenceError(f"{path}: not a JSON object")
    return data
