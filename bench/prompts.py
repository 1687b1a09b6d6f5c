"""Deterministic prompt fixtures: the same seed and size give the same text, byte for byte,
on every machine, so runs of different profiles are compared on identical input."""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass

# Roughly 4 characters per token for English-like text on DeepSeek's tokenizer; the server's
# usage.prompt_tokens is what gets reported, this only sizes the text.
CHARS_PER_TOKEN = 4
WORDS = (
    "cluster node rail fabric token batch prefill decode cache kernel driver memory bandwidth "
    "latency request stream worker head model layer expert tensor parallel reduce link cable "
    "verify deploy profile serve queue commit build test result metric sample window context"
).split()


@dataclass(frozen=True)
class Prompt:
    name: str
    approx_tokens: int
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()


def make_prompt(approx_tokens: int, seed: int = 0) -> Prompt:
    """A synthetic service log of about ``approx_tokens`` tokens with a task at the end."""
    rng = random.Random(f"{seed}:{approx_tokens}")
    lines, size, target = [], 0, approx_tokens * CHARS_PER_TOKEN
    number = 0
    while size < target:
        number += 1
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 14)))
        line = f"[{number:06d}] {words}."
        lines.append(line)
        size += len(line) + 1
    body = "\n".join(lines)
    task = "\n\nSummarize the log above in plain prose, then list what a maintainer should check first."
    return Prompt(name=label(approx_tokens), approx_tokens=approx_tokens, text=body + task)


def label(tokens: int) -> str:
    """10000 -> "10K", 1048576 -> "1048K", 300 -> "300"."""
    return f"{tokens // 1000}K" if tokens >= 1000 and tokens % 1000 == 0 else str(tokens)
