"""`python -m clients`' probe against a real vLLM that cannot take the agents' requests (this
directory's server: no tool-call parser, a 4,096-token window): each refusal is named with the
setting that fixes it, and what it does take is seen to answer."""

import pytest

from clients.__main__ import probe
from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.end_to_end  # a real vLLM, set up by scripts/test as root


def test_the_probe_names_the_missing_parser_and_the_short_window(vllm_server, capsys):
    failures = probe(vllm_server, API_KEY, "tiny", "adaptive", 4096)
    shown = capsys.readouterr().out
    # vLLM's Responses API takes tools without a parser (Codex would never see a tool call): the
    # Messages API refuses them, so the missing parser is named once.
    for plain in ("Responses API (Codex)", "chat completions", "Messages API (Claude Code)", "Codex's tools (tool_choice auto)"):
        assert f"{plain}: answers" in shown, shown
    [claude_tools, claude_window] = failures
    assert claude_tools.startswith("Claude Code's tools (tool_choice auto): /v1/messages answered 400: the agents send tools "
                                   "with tool_choice auto"), failures
    assert "Fix: set tool_call_parser in [model] to vLLM's parser for this model" in claude_tools, failures
    assert claude_window.startswith("Claude Code's 32,000 output tokens: /v1/messages answered 400: "), failures
    assert "more than the served window of 4,096. Fix: raise max_model_len of [profile.adaptive] to at least 64,000" \
        in claude_window, failures
    assert API_KEY not in shown + "".join(failures)
