"""Serving benchmark against any OpenAI-compatible endpoint (vLLM on the Sparks).

For each prompt size (in the server's tokens, counted by its /tokenize; by default the published
runs' 9,028 / 176,617 / 264,985): C1 = N requests one after another, and for each wider
concurrency C, N groups of C simultaneous requests; streaming, temperature 0, a fixed output
length. Per request: time to first token, decode tok/s (server-counted completion tokens after the
first, over the time from the first to the last token) and end-to-end tok/s; per group: aggregate
tok/s; mean, p50 and p95 of each. Speculative decoding per cell and per draft position comes from
/metrics snapshots around each cell. With Prometheus on the head (a site with observability on, or
--prometheus), the deploy's recording rules over the run are kept beside these figures. Writes one
raw JSON file per run.

    python -m bench.serving --url http://127.0.0.1:8888 --concurrency 1,4 --requests 3 --profile adaptive
    python -m bench.serving --via-ssh spark@spark-head ...   # the API on the head's loopback
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from datetime import UTC, datetime
from urllib.parse import urlparse

import click

from bench import cli, prometheus
from bench.endpoint import Endpoint, fit_prompts, read_api_key, served_model, through_site
from bench.load import run_benchmark, warm_up
from bench.parsers import parse_nvidia_smi_csv
from bench.prompts import PUBLISHED_SIZES
from bench.remote import LineStream, Target, connect, forward

SCHEMA_VERSION = 1
TELEMETRY_QUERY = "timestamp,name,utilization.gpu,memory.used,memory.total,temperature.gpu,power.draw"


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
@click.option("--prometheus", "prometheus_url", type=cli.Url(),
              help="A Prometheus with the deploy's rules, reachable from here (with --site: the head's, tunnelled, when observability is on).")
@click.option("--out", "out_dir", default="bench/results", show_default=True, type=cli.OutputDir())
def main(url, model, api_key_env, api_key_file, cluster, accept_new_host_key, sizes, concurrencies, groups, max_tokens,
         ignore_eos, profile, model_revision, image_id, via_ssh, ssh_key, telemetry, prometheus_url, out_dir):
    """Measure decode tok/s, TTFT and aggregate throughput; write raw JSON."""
    endpoint = Endpoint(url.rstrip("/"), model, read_api_key(api_key_env, api_key_file))
    identity = {}
    with ExitStack() as stack:
        if cluster:
            endpoint.url, endpoint.api_key, identity = through_site(stack, cluster, accept_new_host_key)
            prometheus_url = prometheus_url or prometheus.through_site(stack, cluster, accept_new_host_key)
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
        seconds = (datetime.now(UTC) - started).total_seconds()
        # The site's Prometheus scrapes the run's last samples and evaluates its rules over them
        # within two of its intervals: a run shorter than that would find no rule's value yet.
        settle = 2 * cluster.settings.metrics_interval_seconds if cluster and prometheus_url else 0
        time.sleep(settle)
        view = prometheus.run_window(prometheus_url.rstrip("/"), seconds + settle) if prometheus_url else None
    profile = profile or identity.get("profile", "unknown")
    record = {
        "schema_version": SCHEMA_VERSION,
        "started": started.isoformat(),
        "profile": profile, "model": endpoint.model,
        "model_revision": model_revision or identity.get("model_revision", "unknown"),
        "runtime_image_id": image_id or identity.get("image_id", "unknown"), "git_revision": cli.git_revision(),
        "settings": {"url": url, "via_ssh": via_ssh, "site": str(cluster.path) if cluster else None,
                     "prompt_tokens": [p.requested_tokens for p in prompts],
                     "concurrency": concurrencies, "requests_per_cell": groups, "max_tokens": max_tokens,
                     "temperature": 0.0, "ignore_eos": ignore_eos, "warmup_requests": 1},
        **measured,
        "telemetry": samples,
        "prometheus": view,
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
    if record.get("prometheus") and (line := prometheus.summary(record["prometheus"])):
        click.echo(line)


if __name__ == "__main__":
    main()
