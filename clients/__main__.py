"""Write Codex CLI and Claude Code configurations for this machine, pointing at a local SSH
tunnel to the head (its API listens on the head's loopback only). Reads on the head what it
serves and the API key; checks that the Responses, chat and Messages endpoints answer and take
what the agents send (tools with tool_choice auto, Claude Code's 32,000 output tokens), naming
the setting to change when they do not; writes the files; prints the tunnel command. The key
goes into a file only you can read, never to the screen.

    python -m clients [--site site.toml] [--out ~/.dual-spark/clients] [--port 8888] [--client NAME]

With --client NAME (a [client.NAME] of the site), the configuration carries that client's own key,
which the front door lets in until the client is removed from the site and the deploy runs.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import stat
from contextlib import ExitStack
from pathlib import Path

import click
import requests

from bench import cli
from bench.endpoint import through_site
from clients import KEY_ENV, Served, claude_settings, codex_catalog, codex_config, compact_limit, tunnel_command
from cluster import Cluster

CLAUDE_CODE_MAX_TOKENS = 32000  # what Claude Code 2.1 asks for on every turn
SAY_OK = [{"role": "user", "content": "Say OK."}]
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
PROBES = {
    "Responses API (Codex)": ("/v1/responses", lambda model: {"model": model, "input": "Say OK.", "max_output_tokens": 4}),
    "chat completions": ("/v1/chat/completions", lambda model: {"model": model, "messages": SAY_OK, "max_tokens": 4}),
    "Messages API (Claude Code)": ("/v1/messages", lambda model: {"model": model, "messages": SAY_OK, "max_tokens": 4}),
    "Codex's tools (tool_choice auto)": ("/v1/responses", lambda model: {
        "model": model, "input": "Say OK.", "max_output_tokens": 4, "tool_choice": "auto",
        "tools": [{"type": "function", "name": "read_file", "description": "Read a file.", "parameters": SCHEMA}]}),
    "Claude Code's tools (tool_choice auto)": ("/v1/messages", lambda model: {
        "model": model, "messages": SAY_OK, "max_tokens": 4, "tool_choice": {"type": "auto"},
        "tools": [{"name": "Read", "description": "Read a file.", "input_schema": SCHEMA}]}),
    # Streamed and dropped at its first line: the check of the length comes before any token.
    f"Claude Code's {CLAUDE_CODE_MAX_TOKENS:,} output tokens": ("/v1/messages", lambda model: {
        "model": model, "messages": SAY_OK, "max_tokens": CLAUDE_CODE_MAX_TOKENS, "stream": True}),
}


def fix_for(refusal: str, profile: str, window: int) -> str:
    """The setting that makes the endpoint take a refused request, from vLLM's words."""
    if "tool-call-parser" in refusal or "tool choice" in refusal:
        return ("the agents send tools with tool_choice auto, which vLLM takes only with a tool-call parser. "
                "Fix: set tool_call_parser in [model] to vLLM's parser for this model (deepseek_v4 for DeepSeek V4) "
                "and deploy again")
    if "max_model_len" in refusal or "maximum context length" in refusal:
        return (f"Claude Code asks for {CLAUDE_CODE_MAX_TOKENS:,} output tokens on top of a prompt of tens of thousands, "
                f"more than the served window of {window:,}. Fix: raise max_model_len of [profile.{profile}] to at least "
                f"{2 * CLAUDE_CODE_MAX_TOKENS:,} and deploy again")
    return refusal[:200]


def probe(url: str, key: str, model: str, profile: str, window: int) -> list[str]:
    """Each endpoint the clients use with what the agents send, no more than a few tokens
    generated; the failures, worded with their fix."""
    failures = []
    for name, (path, body) in PROBES.items():
        request = body(model)
        with requests.post(url + path, json=request, timeout=300, stream=request.get("stream", False),
                           headers={"Authorization": f"Bearer {key}", "anthropic-version": "2023-06-01"}) as answer:
            refusal = "" if answer.status_code == 200 else answer.text
        click.echo(f"    {name}: {'answers' if not refusal else f'REFUSED ({answer.status_code})'}")
        if refusal:
            failures.append(f"{name}: {path} answered {answer.status_code}: {fix_for(refusal, profile, window)}")
    return failures


def private_directory(path: Path) -> int:
    """An open descriptor of the directory ``path``: not a link, this user's, writable by no one
    else (who could otherwise swap in a file of theirs); refused otherwise, saying how to fix it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as error:
        raise click.ClickException(f"{path} is not a directory this user can open ({error.strerror}): nothing written "
                                   "there. Fix: give --out a directory of your own") from None
    info = os.fstat(descriptor)
    if info.st_uid != os.geteuid() or info.st_mode & 0o022:
        os.close(descriptor)
        whose = "writable by others" if info.st_uid == os.geteuid() else f"owned by user {info.st_uid}"
        raise click.ClickException(f"{path} is {whose}: the API key and its configurations are not written there. "
                                   f"Fix: chmod go-w {shlex.quote(str(path))} if it is yours, or give --out a directory of your own")
    return descriptor


def write(path: Path, text: str, mode: int = 0o644) -> None:
    """``text`` into ``path`` whole: a new file beside it under a random name (O_EXCL, no link
    followed, 0600 until it holds its text), renamed over it. A link at ``path`` is refused."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    directory = private_directory(path.parent)
    temporary = f".{path.name}.{secrets.token_hex(8)}"
    try:
        try:
            found = os.lstat(path.name, dir_fd=directory).st_mode
        except FileNotFoundError:
            found = stat.S_IFREG
        if not stat.S_ISREG(found):
            raise click.ClickException(f"{path} is {'a symbolic link' if stat.S_ISLNK(found) else 'not a regular file'}: "
                                       "nothing written through it. Fix: remove it, and run again")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=directory)
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(text)
                os.fchmod(handle.fileno(), mode)
            os.replace(temporary, path.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            os.unlink(temporary, dir_fd=directory)
            raise
    finally:
        os.close(directory)


@click.command()
@cli.site_option()
@click.option("--out", "out_dir", type=cli.OutputDir(mode=0o700), default="~/.dual-spark/clients", show_default=True, help="Where the files go.")
@click.option("--port", "local_port", type=cli.Port(), help="Local end of the tunnel (default: the API's port on the head).")
@click.option("--accept-new-host-key", is_flag=True, help="Record the head's SSH host key if seen for the first time.")
@click.option("--client", "client_name", help="A [client.NAME] of the site: its own key (revoked with it), not the deploy's.")
def main(cluster: Cluster, out_dir: Path, local_port: int | None, accept_new_host_key: bool, client_name: str | None) -> None:
    """Write client configurations for the Sparks' API."""
    if client_name is not None and client_name not in cluster.clients:
        raise click.BadParameter(f"the site names no [client.{client_name}]"
                                 + (f": its clients are {', '.join(cluster.clients)}" if cluster.clients else ": add the table, deploy, then run this"),
                                 param_hint="'--client'")
    settings = cluster.settings
    local_port = local_port or settings.api_port
    out = out_dir.resolve()
    os.close(private_directory(out))  # refused before the head is asked for the key
    with ExitStack() as stack:
        url, key, identity = through_site(stack, cluster, accept_new_host_key, client_name)
        models = requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        if models.status_code != 200:
            raise click.ClickException(f"the API answered {models.status_code}; run `pyinfra -y inventory.py tasks/status.py` to see why")
        listed = models.json()["data"][0]
        profile = cluster.profiles.get(identity["profile"])
        if profile is None:
            raise click.ClickException(f"the head runs profile {identity['profile']!r}, which this site file does not define")
        click.echo("--> The endpoints the clients use, with what the agents send:")
        failures = probe(url, key, listed["id"], identity["profile"], listed["max_model_len"])
    if failures:
        raise click.ClickException("the served endpoint cannot take the agents' requests, no file written:\n  "
                                   + "\n  ".join(failures))

    head = cluster.head
    served = Served(listed["id"], listed["max_model_len"], compact_limit(profile.agent_compact_tokens, listed["max_model_len"]),
                    identity["profile"], head.hostname, cluster.size)
    base_url = f"http://127.0.0.1:{local_port}"
    tunnel = tunnel_command(local_port, settings.api_host, settings.api_port, cluster.deploy_user, head.ssh_host, cluster.ssh_port,
                            str(Path(cluster.ssh_key).expanduser()) if cluster.ssh_key else None,
                            str(Path(cluster.known_hosts).expanduser()) if cluster.known_hosts else None)
    key_path, catalog = out / "api-key", out / "codex" / "model-catalog.json"
    write(key_path, key + "\n", 0o600)
    write(catalog, json.dumps(codex_catalog(served), indent=2) + "\n")
    write(out / "codex" / "config.toml", codex_config(served, base_url, str(catalog), str(key_path), tunnel))
    write(out / "claude" / "settings.json", json.dumps(claude_settings(served, base_url, str(key_path)), indent=2) + "\n")

    click.echo(f"--> Wrote {out}: api-key (mode 600), codex/config.toml, codex/model-catalog.json, claude/settings.json")
    click.echo(f"    {served.model}: context window {served.context_window:,} tokens, Codex compacts at {served.compact_tokens:,}")
    click.echo("--> Keep the tunnel open while you work (the API listens on the head's loopback only):")
    click.echo(f"    {tunnel}")
    click.echo("--> Codex CLI:")
    click.echo(f"    export {KEY_ENV}=\"$(cat {shlex.quote(str(key_path))})\"; CODEX_HOME={shlex.quote(str(out / 'codex'))} codex")
    click.echo("--> Claude Code:")
    click.echo(f"    claude --settings {shlex.quote(str(out / 'claude' / 'settings.json'))}")


if __name__ == "__main__":
    main()
