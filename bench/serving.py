"""Serving benchmark against any OpenAI-compatible endpoint (vLLM on the Sparks).

For each prompt size (in the server's tokens, counted by its /tokenize; by default the published
runs' 9,028 / 176,617 / 264,985): C1 = N requests one after another, and for each wider
concurrency C, N groups of C simultaneous requests; streaming, temperature 0, a fixed output
length. Per request: time to first token, decode tok/s (server-counted completion tokens after the
first, over the time from the first to the last token) and end-to-end tok/s; per group: aggregate
tok/s; mean, p50 and p95 of each. Speculative decoding per cell and per draft position comes from
/metrics snapshots around each cell. Writes one raw JSON file per run.

    python -m bench.serving --url http://127.0.0.1:8888 --concurrency 1,4 --requests 3 --profile adaptive
    python -m bench.serving --via-ssh spark@spark-head ...   # the API on the head's loopback
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlparse

import click
import requests

from bench import cli, speculation
from bench.endpoint import Endpoint, fit_prompts, read_api_key, served_model, through_site
from bench.parsers import parse_nvidia_smi_csv
from bench.prompts import PUBLISHED_SIZES, Prompt
from bench.remote import LineStream, Target, connect, forward

SCHEMA_VERSION = 1
REPO = Path(__file__).resolve().parents[1]
TELEMETRY_QUERY = "timestamp,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"


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


def git_revision() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return result.stdout.strip() or "unknown"


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


@click.command()
@click.option("--url", type=cli.Url(), default="http://127.0.0.1:8888", show_default=True, help="The API base URL (as seen from the head with --via-ssh).")
@click.option("--model", help="The served model name (default: what /v1/models names).")
@click.option("--api-key-env", default="VLLM_API_KEY", show_default=True, help="Environment variable holding the API key.")
@click.option("--api-key-file", type=cli.TextFile(), help="File holding the API key.")
@cli.site_option(default=False, help="Reach the head of this site file through an SSH tunnel; read the key, profile, image and model revision there.")
@click.option("--accept-new-host-key", is_flag=True, help="Record a node's SSH host key seen for the first time (else an error).")
@click.option("--prompt-tokens", "sizes", type=cli.PositiveIntList(max=cli.MAX_TOKENS, example="9028"),
              default=",".join(map(str, PUBLISHED_SIZES)), show_default=True,
              help="Prompt sizes in the server's tokens, comma-separated (default: the published runs' 10K/200K/300K).")
@click.option("--concurrency", "concurrencies", type=cli.PositiveIntList(max=cli.MAX_CONCURRENCY), default="1,4", show_default=True,
              help="Concurrencies, comma-separated (1 = sequential).")
@click.option("--requests", "groups", type=cli.count(1000), default=3, show_default=True, help="Requests (C1) or groups (C>1) per cell.")
@click.option("--max-tokens", type=cli.count(cli.MAX_TOKENS), default=256, show_default=True, help="Output length of every request.")
@click.option("--ignore-eos/--stop-at-eos", default=True, show_default=True, help="Always generate --max-tokens.")
@click.option("--profile", type=cli.Name(), help="Serving profile being measured (with --site: read on the head).")
@click.option("--model-revision", help="The weights' revision (with --site: read on the head).")
@click.option("--image-id", help="Runtime image id on the nodes (with --site: read on the head).")
@click.option("--via-ssh", type=cli.SshTarget(), help="user@head: reach the API through an SSH tunnel to the head.")
@click.option("--ssh-key", type=cli.TextFile(), help="Private key for --via-ssh and --telemetry.")
@click.option("--telemetry", type=cli.SshTarget(), multiple=True, help="user@node to sample nvidia-smi on during the run (repeatable).")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(url, model, api_key_env, api_key_file, cluster, accept_new_host_key, sizes, concurrencies, groups, max_tokens,
         ignore_eos, profile, model_revision, image_id, via_ssh, ssh_key, telemetry, out_dir):
    """Measure decode tok/s, TTFT and aggregate throughput; write raw JSON."""
    endpoint = Endpoint(url.rstrip("/"), model, read_api_key(api_key_env, api_key_file))
    identity = {}
    with ExitStack() as stack:
        if cluster:
            endpoint.url, endpoint.api_key, identity = through_site(stack, cluster, accept_new_host_key)
        elif via_ssh:
            parsed = urlparse(endpoint.url)
            client = stack.enter_context(connect(Target.parse(via_ssh, ssh_key), accept_new=accept_new_host_key))
            port = stack.enter_context(forward(client, parsed.hostname, parsed.port or 80))
            endpoint.url = f"http://127.0.0.1:{port}"
            click.echo(f"--> API at {url} on {via_ssh}, tunnelled to 127.0.0.1:{port}")
        endpoint.model = endpoint.model or served_model(endpoint)
        click.echo(f"--> sizing prompts of {','.join(map(str, sizes))} tokens with the server's /tokenize")
        prompts = fit_prompts(endpoint, sizes, max_tokens)
        streams = {}
        for spec in telemetry:
            client = stack.enter_context(connect(Target.parse(spec, ssh_key), accept_new=accept_new_host_key))
            streams[spec] = LineStream(client, f"nvidia-smi --query-gpu={TELEMETRY_QUERY} --format=csv -l 1")
        started = datetime.now(UTC)
        warm_up(endpoint, prompts[0])
        measured = run_benchmark(endpoint, prompts, concurrencies, groups, max_tokens, ignore_eos)
        samples = {spec: parse_nvidia_smi_csv(stream.stop()) for spec, stream in streams.items()}
    profile = profile or identity.get("profile", "unknown")
    record = {
        "schema_version": SCHEMA_VERSION,
        "started": started.isoformat(),
        "profile": profile, "model": endpoint.model,
        "model_revision": model_revision or identity.get("model_revision", "unknown"),
        "runtime_image_id": image_id or identity.get("image_id", "unknown"), "git_revision": git_revision(),
        "settings": {"url": url, "via_ssh": via_ssh, "site": str(cluster.path) if cluster else None,
                     "prompt_tokens": [p.requested_tokens for p in prompts],
                     "concurrency": concurrencies, "requests_per_cell": groups, "max_tokens": max_tokens,
                     "temperature": 0.0, "ignore_eos": ignore_eos, "warmup_requests": 1},
        **measured,
        "telemetry": samples,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"serving-{profile}-{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    path.write_text(json.dumps(record, indent=2))
    print_summary(record)
    click.echo(f"--> raw results: {path}")


def print_summary(record: dict) -> None:
    click.echo(f"{'prompt':>8} {'C':>3} {'prompt tok':>10} {'TTFT p50 s':>11} {'decode tok/s':>13} {'aggregate tok/s':>16}")
    def fmt(cell: dict, stat: str, digits: int = 2) -> str:
        value = cell[stat]["mean"]
        return "-" if value is None else f"{value:.{digits}f}"

    for cell in record["cells"]:
        click.echo(f"{cell['prompt']:>8} {cell['concurrency']:>3} {cell['prompt_tokens']['mean'] or 0:>10.0f} "
                   f"{(cell['ttft_s']['p50'] or 0):>11.3f} {fmt(cell, 'decode_tok_s'):>13} {fmt(cell, 'aggregate_tok_s'):>16}")
    spec = record["spec_decode"]
    if spec["drafts"]:
        click.echo(f"speculative decoding: {spec['drafts']:.0f} drafts, acceptance {spec['acceptance_rate']:.1%}, "
                   f"{spec['accepted_per_draft']:.2f} accepted tokens per draft; by position "
                   + " ".join(f"{rate:.0%}" for rate in spec["acceptance_per_position"]))
    for row in record["speculation"]:
        verdict = row["why"] or f"favours {row['favoured_length']} speculative tokens (of {row['measured_length']} measured)"
        click.echo(f"  {row['prompt']} C{row['concurrency']}: {verdict}")


if __name__ == "__main__":
    main()
