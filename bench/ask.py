"""One chat request to the Sparks' API, through an SSH tunnel to the head (the API listens
on the head's loopback only), with the key read on the head and never printed.

    python -m bench.ask [--site site.toml] "Say hello in five words."
"""

from __future__ import annotations

import time
from contextlib import ExitStack

import click
import requests

from bench import cli
from bench.endpoint import through_site
from cluster import Cluster


@click.command()
@click.argument("question")
@cli.site_option()
@click.option("--max-tokens", type=cli.count(cli.MAX_TOKENS), default=64, show_default=True)
@click.option("--accept-new-host-key", is_flag=True, help="Record the head's SSH host key if seen for the first time.")
def main(question: str, cluster: Cluster, max_tokens: int, accept_new_host_key: bool) -> None:
    """Ask the served model one question; print its answer."""
    with ExitStack() as stack:
        url, key, identity = through_site(stack, cluster, accept_new_host_key)
        headers = {"Authorization": f"Bearer {key}"}
        model = requests.get(f"{url}/v1/models", headers=headers, timeout=30).json()["data"][0]["id"]
        started = time.monotonic()
        response = requests.post(f"{url}/v1/chat/completions", headers=headers, timeout=600, json={
            "model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens})
        if response.status_code != 200:
            raise click.ClickException(f"the API answered {response.status_code}: {response.text[:300]}")
        answer = response.json()
    usage = answer.get("usage", {})
    click.echo(f"--> {model} ({identity['profile']}) answered in {time.monotonic() - started:.2f} s, "
               f"{usage.get('completion_tokens', '?')} tokens:")
    click.echo(answer["choices"][0]["message"]["content"])


if __name__ == "__main__":
    main()
