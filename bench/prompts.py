"""Deterministic prompt fixtures: a synthetic service log whose text depends only on the seed, so
runs of different profiles are compared on identical input.

A measured prompt is sized in the server's own tokens: ``fit_prompt`` cuts the log where the
server's ``/tokenize`` counts the whole chat prompt (template, log and task) as the requested
number. The published runs used 9,028 / 176,617 / 264,985 prompt tokens and called them
10K / 200K / 300K; those are the defaults, so cells line up with theirs."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

# About 4 characters per token for English-like text; only a first guess for the fit.
CHARS_PER_TOKEN = 4
TOLERANCE = 0.005
PUBLISHED_SIZES = {9028: "10K", 176617: "200K", 264985: "300K"}
WORDS = (
    "cluster node rail fabric token batch prefill decode cache kernel driver memory bandwidth "
    "latency request stream worker head model layer expert tensor parallel reduce link cable "
    "verify deploy profile serve queue commit build test result metric sample window context"
).split()
T = TypeVar("T")
TASK = "\n\nSummarize the log above in plain prose, then list what a maintainer should check first."


class PromptError(Exception):
    """A prompt size the server cannot take or the fit cannot reach."""


@dataclass(frozen=True)
class Prompt:
    name: str
    requested_tokens: int
    text: str
    tokens: int | None = None  # as the server counts the chat prompt; None when sized by characters

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def log_text(chars: int, seed: int | str = 0) -> str:
    """The first ``chars`` characters of the synthetic log (a longer one starts the same way)."""
    rng = random.Random(seed)
    lines, size, number = [], 0, 0
    while size < chars:
        number += 1
        line = f"[{number:06d}] " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14))) + "."
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


class Log:
    """The synthetic log of one seed, generated as far as it has been asked for."""

    def __init__(self, seed: int | str = 0):
        self.seed, self.text = seed, ""

    def prefix(self, chars: int) -> str:
        if chars > len(self.text):
            self.text = log_text(max(chars, 2 * len(self.text)), self.seed)
        return self.text[:chars]


def rough_prompt(approx_tokens: int, seed: int = 0) -> Prompt:
    """A prompt sized by characters, for a server that cannot count tokens (a stub)."""
    return Prompt(label(approx_tokens), approx_tokens, log_text(approx_tokens * CHARS_PER_TOKEN, seed) + TASK)


def fit_prompt(tokens: int, count: Callable[[str], int], seed: int = 0) -> Prompt:
    """The longest prefix of the log that, with the task, ``count`` (the server's /tokenize of the
    chat prompt) puts at ``tokens`` or just under."""
    log = Log(seed)
    text, counted = fit(tokens, count, lambda chars: log.prefix(chars) + TASK)
    return Prompt(label(tokens), tokens, text, counted)


def fit(tokens: int, count: Callable[[T], int], compose: Callable[[int], T], max_calls: int = 40) -> tuple[T, int]:
    """What ``compose(chars)`` makes with the most characters of filler that ``count`` puts at
    ``tokens`` or just under, and its count: within TOLERANCE (or one token) or PromptError.

    Tokens grow almost linearly with characters, so each guess interpolates between the closest
    counts below and above the target; a guess that would not narrow the bracket bisects it."""
    seen: dict[int, int] = {0: count(compose(0))}
    if seen[0] >= tokens:
        raise PromptError(f"{tokens} tokens is less than the chat template and fixed text alone ({seen[0]} tokens)")
    low, high = 0, None  # characters of filler: counts below / above the target
    guess = tokens * CHARS_PER_TOKEN
    while len(seen) < max_calls:
        seen[guess] = count(compose(guess))
        if seen[guess] == tokens:
            low = guess
            break
        if seen[guess] < tokens:
            low = max(low, guess)
        else:
            high = guess if high is None else min(high, guess)
        if high is not None and high - low <= 1:
            break
        guess = next_guess(low, seen[low], high, seen.get(high), tokens)
    best = min((chars for chars in seen if seen[chars] <= tokens), key=lambda chars: tokens - seen[chars])
    if tokens - seen[best] > max(tokens * TOLERANCE, 1):
        raise PromptError(f"could not size a prompt to {tokens} tokens: the closest below was {seen[best]}")
    return compose(best), seen[best]


def next_guess(low: int, low_count: int, high: int | None, high_count: int | None, tokens: int) -> int:
    if high is None:  # nothing above yet: aim a little past the target to bracket it
        return max(low + 1, int(low + (tokens - low_count) * max(low, 1) / max(low_count, 1) * 1.02) + 1)
    guess = low + round((tokens - low_count) * (high - low) / max(high_count - low_count, 1))
    return guess if low < guess < high else (low + high) // 2


def label(tokens: int) -> str:
    """9028 -> "10K" (the published run's name), 10000 -> "10K", 1048576 -> "1048K", 300 -> "300"."""
    if tokens in PUBLISHED_SIZES:
        return PUBLISHED_SIZES[tokens]
    return f"{tokens // 1000}K" if tokens >= 1000 and tokens % 1000 == 0 else str(tokens)
