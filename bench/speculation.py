"""Speculative decoding from vLLM's counters: acceptance overall and per draft position, what a
shorter draft would have accepted per step, and which draft length the measurement favours.

vLLM counts a draft position as accepted only when every earlier position was, and a drafter
proposes its first n tokens the same way whatever the draft length, so a run with N speculative
tokens also tells what n < N would have accepted: sum of the first n positions over the drafts."""

from __future__ import annotations

COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
    "generation_tokens": "vllm:generation_tokens_total",
}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def per_position(series: list[tuple[dict[str, str], float]]) -> list[float]:
    """Values of a per-position metric summed over engines, position 0 first."""
    sums: dict[int, float] = {}
    for labels, value in series:
        if labels.get("position", "").isdecimal():
            sums[int(labels["position"])] = sums.get(int(labels["position"]), 0.0) + value
    return [sums.get(position, 0.0) for position in range(max(sums, default=-1) + 1)]


def delta(before, after) -> dict:
    """Counter deltas between two /metrics readings (bench.parsers.Metrics)."""
    counted = {key: after.get(name, 0.0) - before.get(name, 0.0) for key, name in COUNTERS.items()}
    old, new = per_position(before.series.get(PER_POSITION, [])), per_position(after.series.get(PER_POSITION, []))
    old += [0.0] * (len(new) - len(old))
    return {**counted, "accepted_per_position": [n - o for n, o in zip(new, old)]}


def summary(counted: dict) -> dict:
    """Acceptance overall and per position, and for each draft length n up to the measured one the
    accepted tokens a step would have carried (``expected_accepted``) and tokens per step (1 + that)."""
    drafts, positions = counted["drafts"], counted["accepted_per_position"]
    by_position = [accepted / drafts for accepted in positions] if drafts else []
    lengths = [{"num_speculative_tokens": n, "expected_accepted": sum(by_position[:n]),
                "tokens_per_step": 1 + sum(by_position[:n])} for n in range(len(by_position) + 1)]
    return {
        **counted,
        "acceptance_rate": counted["accepted_tokens"] / counted["draft_tokens"] if counted["draft_tokens"] else None,
        "accepted_per_draft": counted["accepted_tokens"] / drafts if drafts else None,
        "acceptance_per_position": by_position,
        "draft_lengths": lengths,
    }


def favoured_lengths(cells: list[dict]) -> list[dict]:
    """Which draft length the measurement favours, per prompt and concurrency.

    ``cells``: {"prompt", "concurrency", "decode_tok_s" (mean per request), "spec" (a summary)}.
    A sequence's decode step lasts (tokens per step) / (decode tok/s). Through the C1 cell and a
    wider one of the same prompt the step time is fitted as base + per_token * C * (n + 1): one more
    drafted token costs what one more token in the verified batch costs. The favoured n maximises
    C * (1 + expected accepted at n) / step time, over the lengths measured (0 = no speculation)."""
    rows = []
    for prompt in dict.fromkeys(cell["prompt"] for cell in cells):
        of_prompt = {cell["concurrency"]: cell for cell in cells if cell["prompt"] == prompt and usable(cell)}
        single = of_prompt.get(1)
        for concurrency in sorted(c for c in of_prompt if c > 1):
            rows += fit(prompt, single, of_prompt[concurrency]) if single else []
    return rows


def usable(cell: dict) -> bool:
    return bool(cell["decode_tok_s"]) and bool(cell["spec"]) and len(cell["spec"]["draft_lengths"]) > 1


def step_seconds(cell: dict) -> float:
    return cell["spec"]["draft_lengths"][-1]["tokens_per_step"] / cell["decode_tok_s"]


def fit(prompt: str, single: dict, wide: dict) -> list[dict]:
    measured = len(single["spec"]["draft_lengths"]) - 1
    width = wide["concurrency"]
    per_token = (step_seconds(wide) - step_seconds(single)) / ((width - 1) * (measured + 1))
    base = step_seconds(single) - per_token * (measured + 1)
    rows = []
    for cell in (single, wide):
        concurrency = cell["concurrency"]
        row = {"prompt": prompt, "concurrency": concurrency, "fitted_with": [1, width], "measured_length": measured,
               "base_step_ms": base * 1e3, "per_token_ms": per_token * 1e3}
        if base <= 0 or per_token < 0:
            rows.append({**row, "favoured_length": None, "predicted_decode_tok_s": None,
                         "why": "step times do not fit base + per-token cost (noise, or prefill inside the decode window)"})
            continue
        predicted = [concurrency * length["tokens_per_step"] / (base + per_token * concurrency * (length["num_speculative_tokens"] + 1))
                     for length in cell["spec"]["draft_lengths"]]
        rows.append({**row, "favoured_length": max(range(len(predicted)), key=predicted.__getitem__),
                     "predicted_decode_tok_s": predicted, "why": None})
    return rows


def step_fit(cells: list[dict]) -> dict | None:
    """The decode step of one prompt's cells, all measured at one draft length N, fitted by least
    squares as base + per_token * C * (N + 1); None without two concurrencies or when the step
    times do not fit (no fixed cost, or a step that gets shorter with more tokens)."""
    points = [(cell["concurrency"] * len(cell["spec"]["draft_lengths"]), step_seconds(cell)) for cell in cells]
    if len({x for x, _ in points}) < 2:
        return None
    mean_x, mean_y = (sum(x for x, _ in points) / len(points), sum(y for _, y in points) / len(points))
    per_token = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x, _ in points)
    base = mean_y - per_token * mean_x
    return {"base_step_ms": base * 1e3, "per_token_ms": per_token * 1e3} if base > 0 and per_token >= 0 else None


def schedule(cells: list[dict]) -> dict:
    """The draft length the measurement favours at each concurrency, as a per-batch-size schedule.

    ``cells`` as for favoured_lengths, all at one draft length N. Per prompt the step is fitted over
    every concurrency (step_fit); at concurrency C a draft of k <= N carries 1 + the first k
    positions' acceptance measured at C, per step of base + per_token * C * (k + 1). The k chosen
    at C has the highest such decode rate relative to N's, averaged over the prompts; a concurrency
    no fitted prompt measured keeps N. Ranges of equal k make the schedule."""
    cells = [cell for cell in cells if usable(cell)]
    if not cells:
        return {"measured_length": None, "fits": {}, "rows": [], "schedule": []}
    measured = len(cells[0]["spec"]["draft_lengths"]) - 1
    prompts = list(dict.fromkeys(cell["prompt"] for cell in cells))
    fits = {prompt: step_fit([cell for cell in cells if cell["prompt"] == prompt]) for prompt in prompts}
    rows = []
    for concurrency in sorted({cell["concurrency"] for cell in cells}):
        behind = []
        for cell in (cell for cell in cells if cell["concurrency"] == concurrency):
            fitted = fits[cell["prompt"]]
            predicted = [1e3 * length["tokens_per_step"] / (fitted["base_step_ms"] + fitted["per_token_ms"] * concurrency * (length["num_speculative_tokens"] + 1))
                         for length in cell["spec"]["draft_lengths"]] if fitted else None
            behind.append({"prompt": cell["prompt"], "step_ms": step_seconds(cell) * 1e3,
                           "acceptance_per_position": cell["spec"]["acceptance_per_position"], "predicted_decode_tok_s": predicted})
        fitted = [row["predicted_decode_tok_s"] for row in behind if row["predicted_decode_tok_s"]]
        relative = [sum(predicted[k] / predicted[measured] for predicted in fitted) / len(fitted) for k in range(measured + 1)] if fitted else []
        favoured = max(range(measured + 1), key=relative.__getitem__) if fitted else measured
        rows.append({"concurrency": concurrency, "favoured_length": favoured, "relative_to_measured": relative, "behind": behind,
                     "why": None if fitted else "no prompt's step times fit: keeps the measured length"})
    ranges: list[list[int]] = []
    for row in rows:
        if ranges and ranges[-1][2] == row["favoured_length"] and ranges[-1][1] == row["concurrency"] - 1:
            ranges[-1][1] = row["concurrency"]
        else:
            ranges.append([row["concurrency"], row["concurrency"], row["favoured_length"]])
    return {"measured_length": measured, "fits": fits, "rows": rows, "schedule": ranges}
