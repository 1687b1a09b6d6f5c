"""The canaries' rules (files/dual_spark/canary.py) on answers as vLLM returns them, token IDs and
text: what needs no reference (an answer, broken text, a loop at the end) and the comparison with
the answer recorded when the state before served. The lab's fault (lab/vllm_sitecustomize.py)
makes the answers these rules must catch. The tool canary's, on a CPU vLLM 0.32's real chat answers
(four lab nodes, the hermes parser): a parsed call, and the same request under the lab's fault. Against a real vLLM: tests/serving/test_canary.py."""

import json
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from dual_spark import canary

import site_schema
from lab import site as lab_site
from lab.vllm_sitecustomize import wrong_after
from serving_data import defaults
from tests.net import QuietServer

REPO = Path(__file__).resolve().parents[2]
ANSWER = [514, 1311, 1746, 165, 143, 355, 1032, 1783, 1040, 653] * 3  # a period of 10: longer than LOOP_PERIOD
PROMPT = "def is_prime(n: int) -> bool:\n"


def recorded_answer(tokens: list[int], max_tokens: int = len(ANSWER), prompt: str = PROMPT) -> dict:
    """An answer as the canary records it: its request and its tokens."""
    return {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": False, "tokens": tokens}


def test_an_answer_with_no_loop_at_its_end_passes():
    assert canary.loop_at_end(ANSWER + [170] * 20) is None  # 20 repeats: fewer than LOOP_TOKENS
    assert canary.ill_formed("plain text, a newline\n and a tab\t", ANSWER) == []


@pytest.mark.parametrize("period", [1, 2, 8])
def test_a_loop_filling_the_answers_end_is_runaway_repetition(period):
    loop = list(range(100, 100 + period)) * (canary.LOOP_TOKENS // period + 1)
    tokens = ANSWER + loop
    assert canary.loop_at_end(tokens) == (period, len(ANSWER))
    [found] = canary.ill_formed("text", tokens)
    assert found == f"runaway repetition: a loop of {period} token(s) from token {len(ANSWER)} to the end ({len(loop)} tokens)"


def test_a_loop_of_a_longer_period_is_not_taken_for_one():
    assert canary.loop_at_end(ANSWER * 10) is None  # period 10 > LOOP_PERIOD: prose may repeat a sentence


@pytest.mark.parametrize("text, found", [
    ("ok \ufffd then", "a replacement character '\ufffd' at character 3"),
    ("ok \x1b[31m", "a control byte '\\x1b' at character 3"),
    ("ok \x00", "a control byte '\\x00' at character 3"),
])
def test_broken_text_is_named_with_where_it_is(text, found):
    assert canary.ill_formed(text, ANSWER) == [found]


def test_a_character_cut_by_max_tokens_at_the_end_is_not_broken_text():
    assert canary.ill_formed("the answer ends mid-charac\ufffd", ANSWER) == []
    assert canary.ill_formed("the answer ends mid-charac\ufffd", ANSWER, ("answer", "text", "loop")) == []


def test_an_empty_answer_fails_and_a_check_left_out_is_not_made():
    assert canary.ill_formed("", []) == ["empty answer: no token generated"]
    assert canary.ill_formed("", [], ("loop",)) == []
    assert canary.ill_formed("bad \ufffd text", ANSWER, ("answer", "loop", "greedy")) == []


def test_the_first_difference_is_the_first_position_that_differs_or_the_shorter_ones_end():
    assert canary.first_difference(ANSWER, list(ANSWER)) is None
    assert canary.first_difference(ANSWER, ANSWER[:7] + [0] + ANSWER[8:]) == 7
    assert canary.first_difference(ANSWER, ANSWER[:12]) == 12


def checked(tokens: list[int], recorded: list[int] | None, agree: int, checks=canary.CHECKS) -> list[str]:
    spec = {"name": "long", "prompt": PROMPT, "max_tokens": len(ANSWER), "checks": list(checks)}
    return canary.checked(spec, {"text": "text", "tokens": tokens}, None if recorded is None else recorded_answer(recorded), agree)


def test_a_greedy_answer_must_agree_with_the_recorded_one_over_agree_tokens():
    changed = ANSWER[:20] + [t ^ 1 for t in ANSWER[20:]]
    assert checked(changed, ANSWER, 30) == [f"differs from the recorded answer at token 20 "
                                            f"(of {len(ANSWER)}; the first 30 must agree)"]
    assert checked(changed, ANSWER, 20) == []  # drift past what the site requires
    assert checked(changed, None, 30) == []  # nothing recorded on these weights
    assert checked(changed, ANSWER, 30, ("answer", "loop")) == []  # no greedy check asked for


@pytest.mark.parametrize("second, failed", [("agrees", False), ("differs again", True)])
def test_a_greedy_answer_that_differs_is_asked_again_once_and_counts_only_if_it_differs_again(second, failed):
    spec = {"name": "long", "prompt": PROMPT, "max_tokens": len(ANSWER)}
    changed = {"text": "t", "tokens": ANSWER[:5] + [ANSWER[5] ^ 1] + ANSWER[6:]}
    answers = iter([changed, {"text": "t", "tokens": list(ANSWER)} if second == "agrees" else changed])
    asked = []
    got, failures = canary.settled(spec, recorded_answer(ANSWER), 30, lambda: asked.append(1) or next(answers))
    assert len(asked) == 2 and bool(failures) == failed
    assert got["tokens"] == (changed["tokens"] if failed else ANSWER)
    assert failures == ([f"differs from the recorded answer at token 5 (of {len(ANSWER)}; the first 30 must agree)"] if failed else [])


def test_an_answer_that_agrees_or_breaks_a_rule_is_asked_once():
    asked = []
    spec = {"name": "long", "prompt": PROMPT, "max_tokens": 100}
    got, failures = canary.settled(spec, None, 30, lambda: asked.append(1) or {"text": "t", "tokens": [7] * 100})
    assert len(asked) == 1 and failures[0].startswith("runaway repetition")


@pytest.mark.parametrize("recorded", [recorded_answer(ANSWER[:5], max_tokens=5), recorded_answer(ANSWER[:5], 30, "another prompt"),
                                      {**recorded_answer(ANSWER[:5], 30), "ignore_eos": True}, {"tokens": ANSWER[:5], "max_tokens": 30}],
                         ids=["another length", "another prompt", "ignore_eos", "its request not recorded"])
def test_a_recorded_answer_to_another_request_is_no_reference(recorded):
    """A site that changed a canary has no answer to compare it with until a state records one."""
    spec = {"name": "long", "prompt": PROMPT, "max_tokens": 30}
    assert canary.checked(spec, {"text": "t", "tokens": ANSWER}, recorded, 30) == []
    assert canary.checked(spec, {"text": "t", "tokens": ANSWER}, recorded_answer(ANSWER[:5], 30), 30) != []


def test_the_greedy_reference_is_of_the_same_weights_alone_and_a_perplexity_of_any(tmp_path):
    kept = tmp_path / "canary.json"
    assert canary.reference(kept, "abc", SPECULATION) == ({}, None)  # none recorded
    kept.write_text('{"model_digest": "abc", "answers": {"long": {"tokens": [1, 2]}, "odd": {"tokens": "x"}, "bad": 3, '
                    '"ppl": {"perplexity": 12.5, "scored": 80}, "nan": {"perplexity": "x"}}}')
    assert canary.reference(kept, "abc", SPECULATION)[0] == {"long": {"tokens": [1, 2]}, "ppl": {"perplexity": 12.5, "scored": 80}}
    assert canary.reference(kept, "other", SPECULATION)[0] == {"ppl": {"perplexity": 12.5, "scored": 80}}  # new weights answer differently by right
    kept.write_text("{")
    assert canary.reference(kept, "abc", SPECULATION) == ({}, None)


SPECULATION = '{"method":"ngram","num_speculative_tokens":3}'
ACCEPTED = {"drafts": 120, "per_position": [0.6, 0.4, 0.02]}


@pytest.mark.parametrize("digest, speculation, kept, found", [
    ("abc", SPECULATION, ACCEPTED, ACCEPTED),
    ("other", SPECULATION, ACCEPTED, None),
    ("abc", '{"method":"ngram","num_speculative_tokens":5}', ACCEPTED, None),
    ("abc", "unknown", ACCEPTED, None),
    ("abc", SPECULATION, {"drafts": 3, "per_position": ["x"]}, None),
], ids=["same weights and speculation", "other weights", "other speculation", "speculation not known", "not a record"])
def test_the_acceptance_reference_is_of_the_same_weights_and_speculation_alone(tmp_path, digest, speculation, kept, found):
    (tmp_path / "canary.json").write_text(json.dumps({"model_digest": "abc", "speculation": speculation if speculation == "unknown" else SPECULATION,
                                                      "answers": {}, "acceptance": kept}))
    assert canary.reference(tmp_path / "canary.json", digest, speculation)[1] == found


def test_the_draft_counters_are_read_from_vllms_own_metrics(tmp_path):
    """A CPU vLLM 0.32's /metrics, as the project pins it: its drafts, and accepted tokens by position."""
    text = (REPO / "tests/bench/fixtures/vllm_metrics.txt").read_text()
    server = QuietServer(("127.0.0.1", 0), type("Metrics", (BaseHTTPRequestHandler,), {
        "log_message": lambda self, *args: None,
        "do_GET": lambda self: (self.send_response(200), self.end_headers(), self.wfile.write(text.encode()))}))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        found = canary.draft_counters(f"http://127.0.0.1:{server.server_address[1]}", 10)
    finally:
        server.shutdown()
    drafts = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:spec_decode_num_drafts_total"))
    assert found == {"drafts": drafts, "accepted": {0: 2.0, 1: 0.0, 2: 0.0}}
    assert canary.draft_counters("http://127.0.0.1:9", 2) is None  # no answer


def test_acceptance_is_each_positions_share_of_the_drafts_between_two_readings():
    before = {"drafts": 100.0, "accepted": {0: 50.0, 1: 20.0}}
    assert canary.acceptance(before, {"drafts": 200.0, "accepted": {0: 110.0, 1: 45.0, 2: 5.0}}) == \
        {"drafts": 100, "per_position": [0.6, 0.25, 0.05]}
    assert canary.acceptance(before, {"drafts": 107.0, "accepted": {0: 55.0, 1: 21.0}}) is None  # too few drafts to judge
    assert canary.acceptance(None, before) is None


@pytest.mark.parametrize("now, failures", [
    ([0.55, 0.35, 0.0], []),  # within half of each; position 2 too rare to judge
    ([0.1, 0.35, 0.02], ["acceptance at draft position 0 is 0.10, 0.60 recorded (at least 0.5 times it allowed)"]),
    ([0.6, 0.4], []),  # another number of positions: another drafter, nothing to compare
], ids=["within the ratio", "collapsed at position 0", "other positions"])
def test_a_positions_acceptance_may_fall_at_most_to_the_ratio_of_the_recorded_one(now, failures):
    assert canary.acceptance_failures({"drafts": 100, "per_position": now}, ACCEPTED, 0.5) == failures
    assert canary.acceptance_failures({"drafts": 100, "per_position": now}, None, 0.5) == []


@pytest.mark.parametrize("now, recorded, found", [
    (12.0, 10.0, []),
    (12.5, 10.0, ["perplexity 12.5 is 1.25 times the 10 recorded (at most 1.2 allowed)"]),
    (900.0, None, []),
], ids=["within the ratio", "past it", "none recorded"])
def test_a_perplexity_may_rise_at_most_the_ratio_times_the_recorded_one(now, recorded, found):
    assert canary.perplexity_failures({"perplexity": now, "scored": 80}, recorded, 1.2) == found


@pytest.mark.parametrize("kind, caught", [("shift", "differs from the recorded answer at token 12"),
                                          ("repeat", "runaway repetition: a loop of 1 token(s) from token 11 to the end")])
def test_the_labs_fault_makes_answers_the_canaries_catch(kind, caught):
    """The lab's fault, fed the answer in steps as vLLM's output processor is (with speculation,
    several tokens a step), changes nothing before its token and every token after it."""
    long = (ANSWER * 4)[:100]
    sent: list[int] = []
    for start in range(0, len(long), 3):
        sent += wrong_after(kind, 12, sent, long[start:start + 3])
    assert sent[:12] == long[:12]
    assert sent[12:] == ([theirs ^ 1 for theirs in long[12:]] if kind == "shift" else [long[11]] * 88)
    assert any(found.startswith(caught) for found in checked(sent, long, 100))


def test_the_labs_canaries_are_the_products_and_the_programs_checks_the_schemas():
    assert sorted(defaults()["canary"]) == sorted(lab_site.CANARIES)
    assert canary.CHECKS == site_schema.CANARY_CHECKS


TOOL = {"name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TOOL_CANARY = {"name": "tool", "prompt": "What is the weather in Paris?", "max_tokens": 96, "checks": ["answer", "loop", "greedy"],
               "tool": TOOL, "extra_body": {"structured_outputs": {"regex": "<tool_call>.*</tool_call>"}, "temperature": 0.7}}


def asked_as_a_chat(answered: str) -> tuple[dict, dict]:
    """The tool canary asked of a server answering as vLLM did (fixtures/chat-tool-call-ANSWERED.json):
    the request it received, by path, and the canary's answer."""
    body = (REPO / f"tests/programs/fixtures/chat-tool-call-{answered}.json").read_bytes()
    received = {}

    def do_POST(self):
        received[self.path] = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200), self.send_header("Content-Type", "application/json"), self.end_headers(), self.wfile.write(body)

    server = QuietServer(("127.0.0.1", 0), type("Chat", (BaseHTTPRequestHandler,), {"log_message": lambda self, *args: None, "do_POST": do_POST}))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        return received, canary.answer(f"http://127.0.0.1:{server.server_address[1]}", "key", "tiny", TOOL_CANARY, 10)
    finally:
        server.shutdown()


def test_a_tool_canary_is_a_chat_offering_its_tool_and_passes_on_a_parsed_call():
    received, got = asked_as_a_chat("ok")
    [(path, body)] = received.items()
    assert path == "/v1/chat/completions"
    assert body["tools"] == [{"type": "function", "function": TOOL}] and body["tool_choice"] == "auto"
    assert body["messages"] == [{"role": "user", "content": TOOL_CANARY["prompt"]}] and "prompt" not in body
    assert body["structured_outputs"] == TOOL_CANARY["extra_body"]["structured_outputs"]
    assert (body["temperature"], body["max_tokens"], body["return_token_ids"]) == (0, 96, True)  # the canary's own, over extra_body's
    assert got["tool_calls"] == [{"name": "get_weather", "arguments": '{"city": "Oslo"}'}] and len(got["tokens"]) == 64
    assert canary.checked(TOOL_CANARY, got, None, 64) == []
    assert canary.checked(TOOL_CANARY, got, {**canary.request(TOOL_CANARY), "tokens": got["tokens"]}, 64) == []


def test_a_tool_call_the_parser_could_not_read_fails_the_tool_canary():
    """The lab's fault from token 20: the parser reads no call, and gives the text back as content."""
    _, got = asked_as_a_chat("broken")
    assert got["tool_calls"] == [] and got["text"].startswith("<tool_call>")
    assert canary.checked(TOOL_CANARY, got, None, 64) == \
        ["no tool call parsed from the answer (finish reason stop): the served tool parser found none"]


@pytest.mark.parametrize("called, failure", [
    ({"name": "get_time", "arguments": '{"city": "Oslo"}'}, "a call of 'get_time', not of the tool offered, 'get_weather'"),
    ({"name": "get_weather", "arguments": '{"city": "Oslo"'}, "the call's arguments are not JSON: '{\"city\": \"Oslo\"'"),
    ({"name": "get_weather", "arguments": '["Oslo"]'}, "the call's arguments are not a JSON object: '[\"Oslo\"]'"),
    ({"name": "get_weather", "arguments": '{"town": "Oslo"}'}, "the call's arguments lack the required city"),
    ({"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "C"}'}, None),
])
def test_a_tool_call_must_be_of_the_tool_offered_with_json_arguments_holding_its_required_ones(called, failure):
    found = canary.tool_failures(TOOL, {"tool_calls": [called], "finish_reason": "tool_calls"})
    assert found == ([failure] if failure else [])


def test_a_recorded_tool_answer_is_compared_only_with_the_same_tool_offered():
    recorded = {**canary.request(TOOL_CANARY), "tokens": ANSWER}
    assert canary.comparable(TOOL_CANARY, recorded)
    assert not canary.comparable({**TOOL_CANARY, "tool": {**TOOL, "name": "get_time"}}, recorded)
    assert not canary.comparable({key: value for key, value in TOOL_CANARY.items() if key != "tool"}, recorded)
