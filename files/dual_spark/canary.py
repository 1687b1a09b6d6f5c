"""Are the answers still right? The canary set, run through vLLM's API at temperature 0 after a
change has served its first token and before its state is recorded as one that served. Each
answer is checked by rules that need no reference (an answer at all, text without replacement
characters or control bytes, no runaway loop at its end). A canary with a tool is asked as a chat
offering that tool (tool_choice auto): its answer must hold a call of it that the served tool
parser parsed, its arguments a JSON object with the tool's required parameters. Where the
state that served before ran the same weights, each greedy answer is compared with the one
recorded then, token by token: speculative decoding is lossless at temperature 0, so a
difference is a defect of the new state, except past --agree-tokens (numerical drift the site
tolerates), or when the answer agrees asked again (other requests sharing its batch can move a
near tie). New weights answer differently by right: a perplexity canary, the model's perplexity
over a fixed text (the API's prompt log-probabilities), may rise at most --perplexity-ratio times
the one recorded, whatever weights that state served. Where the state speculates, the drafts
accepted at each draft position over the set (vLLM's own counters, read before and after) may fall
to no less than --acceptance-ratio times the share recorded by a state of the same weights and
the same --speculation: a drafter whose acceptance collapses answers right, only slowly. Prints a
line per canary (never the key); writes the answers and results to --out as JSON, for the state's
record (stack record keeps them with it); exits 1 naming each canary that failed, how and where.

    canary --url URL --key-file FILE --set JSON --model-digest HEX --cluster ID --agree-tokens N
           --perplexity-ratio R --speculation JSON --acceptance-ratio R --out FILE [--reference FILE]
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import sys
import time
import urllib.request
from pathlib import Path

from .atomic import write_atomically
from .health import call
from .secret import KEY_FIX, SecretError, read_secret

# What a canary's answer is checked for (each canary names its own; all of them by default):
CHECKS = ("answer", "text", "loop", "greedy")  # any token; no broken text; no loop at the end; the recorded greedy answer
ASKED_WITH = ("tool", "extra_body")  # what else a canary may be asked with: a tool offered (a function's name, description,
# parameters), and fields laid under the request's own (a site's; the lab's forces its random model's answer to a call)
LOOP_PERIOD = 8  # tokens: the longest n-gram a runaway loop repeats
LOOP_TOKENS = 64  # a loop's share of an answer's end, in tokens, that fails it
BROKEN_TEXT = re.compile("[\ufffd\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
CUT = 3  # characters at an answer's end where a replacement character is a character cut by max_tokens
DIFFERS = "differs from the recorded answer"  # a greedy answer's failure; asked again once before it counts
DRAFTS, ACCEPTED = "vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_per_pos_total"
ACCEPTANCE = "acceptance by draft position"  # its failures' name beside the canaries' (no canary's name has a space)
UNKNOWN = "unknown"  # --speculation of a state whose speculation the caller does not know: its acceptance is judged against nothing
MIN_DRAFTS = 8  # fewer drafts over the set say nothing of a position's acceptance (the lab's set makes about 13)
MIN_SHARE = 0.05  # a position whose recorded share is below this is too rare to judge


def loop_at_end(tokens: list[int]) -> tuple[int, int] | None:
    """The period and start of a loop of at most LOOP_PERIOD tokens that fills the answer's last
    LOOP_TOKENS tokens or more (one token repeated, or an n-gram); None when there is none."""
    for period in range(1, LOOP_PERIOD + 1):
        start = len(tokens) - period
        while start > 0 and tokens[start - 1] == tokens[start - 1 + period]:
            start -= 1
        if len(tokens) - start >= LOOP_TOKENS:
            return period, start
    return None


def ill_formed(text: str, tokens: list[int], checks: tuple[str, ...] = CHECKS) -> list[str]:
    """What is wrong with an answer that no reference is needed to see (of ``checks``), each said plainly."""
    if not tokens:
        return ["empty answer: no token generated"] if "answer" in checks else []
    found = []
    broken = BROKEN_TEXT.search(text)
    if broken and broken.group() == chr(0xFFFD) and broken.start() >= len(text) - CUT:
        broken = None
    if broken and "text" in checks:
        found.append(f"{'a replacement character' if broken.group() == chr(0xFFFD) else 'a control byte'} "
                     f"{broken.group()!r} at character {broken.start()}")
    if "loop" in checks and (loop := loop_at_end(tokens)):
        period, start = loop
        found.append(f"runaway repetition: a loop of {period} token(s) from token {start} to the end ({len(tokens) - start} tokens)")
    return found


def first_difference(tokens: list[int], recorded: list[int]) -> int | None:
    """The first position where two greedy answers differ (the shorter one's end if it ends
    first); None when they are the same."""
    for position, (mine, theirs) in enumerate(zip(tokens, recorded)):
        if mine != theirs:
            return position
    return None if len(tokens) == len(recorded) else min(len(tokens), len(recorded))


def completed(url: str, key: str, canary: dict, body: dict, timeout: float, path: str = "/v1/completions") -> dict:
    """The first choice of one canary's request to ``path``; a CanaryError saying what the API
    answered when it was not 200."""
    status, found = call(url, key, path, body, timeout)
    if status != 200:
        message = found.get("error", {}).get("message") if isinstance(found.get("error"), dict) else found.get("message")
        raise CanaryError(f"{canary['name']}: the API answered {status}: {str(message or found)[:200]}", status)
    return found["choices"][0]


def request(canary: dict) -> dict:
    """What makes a greedy canary's answer: two answers are compared only when it is the same
    (its tool and extra_body, where it has them)."""
    return {"prompt": canary["prompt"], "max_tokens": canary["max_tokens"], "ignore_eos": canary.get("ignore_eos", False),
            **{field: canary[field] for field in ASKED_WITH if canary.get(field)}}


def comparable(canary: dict, recorded: dict | None) -> bool:
    """Whether ``recorded`` is a greedy answer to the same request as ``canary``'s (a site that
    changed a canary's prompt or length has nothing to compare it with yet)."""
    asked = request(canary)
    return isinstance(recorded, dict) and isinstance(recorded.get("tokens"), list) and all(
        recorded.get(field) == asked.get(field) for field in (*asked, *ASKED_WITH))


def answer(url: str, key: str, model: str, canary: dict, timeout: float) -> dict:
    """One canary's greedy answer: its text and token IDs (vLLM's return_token_ids); for a canary
    with a tool, a chat offering it, and the calls the served tool parser found in the answer."""
    asked = request(canary)
    body = {**asked.pop("extra_body", {}), "model": model, "temperature": 0, "return_token_ids": True}
    if "tool" in asked:
        tool, prompt = asked.pop("tool"), asked.pop("prompt")
        choice = completed(url, key, canary, {**body, **asked, "messages": [{"role": "user", "content": prompt}],
                                              "tools": [{"type": "function", "function": tool}], "tool_choice": "auto"},
                           timeout, "/v1/chat/completions")
        message = choice.get("message") or {}
        found = {"text": message.get("content") or "", "finish_reason": choice.get("finish_reason"),
                 "tool_calls": [call["function"] for call in message.get("tool_calls") or []]}
    else:
        choice = completed(url, key, canary, {**body, **asked}, timeout)
        found = {"text": choice["text"]}
    if choice.get("token_ids") is None:
        raise CanaryError(f"{canary['name']}: the API returned no token IDs (vLLM's return_token_ids): the image's vLLM is too old")
    return {**found, "tokens": choice["token_ids"]}


def tool_failures(tool: dict, got: dict) -> list[str]:
    """What is wrong with a tool canary's answer: no call parsed from it, a call of another
    function, or arguments that are not a JSON object holding the tool's required parameters."""
    if not got["tool_calls"]:
        return [f"no tool call parsed from the answer (finish reason {got['finish_reason']}): the served tool parser found none"]
    called = got["tool_calls"][0]
    if called.get("name") != tool["name"]:
        return [f"a call of {called.get('name')!r}, not of the tool offered, {tool['name']!r}"]
    try:
        arguments = json.loads(called.get("arguments") or "")
    except ValueError:
        return [f"the call's arguments are not JSON: {str(called.get('arguments'))[:80]!r}"]
    if not isinstance(arguments, dict):
        return [f"the call's arguments are not a JSON object: {called.get('arguments')[:80]!r}"]
    missing = [name for name in tool.get("parameters", {}).get("required", []) if name not in arguments]
    return [f"the call's arguments lack the required {', '.join(missing)}"] if missing else []


def checked(canary: dict, got: dict, recorded: dict | None, agree_tokens: int) -> list[str]:
    """What fails in one canary's answer: the rules, then the comparison with ``recorded`` (the
    same canary's answer in the state before, on the same weights, to the same request) over its
    first ``agree_tokens`` tokens."""
    checks = tuple(canary.get("checks", CHECKS))
    failures = ill_formed(got["text"], got["tokens"], checks) + (tool_failures(canary["tool"], got) if canary.get("tool") else [])
    if "greedy" in checks and comparable(canary, recorded):
        differs = first_difference(got["tokens"][:agree_tokens], recorded["tokens"][:agree_tokens])
        if differs is not None:
            failures.append(f"{DIFFERS} at token {differs} "
                            f"(of {len(got['tokens'])}; the first {agree_tokens} must agree)")
    return failures


def scored(url: str, key: str, model: str, canary: dict, timeout: float) -> dict:
    """A perplexity canary's text scored by the model: exp of the mean negative log-probability
    of each of its tokens after the first (vLLM's prompt_logprobs), and how many were scored."""
    choice = completed(url, key, canary, {"model": model, "prompt": canary["prompt"], "max_tokens": 1, "temperature": 0,
                                          "prompt_logprobs": 0, "return_token_ids": True}, timeout)
    tokens, logprobs = choice.get("prompt_token_ids") or [], choice.get("prompt_logprobs") or []
    found = [entry[str(token)]["logprob"] for token, entry in zip(tokens, logprobs) if entry and str(token) in entry]
    if not found:
        raise CanaryError(f"{canary['name']}: the API returned no prompt log-probabilities (vLLM's prompt_logprobs)")
    return {"perplexity": round(math.exp(-sum(found) / len(found)), 4), "scored": len(found)}


def perplexity_failures(got: dict, recorded: float | None, ratio: float) -> list[str]:
    """A perplexity above ``ratio`` times the one recorded (none recorded: nothing to fail)."""
    if recorded is None or got["perplexity"] <= ratio * recorded:
        return []
    return [f"perplexity {got['perplexity']:.4g} is {got['perplexity'] / recorded:.2f} times the {recorded:.4g} recorded (at most {ratio} allowed)"]


def settled(canary: dict, recorded: dict | None, agree_tokens: int, ask) -> tuple[dict, list[str]]:
    """A greedy canary's answer (``ask()``) and what fails in it; an answer that differs from the
    recorded one is asked again once, and taken if it then agrees: a difference that does not
    repeat is other requests sharing its batch (a near tie moved), not the state."""
    got = ask()
    failures = checked(canary, got, recorded, agree_tokens)
    if any(found.startswith(DIFFERS) for found in failures):
        again = ask()
        if not checked(canary, again, recorded, agree_tokens):
            print(f"canary {canary['name']}: {'; '.join(failures)}, then agreed when asked again", flush=True)
            return again, []
    return got, failures


def draft_counters(url: str, timeout: float) -> dict | None:
    """vLLM's drafts and its accepted tokens by draft position, each summed over its engines; None
    when /metrics does not answer or counts no draft (a state that does not speculate)."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=timeout) as response:
            text = response.read().decode()
    except OSError:
        return None
    drafts, accepted = None, {}
    for line in text.splitlines():
        name, value = line.partition("{")[0].partition(" ")[0], line.rsplit(" ", 1)[-1]
        try:
            if name == DRAFTS:
                drafts = (drafts or 0.0) + float(value)
            elif name == ACCEPTED and (position := re.search(r'position="(\d+)"', line)):
                accepted[int(position[1])] = accepted.get(int(position[1]), 0.0) + float(value)
        except ValueError:
            continue
    return {"drafts": drafts, "accepted": accepted} if drafts is not None and accepted else None


def acceptance(before: dict | None, after: dict | None) -> dict | None:
    """The share of drafts accepted at each draft position between two readings, and how many
    drafts; None without both readings or with too few drafts to judge."""
    if before is None or after is None or after["drafts"] - before["drafts"] < MIN_DRAFTS:
        return None
    drafts = after["drafts"] - before["drafts"]
    shares = [round((after["accepted"][position] - before["accepted"].get(position, 0.0)) / drafts, 4)
              for position in sorted(after["accepted"])]
    return {"drafts": int(drafts), "per_position": shares}


def acceptance_failures(now: dict | None, recorded: dict | None, ratio: float) -> list[str]:
    """Each draft position whose share fell below ``ratio`` times the recorded one (where that was
    at least MIN_SHARE); nothing to fail without both, or with another number of positions."""
    if now is None or recorded is None or len(now["per_position"]) != len(recorded.get("per_position", [])):
        return []
    return [f"acceptance at draft position {position} is {share:.2f}, {recorded_share:.2f} recorded (at least {ratio} times it allowed)"
            for position, (share, recorded_share) in enumerate(zip(now["per_position"], recorded["per_position"]))
            if recorded_share >= MIN_SHARE and share < ratio * recorded_share]


class CanaryError(Exception):
    """What stops the canaries from running at all, in one line; ``status``, the API's answer
    when it was not 200."""

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def reference(path: Path | None, model_digest: str, speculation: str) -> tuple[dict, dict | None]:
    """The answers recorded with the state that served before, by canary name (its greedy answers
    when it served the same weights: new weights answer differently by right; its perplexities
    whatever it served), and its acceptance by draft position when it served the same weights
    with the same ``speculation``; ({}, None) without a record."""
    if path is None:
        return {}, None
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}, None
    if not isinstance(kept, dict) or not isinstance(kept.get("answers"), dict):
        return {}, None
    same = kept.get("model_digest") == model_digest
    answers = {name: found for name, found in kept["answers"].items() if isinstance(found, dict)
               and ((same and isinstance(found.get("tokens"), list)) or isinstance(found.get("perplexity"), (int, float)))}
    accepted = kept.get("acceptance")
    comparable_acceptance = same and UNKNOWN != speculation == kept.get("speculation") and isinstance(accepted, dict) \
        and isinstance(accepted.get("per_position"), list) and all(isinstance(share, (int, float)) for share in accepted["per_position"])
    return answers, accepted if comparable_acceptance else None


def run(url: str, key: str, canaries: list[dict], recorded: dict, agree_tokens: int, ratio: float, timeout: float) -> tuple[dict, dict]:
    """Every canary's answer and what failed in it, by name."""
    _, models = call(url, key, "/v1/models", None, timeout)
    model = models["data"][0]["id"]
    answers, failures = {}, {}
    for canary in canaries:
        started = time.monotonic()
        if canary.get("not_run"):
            print(f"canary {canary['name']}: not run: {canary['not_run']}", flush=True)
            continue
        if canary.get("perplexity"):
            got = scored(url, key, model, canary, timeout)
            before = recorded.get(canary["name"], {}).get("perplexity")
            answers[canary["name"]], failures[canary["name"]] = got, perplexity_failures(got, before, ratio)
            against = f"against {before:.4g} recorded" if before is not None else "none recorded"
            print(f"canary {canary['name']}: perplexity {got['perplexity']:.4g} over {got['scored']} tokens in "
                  f"{time.monotonic() - started:.1f} s, {against}: {'; '.join(failures[canary['name']]) or 'passed'}", flush=True)
            continue
        got, failures[canary["name"]] = settled(canary, recorded.get(canary["name"]), agree_tokens,
                                                functools.partial(answer, url, key, model, canary, timeout))
        answers[canary["name"]] = {**got, **request(canary)}
        verdict = "; ".join(failures[canary["name"]]) or "passed"
        compared = "compared with the recorded answers" if comparable(canary, recorded.get(canary["name"])) else "no answer of these weights recorded"
        print(f"canary {canary['name']}: {len(got['tokens'])} tokens in {time.monotonic() - started:.1f} s, {compared}: {verdict}", flush=True)
    return answers, failures


def judged_acceptance(before: dict | None, after: dict | None, recorded: dict | None, ratio: float) -> tuple[dict | None, list[str]]:
    """The set's acceptance by draft position and what fails in it, said in a line."""
    measured = acceptance(before, after)
    failures = acceptance_failures(measured, recorded, ratio)
    if measured is not None:
        shares = ", ".join(f"{share:.2f}" for share in measured["per_position"])
        against = (f"against {', '.join(f'{share:.2f}' for share in recorded['per_position'])} recorded" if recorded is not None
                   else "none recorded for these weights and this speculation")
        print(f"canary acceptance: {shares} by draft position over {measured['drafts']} drafts, {against}: "
              f"{'; '.join(failures) or 'passed'}", flush=True)
    return measured, failures


def main(argv: list[str], prog: str) -> None:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True)
    parser.add_argument("--key-file", type=Path, required=True)
    parser.add_argument("--set", required=True, help="the canaries: a JSON list of {name, prompt, max_tokens, ignore_eos, checks, "
                                                     "perplexity, tool, extra_body, not_run (why it is not run)}")
    parser.add_argument("--model-digest", required=True, help="the served weights' manifest digest")
    parser.add_argument("--cluster", required=True, help="the state's ID, kept with the answers")
    parser.add_argument("--agree-tokens", type=int, required=True, help="how many first tokens of a greedy answer must agree")
    parser.add_argument("--perplexity-ratio", type=float, required=True, help="how many times the recorded perplexity it may rise to")
    parser.add_argument("--speculation", required=True, help="the state's --speculative-config (none: it does not speculate)")
    parser.add_argument("--acceptance-ratio", type=float, required=True, help="the share of the recorded acceptance each draft position keeps")
    parser.add_argument("--reference", type=Path, help="the answers recorded with the state that served before")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--timeout", type=float, default=600, help="seconds for each request")
    args = parser.parse_args(argv)
    try:
        key = read_secret(args.key_file, "the API key file", KEY_FIX)
        canaries, url = json.loads(args.set), args.url.rstrip("/")
        recorded, recorded_acceptance = reference(args.reference, args.model_digest, args.speculation)
        before = draft_counters(url, args.timeout)
        answers, failures = run(url, key, canaries, recorded, args.agree_tokens, args.perplexity_ratio, args.timeout)
        measured, failures[ACCEPTANCE] = judged_acceptance(before, draft_counters(url, args.timeout), recorded_acceptance,
                                                             args.acceptance_ratio)
    except (SecretError, CanaryError) as error:
        sys.exit(f"canary: {error}")
    except (OSError, ValueError, KeyError, IndexError) as error:
        sys.exit(f"canary: no answer at {args.url}: {error}")
    failed = {name: found for name, found in failures.items() if found}
    write_atomically(args.out, json.dumps({"cluster": args.cluster, "model_digest": args.model_digest, "answers": answers,
                                           "speculation": args.speculation, "acceptance": measured,
                                           "failed": failed, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                                          sort_keys=True) + "\n", 0o644)
    if failed:
        sys.exit("canary: " + "; ".join(f"{name} failed: {', '.join(found)}" for name, found in failed.items()))
    print(f"canary: all {len(answers)} passed", flush=True)
