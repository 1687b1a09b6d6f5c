"""The Prometheus view of a benchmark's run: what the deploy's recording rules (dual_spark:*)
recorded on the head while the run lasted, kept beside the benchmark's own figures. Prometheus is
asked once its rules have seen the run's end (bench.serving waits two of the site's metrics
intervals), over the run's length and that wait (its own clock, not this machine's)."""

from __future__ import annotations

import math
from contextlib import ExitStack

import click
import requests

from bench.remote import forward, head_of
from cluster import Cluster
from files.dual_spark.metrics import series_means


def through_site(stack: ExitStack, cluster: Cluster, accept_new: bool) -> str | None:
    """The head's Prometheus through an SSH tunnel (it listens on the head's loopback); None when
    the site runs none."""
    settings = cluster.settings
    if not settings.observability:
        return None
    client = stack.enter_context(head_of(cluster, accept_new))
    port = stack.enter_context(forward(client, "127.0.0.1", settings.prometheus_port))
    click.echo(f"--> {cluster.head.hostname}'s Prometheus at 127.0.0.1:{settings.prometheus_port}, tunnelled to 127.0.0.1:{port}")
    return f"http://127.0.0.1:{port}"


def run_window(url: str, seconds: float, timeout: float = 30) -> dict:
    """Every recording rule's series over the last ``seconds``: its mean and last value (NaN
    samples, such as a rate with no finished request in its window, left out); or why not."""
    window = max(1, math.ceil(seconds))
    view = {"url": url, "seconds": window, "rules": {}, "error": None}
    try:
        response = requests.get(f"{url}/api/v1/query", params={"query": f'{{__name__=~"dual_spark:.+"}}[{window}s]'}, timeout=timeout)
        response.raise_for_status()
        series = series_means(response.json()["data"]["result"])
    except (requests.RequestException, ValueError, KeyError, TypeError) as error:
        return {**view, "error": f"no answer at {url}: {error}"}
    for found in series:
        view["rules"].setdefault(found["name"], []).append({"labels": found["labels"], "mean": found["mean"], "last": found["last"]})
    return view


def summary(view: dict) -> str | None:
    """One line of the view for the benchmark's summary; None when there is nothing to say."""
    if view.get("error"):
        return f"Prometheus: {view['error']}"
    def mean(rule: str) -> float | None:
        values = [series["mean"] for series in view["rules"].get(rule, []) if series["mean"] is not None]
        return values[0] if values else None

    parts = [text.format(value) for rule, text in (
        ("dual_spark:decode_tokens_per_second:per_stream", "decode {:.1f} tok/s per stream"),
        ("dual_spark:generation_tokens_per_second:aggregate", "{:.1f} tok/s in all"),
        ("dual_spark:time_to_first_token_seconds:p95", "TTFT p95 {:.2f} s"),
        ("dual_spark:kv_cache_usage:ratio", "KV cache {:.0%}"),
        ("dual_spark:spec_decode_acceptance_length:mean", "{:.2f} tokens per step"),
    ) if (value := mean(rule)) is not None]
    return f"Prometheus over the run's {view['seconds']} s (the rules' rates, averaged): " + ", ".join(parts) if parts else None
