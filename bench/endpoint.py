"""The served API as the tools reach it: an OpenAI-compatible endpoint (its key never in a repr),
sized prompts in the server's own tokens, and a site's head reached through an SSH tunnel with
the key, profile, image and model revision read there. bench.serving, bench.tune, bench.ask,
bench.longctx, bench.client_overhead and clients are front ends over it."""

from __future__ import annotations

import os
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import click
import requests

from bench.parsers import Metrics, parse_prometheus
from bench.prompts import Prompt, PromptError, fit_prompt
from bench.reference import ReferenceError, read_text
from bench.remote import forward, head_of, read_secret, serving_identity
from cluster import Cluster
from layout import paths, store_entry


@dataclass
class Endpoint:
    url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout: float = 3600

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metrics(self) -> Metrics:
        response = requests.get(f"{self.url}/metrics", headers=self.headers, timeout=30)
        response.raise_for_status()
        return parse_prometheus(response.text)

    def tokenize(self, text: str) -> dict:
        """The server's count of ``text`` sent as the user message of a chat request, and its max
        model length (vLLM's /tokenize applies the chat template the served requests get)."""
        body = {"model": self.model, "messages": [{"role": "user", "content": text}]}
        response = requests.post(f"{self.url}/tokenize", json=body, headers=self.headers, timeout=600)
        if response.status_code == 404:
            raise click.ClickException(f"{self.url} has no /tokenize: prompts are sized in the server's tokens, "
                                       "which vLLM counts there. Fix: point --url at the vLLM API")
        response.raise_for_status()
        return response.json()


def room_for(endpoint: Endpoint, sizes: list[int], max_tokens: int, option: str = "--prompt-tokens") -> None:
    """Refuse a prompt size that leaves no room for the output under the served max model length."""
    max_model_len = endpoint.tokenize("")["max_model_len"]
    for size in sizes:
        if size + max_tokens > max_model_len:
            raise click.ClickException(
                f"{option} {size} plus --max-tokens {max_tokens} is more than the served max model length "
                f"{max_model_len}. Fix: ask for at most {max_model_len - max_tokens} prompt tokens, or serve a "
                "profile with a longer context (long-c4)")


def fit_prompts(endpoint: Endpoint, sizes: list[int], max_tokens: int) -> list[Prompt]:
    """Prompts of exactly (within 0.5%) ``sizes`` tokens as the server counts them; a size that
    leaves no room for the output is refused first."""
    room_for(endpoint, sizes, max_tokens)
    try:
        return [fit_prompt(size, lambda text: endpoint.tokenize(text)["count"]) for size in sizes]
    except PromptError as error:
        raise click.ClickException(f"--prompt-tokens: {error}") from None


def read_api_key(api_key_env: str, api_key_file: str | None) -> str | None:
    if api_key_file:
        try:
            return read_text(Path(api_key_file).expanduser(), "Fix: give the file holding the key alone, as text").strip() or None
        except ReferenceError as error:
            raise click.ClickException(f"--api-key-file {error}") from None
    return os.environ.get(api_key_env) or None


def served_model(endpoint: Endpoint) -> str:
    response = requests.get(f"{endpoint.url}/v1/models", headers=endpoint.headers, timeout=30)
    if response.status_code != 200:
        raise click.ClickException(f"/v1/models answered {response.status_code}: is the API key the head's?")
    return response.json()["data"][0]["id"]


def through_site(stack: ExitStack, cluster: Cluster, accept_new: bool, client_name: str | None = None) -> tuple[str, str, dict]:
    """The API of a site's head through an SSH tunnel: the local URL, the key (the deploy's own,
    or ``client_name``'s; read on the head, never printed) and what it serves (profile, image ID,
    model revision, read on the head)."""
    settings = cluster.settings
    where = paths(settings.state_dir, store_entry(settings.model_dir, cluster.model.source))
    client = stack.enter_context(head_of(cluster, accept_new))
    port = stack.enter_context(forward(client, settings.api_host, settings.api_port))
    key = read_secret(client, f"{where['clients']}/{client_name}.key" if client_name else where["api_key"])
    identity = serving_identity(client, where["manifest"])
    click.echo(f"--> {cluster.head.hostname}'s API at {settings.api_host}:{settings.api_port}, "
               f"tunnelled to 127.0.0.1:{port}; profile {identity['profile']}")
    return f"http://127.0.0.1:{port}", key, identity
