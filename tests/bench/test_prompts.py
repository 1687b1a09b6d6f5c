"""Prompts sized in the server's tokens: the fit against a counting function standing in for
/tokenize (the real one is tested against vLLM in tests/serving)."""

import re

import pytest

from bench.prompts import TASK, TOLERANCE, PromptError, fit_prompt, label, log_text

TEMPLATE_TOKENS = 9  # what a chat template adds around the user message


def counter():
    """Digits one by one, words in pieces of up to four letters, punctuation alone: not linear in
    characters, like a real tokenizer. Counts its calls."""
    calls = []

    def count(text: str) -> int:
        calls.append(len(text))
        return TEMPLATE_TOKENS + len(re.findall(r"\d|[a-z]{1,4}|[^\sa-z\d]", text.lower()))

    return count, calls


@pytest.mark.parametrize("tokens", [60, 300, 1500, 9028, 176617])
def test_a_prompt_is_fitted_to_the_requested_tokens(tokens):
    count, calls = counter()
    prompt = fit_prompt(tokens, count)
    assert prompt.tokens == count(prompt.text) <= tokens
    assert tokens - prompt.tokens <= tokens * TOLERANCE
    assert prompt.text.endswith(TASK) and prompt.requested_tokens == tokens
    assert len(calls) <= 25, f"{len(calls)} /tokenize calls"


def test_the_same_size_gives_the_same_text_and_a_larger_one_extends_it():
    count, _ = counter()
    small, again, large = fit_prompt(300, count), fit_prompt(300, count), fit_prompt(1500, count)
    assert small.sha256 == again.sha256
    assert large.text.startswith(small.text.removesuffix(TASK))
    assert log_text(5000).startswith(log_text(100))


def test_a_size_the_template_alone_exceeds_is_refused():
    count, _ = counter()
    with pytest.raises(PromptError, match=r"less than the chat template and fixed text alone"):
        fit_prompt(10, count)


def test_the_published_sizes_carry_the_published_names():
    assert [label(n) for n in (9028, 176617, 264985, 10000, 300)] == ["10K", "200K", "300K", "10K", "300"]
