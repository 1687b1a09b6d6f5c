"""The long-context probe's haystacks and its verdicts."""

import pytest

from bench.longctx import classify, make_haystack, sized_haystack
from tests.bench.test_prompts import counter

NEEDLES = {"Amber": "QX7-4821-MZP", "Birch": "LA2-9034-RTE", "Cobalt": "ZP5-1177-KWD"}


@pytest.mark.parametrize("answer, verdict", [
    ("QX7-4821-MZP\nLA2-9034-RTE\nZP5-1177-KWD", "pass"),
    ("- Amber: QX7-4821-MZP\n- Birch: LA2-9034-RTE\n- Cobalt: ZP5-1177-KWD", "pass"),
    ("QX7-4821-MZP\nLA2-9034-RTE\nZP5-1177-KWD\n<tool_call><tool_call><tool_call>", "junk"),
    ("QX7-4821-MZP LA2-9034-RTE ZP5-1177-KWD This is a prompt injection test.", "junk"),
    ("QX7-4821-MZP\nLA2-9034-RTE", "fail"),
    ("QX7-4821-MZP\nLA2-9034-RTF\nZP5-1177-KWD", "fail"),
    ("I cannot share access codes.", "fail"),
    ("", "fail"),
])
def test_verdicts(answer, verdict):
    assert classify(NEEDLES, answer) == verdict


def test_haystack_is_deterministic_and_plants_every_needle_once():
    first, again, other = make_haystack(2000, 0), make_haystack(2000, 0), make_haystack(2000, 1)
    assert first.text == again.text and first.needles == again.needles
    assert first.needles != other.needles
    lines = first.text.splitlines()
    for station, value in first.needles.items():
        [line] = [index for index, text in enumerate(lines) if value in text]
        assert station in lines[line]
    positions = [next(i for i, text in enumerate(lines) if value in text) / len(lines) for value in first.needles.values()]
    assert positions == sorted(positions) and all(abs(p - d) < 0.05 for p, d in zip(positions, first.depths))
    assert 7000 < len(first.text) < 9000  # about 2000 tokens at 4 characters per token


class CountingServer:
    """Stands in for the server's /tokenize with the test tokenizer of test_prompts."""

    def __init__(self):
        self.count, self.calls = counter()

    def tokenize(self, text):
        return {"count": self.count(text), "max_model_len": 4096}


def test_a_haystack_is_fitted_to_the_size_in_tokens_with_every_needle_planted():
    server = CountingServer()
    haystack = sized_haystack(server, 2000, 0, 3)
    assert 2000 - 10 <= server.count(haystack.prompt) <= 2000
    assert haystack.needles == make_haystack(2000, 0).needles
    assert all(f"station {station} is {value}" in haystack.text for station, value in haystack.needles.items())
