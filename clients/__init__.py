"""Client configurations for the Sparks' API, as pure functions of what the head serves: a
Codex CLI provider (the Responses API, a model catalog entry with the served context window,
compaction before long agent sessions degrade) and Claude Code settings (the Anthropic Messages
API), both pointing at a local SSH tunnel to the head. The key stays in a file of its own."""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

PROVIDER = "dual-spark"
KEY_ENV = "DUAL_SPARK_API_KEY"
INSTRUCTIONS = (
    "You are a coding agent working in the user's repository through the tools you are given. "
    "Read before you change anything, make the smallest change that does what was asked, run the "
    "project's tests when there are any, and finish with a short account of what you changed and why."
)


@dataclass(frozen=True)
class Served:
    """What the head serves, as the clients must know it."""

    model: str
    context_window: int
    compact_tokens: int
    profile: str
    head: str
    nodes: int


def sparks(nodes: int) -> str:
    return f"{'two' if nodes == 2 else nodes} DGX Sparks"


def compact_limit(agent_compact_tokens: int, context_window: int) -> int:
    """The profile's fence, never past 90% of the window (Codex's own default)."""
    return min(agent_compact_tokens, context_window * 9 // 10)


def tunnel_command(local_port: int, api_host: str, api_port: int, user: str, host: str, ssh_port: int,
                   key: str | None, known_hosts: str | None) -> str:
    """The ssh command that carries 127.0.0.1:local_port here to the head's loopback-only API."""
    args = ["ssh", "-N", "-L", f"127.0.0.1:{local_port}:{api_host}:{api_port}"]
    if ssh_port != 22:
        args += ["-p", str(ssh_port)]
    if key:
        args += ["-i", key]
    if known_hosts:
        args += ["-o", f"UserKnownHostsFile={known_hosts}"]
    return shlex.join([*args, f"{user}@{host}"])


def codex_config(served: Served, base_url: str, catalog_path: str, key_path: str, tunnel: str) -> str:
    """A CODEX_HOME config.toml whose default model is the Sparks' (TOML written by hand: the
    values are strings and integers only, quoted as JSON, which TOML accepts)."""
    return "\n".join([
        f"# The dual-spark endpoint ({served.head}, profile {served.profile}), written by `python -m clients`.",
        f"# Start the tunnel first: {tunnel}",
        f"# Then: export {KEY_ENV}=\"$(cat {shlex.quote(key_path)})\"",
        f"model = {json.dumps(served.model)}",
        f"model_provider = {json.dumps(PROVIDER)}",
        f"model_catalog_json = {json.dumps(catalog_path)}",
        f"model_context_window = {served.context_window}",
        f"model_auto_compact_token_limit = {served.compact_tokens}",
        "",
        f"[model_providers.{PROVIDER}]",
        f"name = {json.dumps(f'{served.model} on {sparks(served.nodes)} ({served.head})')}",
        f"base_url = {json.dumps(base_url + '/v1')}",
        'wire_api = "responses"',
        f"env_key = {json.dumps(KEY_ENV)}",
        "",
    ])


def codex_catalog(served: Served) -> dict:
    """Codex's model catalog (its ModelsResponse): the served model's metadata, so Codex knows
    its window and compaction point instead of falling back to guesses."""
    return {"models": [{
        "slug": served.model, "display_name": served.model,
        "description": f"Served by {sparks(served.nodes)} (profile {served.profile})",
        "supported_reasoning_levels": [], "shell_type": "shell_command", "visibility": "list", "supported_in_api": True,
        "priority": 1, "upgrade": None, "base_instructions": INSTRUCTIONS, "supports_reasoning_summaries": False,
        "support_verbosity": False, "default_verbosity": None, "apply_patch_tool_type": None,
        "truncation_policy": {"mode": "tokens", "limit": 10000}, "supports_parallel_tool_calls": False,
        "context_window": served.context_window, "auto_compact_token_limit": served.compact_tokens,
        "experimental_supported_tools": [], "input_modalities": ["text"],
    }]}


def claude_settings(served: Served, base_url: str, key_path: str) -> dict:
    """Claude Code settings (for `claude --settings FILE`): every model alias is the served
    model; the key comes from the key file through apiKeyHelper, sent as a Bearer token."""
    return {
        "apiKeyHelper": shlex.join(["cat", key_path]),
        "env": {
            "ANTHROPIC_BASE_URL": base_url,
            "ANTHROPIC_MODEL": served.model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": served.model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": served.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": served.model,
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        },
    }
