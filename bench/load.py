"""The load a serving benchmark puts on an OpenAI-compatible endpoint, and what it measures:
streaming chat requests one after another (C1) or in groups released together (C>1), per
request the time to first token, decode tok/s and end-to-end tok/s, per group the aggregate,
and per cell the speculative decoding counters' change. Used by bench.serving, bench.tune and
bench.client_overhead, each a command-line front end."""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import click
import requests

from bench import speculation
from bench.endpoint import Endpoint
from bench.prompts import Prompt


@dataclass
class RequestResult:
    prompt: str
    concurrency: int
    group: int
    started: float
    ttft_s: float | None
    duration_s: float
    prompt_tokens: int
    completion_tokens: int
    decode_tok_s: float | None
    e2e_tok_s: float
    error: str | None = None


def stream_chat(endpoint: Endpoint, prompt: Prompt, max_tokens: int, ignore_eos: bool) -> dict:
    """One streaming chat completion: chunk arrival times and the server's usage."""
    body = {
        "model": endpoint.model,
        "messages": [{"role": "user", "content": prompt.text}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,
    }
    started = time.perf_counter()
    token_times, usage = [], None
    with requests.post(f"{endpoint.url}/v1/chat/completions", json=body, headers=endpoint.headers,
                       stream=True, timeout=endpoint.timeout) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            # Every chunk after the role announcement carries output, even an empty string
            # (a token that detokenizes to nothing still took an engine step).
            if any("role" not in choice.get("delta", {}) for choice in chunk.get("choices", [])):
                token_times.append(time.perf_counter())
    return {"started": started, "ended": time.perf_counter(), "token_times": token_times, "usage": usage or {}}


def measure(endpoint: Endpoint, prompt: Prompt, max_tokens: int, ignore_eos: bool, concurrency: int, group: int) -> RequestResult:
    try:
        raw = stream_chat(endpoint, prompt, max_tokens, ignore_eos)
    except requests.RequestException as error:
        return RequestResult(prompt.name, concurrency, group, time.perf_counter(), None, 0.0, 0, 0, None, 0.0, str(error))
    times, usage = raw["token_times"], raw["usage"]
    completion = int(usage.get("completion_tokens", 0))
    duration = raw["ended"] - raw["started"]
    ttft = times[0] - raw["started"] if times else None
    decode_span = times[-1] - times[0] if len(times) > 1 else 0.0
    return RequestResult(
        prompt=prompt.name, concurrency=concurrency, group=group, started=raw["started"], ttft_s=ttft,
        duration_s=duration, prompt_tokens=int(usage.get("prompt_tokens", 0)), completion_tokens=completion,
        decode_tok_s=(completion - 1) / decode_span if decode_span > 0 else None,
        e2e_tok_s=completion / duration if duration > 0 else 0.0,
        error=None if usage else "the stream carried no usage",
    )


def run_groups(endpoint: Endpoint, prompt: Prompt, concurrency: int, groups: int, max_tokens: int,
               ignore_eos: bool, progress=None) -> tuple[list[RequestResult], list[dict]]:
    """``groups`` rounds of ``concurrency`` simultaneous requests (released together: the pool's
    threads start one by one); C1 is sequential requests."""
    requests_done, group_results = [], []
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for group in range(groups):
            together = threading.Barrier(concurrency)

            def one(group=group, together=together):
                together.wait()
                return measure(endpoint, prompt, max_tokens, ignore_eos, concurrency, group)

            futures = [pool.submit(one) for _ in range(concurrency)]
            results = [future.result() for future in futures]
            requests_done += results
            span = max(r.started + r.duration_s for r in results) - min(r.started for r in results)
            tokens = sum(r.completion_tokens for r in results)
            group_results.append({"group": group, "concurrency": concurrency, "completion_tokens": tokens,
                                  "seconds": span, "aggregate_tok_s": tokens / span if span > 0 else 0.0})
            if progress:
                progress.update(1)
    return requests_done, group_results


def percentile(values: list[float], fraction: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default)."""
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    position = (len(values) - 1) * fraction
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def summarize(values: list[float | None]) -> dict:
    present = [v for v in values if v is not None]
    return {
        "n": len(present),
        "mean": statistics.fmean(present) if present else None,
        "p50": percentile(present, 0.50),
        "p95": percentile(present, 0.95),
    }


def warm_up(endpoint: Endpoint, prompt: Prompt) -> None:
    """One short request whose figures are discarded (first-request compilation and caches)."""
    result = measure(endpoint, prompt, 16, True, 1, -1)
    if result.error:
        raise click.ClickException(f"warm-up request failed: {result.error}")


def run_benchmark(endpoint: Endpoint, prompts: list[Prompt], concurrencies: list[int], groups: int,
                  max_tokens: int, ignore_eos: bool, show_progress: bool = True) -> dict:
    """The measured part: metric snapshots around every prompt/concurrency cell."""
    first = before = endpoint.metrics()
    cells = []
    total_groups = len(prompts) * len(concurrencies) * groups
    with click.progressbar(length=total_groups, label="request groups", file=None if show_progress else open(os.devnull, "w")) as bar:
        for prompt in prompts:
            for concurrency in concurrencies:
                results, group_results = run_groups(endpoint, prompt, concurrency, groups, max_tokens, ignore_eos, bar)
                after = endpoint.metrics()
                cells.append({
                    "prompt": prompt.name, "prompt_sha256": prompt.sha256, "concurrency": concurrency,
                    "prompt_tokens_requested": prompt.requested_tokens, "prompt_tokens_counted": prompt.tokens,
                    "prompt_tokens": summarize([r.prompt_tokens for r in results]),
                    "ttft_s": summarize([r.ttft_s for r in results]),
                    "decode_tok_s": summarize([r.decode_tok_s for r in results]),
                    "e2e_tok_s": summarize([r.e2e_tok_s for r in results]),
                    "aggregate_tok_s": summarize([g["aggregate_tok_s"] for g in group_results]),
                    "completion_tokens": sum(r.completion_tokens for r in results),
                    "errors": [r.error for r in results if r.error],
                    "requests": [asdict(r) for r in results],
                    "groups": group_results,
                    "spec_decode": speculation.summary(speculation.delta(before, after)),
                })
                before = after
    return {"cells": cells, "spec_decode": speculation.summary(speculation.delta(first, after)),
            "speculation": speculation.favoured_lengths([
                {"prompt": c["prompt"], "concurrency": c["concurrency"], "decode_tok_s": c["decode_tok_s"]["mean"],
                 "spec": c["spec_decode"]} for c in cells])}
