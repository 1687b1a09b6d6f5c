"""Published runs, read from a results directory in the format of the public
dual-spark-optimizations repository, into the rows bench.report compares:

    results/raw/<profile>/<stamp>/book-context-<size>-c<N>.json      summary + per-request groups
    results/raw/<profile>/<stamp>/book-context-<size>-c<N>.speculative-delta.json
    results/raw/<profile>/<stamp>/<node>-telemetry.csv                 nvidia-smi --format=csv
    results/raw/<profile>/<stamp>/profile.env                          KEY=VALUE

The newest stamp of each profile is the published one. A file that does not read as this format
(not UTF-8, not JSON, a directory, a symlink loop, a field of another type) is an error naming the
file and the field. The checks (``check`` over a table of fields and kinds) serve bench.report too."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path

from bench import speculation
from bench.parsers import csv_header, csv_value, parse_nvidia_smi_csv, parse_prometheus

CELL_FILE = re.compile(r"book-context-(\d+)k-c(\d+)\.json")
SUMMARY_FIELDS = ("mean_prompt_tokens", "mean_ttft_seconds", "mean_decode_tokens_per_second",
                  "mean_group_aggregate_tokens_per_second")
TELEMETRY_FIELDS = ("utilization.gpu", "power.draw", "temperature.gpu", "memory.used")
FIX = "Fix: take the file from the published runs again, or move it out of the folder"
TELEMETRY_FIX = (f"Fix: sample with nvidia-smi --query-gpu=timestamp,{','.join(TELEMETRY_FIELDS)} --format=csv, "
                 "or move it out of the folder")
MISSING = object()


def is_number(value) -> bool:
    """A finite number of 0 or more (not a boolean, not an integer beyond a float's range)."""
    try:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
    except OverflowError:
        return False


Kind = tuple[Callable[[object], bool], str]  # a test of a value, and what it expects
NUMBER: Kind = (is_number, "a number of 0 or more")
NUMBER_OR_NULL: Kind = (lambda value: value is None or is_number(value), "a number of 0 or more, or null")
NUMBERS: Kind = (lambda value: isinstance(value, list) and all(map(is_number, value)), "a list of numbers of 0 or more")
COUNT: Kind = (lambda value: type(value) is int and 1 <= value <= 10**9, "a whole number from 1 to 10^9")
TEXT: Kind = (lambda value: isinstance(value, str), "text")
OBJECT: Kind = (lambda value: isinstance(value, dict), "an object")
LIST: Kind = (lambda value: isinstance(value, list), "a list")


def optional(kind: Kind) -> Kind:
    """``kind``, or absent or null."""
    test, expected = kind
    return (lambda value: value in (MISSING, None) or test(value)), f"{expected}, null or absent"


CELL_FIELDS = (("summary", OBJECT), *((f"summary.{name}", NUMBER) for name in SUMMARY_FIELDS),
               ("summary.request_count", optional(COUNT)), ("configuration.max_tokens", optional(COUNT)))


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
            "telemetry": {path.name.removesuffix("-telemetry.csv"): read_telemetry(path) for path in sorted(newest.glob("*-telemetry.csv"))},
        })
    return runs


def read_cell(path: Path, profile: str) -> dict:
    """A cell in the shape bench.report compares: means as published, the speculative delta beside it."""
    size, concurrency = CELL_FILE.fullmatch(path.name).groups()
    data = load_json(path)
    check(path, data, CELL_FIELDS)
    summary = data["summary"]
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
        "spec": read_delta(delta_path) if present(delta_path) else None,
    }


def read_delta(path: Path) -> dict:
    """A speculative delta: its Prometheus series (one per draft position among them) as counters."""
    data = load_json(path)
    check(path, data, [("series_deltas", OBJECT)])
    series = data["series_deltas"]
    for name, value in series.items():
        if not is_number(value):
            refuse(path, f"series_deltas[{json.dumps(name)}]", value, NUMBER[1], FIX)
    metrics = parse_prometheus("\n".join(f"{name} {value}" for name, value in series.items()))
    if metrics.unreadable:
        raise ReferenceError(f"{path}: series_deltas has an entry that is not a Prometheus sample: {metrics.unreadable[0]}. {FIX}")
    return speculation.summary(speculation.delta(parse_prometheus(""), metrics))


def read_env(path: Path) -> dict[str, str]:
    if not present(path):
        return {}
    pairs = (line.split("=", 1) for line in read_text(path).splitlines() if "=" in line and not line.lstrip().startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def read_telemetry(path: Path) -> dict:
    """nvidia-smi --format=csv: a header naming TELEMETRY_FIELDS among its own, then samples of its
    width with a number or [N/A] in each of those (the header may repeat)."""
    lines = [(number, line) for number, line in enumerate(read_text(path).splitlines(), 1) if line.strip()]
    header = csv_header(lines[0][1]) if lines else None
    if header is None:
        first = f"line {lines[0][0]} is {lines[0][1][:60]!r}" if lines else "it is empty"
        raise ReferenceError(f"{path}: no nvidia-smi CSV header ({first}). {TELEMETRY_FIX}")
    missing = [name for name in TELEMETRY_FIELDS if name not in header]
    if missing:
        raise ReferenceError(f"{path}: no {missing[0]} column (the header has {', '.join(header)}). {TELEMETRY_FIX}")
    for number, line in lines[1:]:
        if csv_header(line) == header:
            continue
        values = [value.strip() for value in line.split(",")]
        if len(values) != len(header):
            raise ReferenceError(f"{path}: line {number} has {len(values)} values, the header {len(header)} ({line[:60]!r}). {FIX}")
        for name, value in zip(header, values):
            if name in TELEMETRY_FIELDS and not isinstance(csv_value(name, value), float | None):
                raise ReferenceError(f"{path}: line {number}: {name} is {value[:40]!r}; expected a number or [N/A]. {FIX}")
    return telemetry_summary(parse_nvidia_smi_csv([line for _, line in lines]))


def telemetry_summary(rows: list[dict]) -> dict:
    """Samples, mean GPU utilisation and power, peak temperature; None where nvidia-smi said [N/A]."""
    def values(field):
        return [row[field] for row in rows if isinstance(row.get(field), float)]

    def mean(field):
        return sum(values(field)) / len(values(field)) if values(field) else None

    return {"samples": len(rows), "mean_utilization_pct": mean("utilization.gpu"), "mean_power_w": mean("power.draw"),
            "peak_temperature_c": max(values("temperature.gpu"), default=None),
            "peak_memory_used_mib": max(values("memory.used"), default=None)}


def present(path: Path) -> bool:
    """There is something at ``path`` to read (a broken or looping symlink too: reading it says why)."""
    return path.exists() or path.is_symlink()


def read_text(path: Path, fix: str = FIX) -> str:
    """A file's text, or an error naming it: a directory, a symlink loop, unreadable, not UTF-8."""
    if path.is_dir():
        raise ReferenceError(f"{path}: a directory where a file belongs. {fix}")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ReferenceError(f"{path}: not UTF-8 text (byte {error.object[error.start]:#04x} at offset {error.start}). {fix}") from None
    except OSError as error:
        raise ReferenceError(f"{path}: cannot be read ({error.strerror}). {fix}") from None


def load_json(path: Path, fix: str = FIX) -> dict:
    try:
        data = json.loads(read_text(path, fix))
    except (ValueError, RecursionError) as error:
        raise ReferenceError(f"{path}: not JSON ({error}). {fix}") from None
    if not isinstance(data, dict):
        raise ReferenceError(f"{path}: the file is {shown(data)}; expected a JSON object. {fix}")
    return data


def shown(value) -> str:
    """A value as the JSON file spells it, cut to 40 characters."""
    text = "missing" if value is MISSING else json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def refuse(path: Path, where: str, value, expected: str, fix: str):
    raise ReferenceError(f"{path}: {where} is {shown(value)}; expected {expected}. {fix}")


def check(path: Path, data: dict, fields, fix: str = FIX, prefix: str = "") -> None:
    """Each (dotted key, kind) of ``fields`` in ``data`` passes its kind's test, in order (a table
    before its keys), or an error names the file, the field, the value seen and the fix."""
    for key, (test, expected) in fields:
        value = data
        for part in key.split("."):
            value = value.get(part, MISSING) if isinstance(value, dict) else MISSING
        if not test(value):
            refuse(path, prefix + key, value, expected, fix)
