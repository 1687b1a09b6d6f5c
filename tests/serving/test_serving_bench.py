"""The serving benchmark against a real vLLM: its figures agree with vLLM's own counters."""

import json
import os
import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

import pytest

from bench.endpoint import Endpoint, fit_prompts
from bench.load import run_benchmark, warm_up
from bench.prompts import TOLERANCE
from tests.serving.conftest import API_KEY

pytestmark = pytest.mark.end_to_end
REPO = Path(__file__).resolve().parents[2]
SIZES = [300, 1500]  # a character-sized prompt read 862 and 3,983 tokens for these on this tokenizer
# Long enough that a group's requests overlap by construction: on 2 busy cores a thread released by
# the group's barrier was seen to send up to 0.4 s after the first (a 48-token request lasts 0.08 s),
# and a C4 group of 1,024-token requests once missed overlapping by 1.4 ms; 2,048 tokens (ignore_eos,
# within the 4,096-token window with the 1,500-token prompt) double every request's length.
MAX_TOKENS = 2048
GROUPS = 1  # rounds of each concurrency


@pytest.fixture(scope="module")
def endpoint(vllm_server):
    return Endpoint(vllm_server, "tiny", API_KEY)


@pytest.fixture(scope="module")
def prompts(endpoint):
    prompts = fit_prompts(endpoint, SIZES, MAX_TOKENS)
    warm_up(endpoint, prompts[0])
    return prompts


@pytest.fixture(scope="module")
def measured(endpoint, prompts):
    before = endpoint.metrics()
    record = run_benchmark(endpoint, prompts, [1, 4], groups=GROUPS, max_tokens=MAX_TOKENS, ignore_eos=True, show_progress=False)
    after = endpoint.metrics()
    return before, record, after


def test_every_prompt_is_the_requested_size_in_the_servers_tokens(measured):
    """What the server counted for each request (usage.prompt_tokens) is within 0.5% of the request."""
    _, record, _ = measured
    for cell, size in zip(record["cells"][::2], SIZES):
        assert cell["prompt_tokens_requested"] == size
        served = {r["prompt_tokens"] for r in cell["requests"]}
        assert served == {cell["prompt_tokens_counted"]}, "/tokenize and the chat request counted differently"
        assert abs(cell["prompt_tokens_counted"] - size) <= size * TOLERANCE


def test_per_position_acceptance_sums_to_the_accepted_token_counter(measured):
    before, record, after = measured
    accepted = after.get("vllm:spec_decode_num_accepted_tokens_total") - before.get("vllm:spec_decode_num_accepted_tokens_total")
    spec = record["spec_decode"]
    assert len(spec["accepted_per_position"]) == 3  # num_speculative_tokens
    assert sum(spec["accepted_per_position"]) == spec["accepted_tokens"] == accepted > 0
    assert sum(sum(cell["spec_decode"]["accepted_per_position"]) for cell in record["cells"]) == accepted
    assert spec["acceptance_per_position"] == sorted(spec["acceptance_per_position"], reverse=True)
    lengths = spec["draft_lengths"]
    assert [length["num_speculative_tokens"] for length in lengths] == [0, 1, 2, 3]
    assert lengths[-1]["expected_accepted"] == pytest.approx(spec["accepted_per_draft"])


def test_each_prompt_gets_a_draft_length_verdict_per_concurrency(measured):
    _, record, _ = measured
    verdicts = {(row["prompt"], row["concurrency"]): row for row in record["speculation"]}
    assert set(verdicts) == {(label, c) for label in ("300", "1500") for c in (1, 4)}
    for row in verdicts.values():
        assert (row["favoured_length"] in range(4)) != bool(row["why"]), row


def test_completion_tokens_match_vllm_metrics(measured):
    before, record, after = measured
    counted = sum(cell["completion_tokens"] for cell in record["cells"])
    assert counted == after.get("vllm:generation_tokens_total") - before.get("vllm:generation_tokens_total")
    assert counted == len(SIZES) * (GROUPS * 1 + GROUPS * 4) * MAX_TOKENS
    assert all(not cell["errors"] for cell in record["cells"])


def test_prompt_tokens_come_from_the_server(measured):
    before, record, after = measured
    served = sum(r["prompt_tokens"] for cell in record["cells"] for r in cell["requests"])
    assert served == after.get("vllm:prompt_tokens_total") - before.get("vllm:prompt_tokens_total")


def test_four_concurrent_requests_run_at_once_and_aggregate_over_their_span(measured):
    """Each C4 group's requests overlap in time, and its aggregate is its tokens over the span from
    the first start to the last end (how fast is for bench/, not for a timed test)."""
    _, record, _ = measured
    for cell in (c for c in record["cells"] if c["concurrency"] == 4):
        for group in cell["groups"]:
            requests = [r for r in cell["requests"] if r["group"] == group["group"]]
            assert len(requests) == 4
            assert max(r["started"] for r in requests) < min(r["started"] + r["duration_s"] for r in requests), \
                [(r["started"], r["duration_s"], r["completion_tokens"]) for r in requests]
            span = max(r["started"] + r["duration_s"] for r in requests) - min(r["started"] for r in requests)
            assert group["seconds"] == pytest.approx(span)
            assert group["aggregate_tok_s"] == pytest.approx(sum(r["completion_tokens"] for r in requests) / span)


def test_acceptance_figures_match_metric_deltas(measured):
    before, record, after = measured
    spec = record["spec_decode"]
    deltas = {key: after.get(f"vllm:spec_decode_num_{key}_total") - before.get(f"vllm:spec_decode_num_{key}_total")
              for key in ("drafts", "draft_tokens", "accepted_tokens")}
    assert deltas["drafts"] > 0, "ngram speculation proposed nothing: the counters did not move"
    assert {key: spec[key] for key in deltas} == deltas
    assert spec["acceptance_rate"] == pytest.approx(deltas["accepted_tokens"] / deltas["draft_tokens"])
    assert spec["accepted_per_draft"] == pytest.approx(deltas["accepted_tokens"] / deltas["drafts"])


def test_per_request_timings_are_consistent(measured):
    _, record, _ = measured
    for cell in record["cells"]:
        for request in cell["requests"]:
            assert 0 < request["ttft_s"] < request["duration_s"]
            assert request["decode_tok_s"] > 0 and request["e2e_tok_s"] > 0
        stats = cell["decode_tok_s"]
        assert stats["n"] == len(cell["requests"]) and stats["p50"] <= stats["p95"]


def run_cli(tmp_path, vllm_server, env_key, profile="cpu-tiny", prompt_tokens="300", max_tokens="16"):
    env = {"PATH": "/usr/bin:/bin", **({"VLLM_API_KEY": env_key} if env_key else {})}
    return subprocess.run(
        [sys.executable, "-m", "bench.serving", "--url", vllm_server, "--model", "tiny", "--prompt-tokens", prompt_tokens,
         "--concurrency", "1,2", "--requests", "2", "--max-tokens", max_tokens, "--profile", profile,
         "--out", str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
    )


def test_cli_writes_raw_json_and_never_the_key(tmp_path, vllm_server):
    result = run_cli(tmp_path, vllm_server, API_KEY)
    assert result.returncode == 0, result.stderr
    [raw] = tmp_path.glob("serving-cpu-tiny-*.json")
    text = raw.read_text()
    record = json.loads(text)
    assert record["schema_version"] == 1 and record["profile"] == "cpu-tiny"
    assert record["settings"]["max_tokens"] == 16 and record["settings"]["temperature"] == 0.0
    cell = record["cells"][0]
    assert abs(cell["prompt_tokens"]["mean"] - 300) <= 300 * TOLERANCE and cell["prompt_tokens_counted"] == cell["prompt_tokens"]["mean"]
    assert len(record["git_revision"]) >= 7
    for output in (text, result.stdout, result.stderr):
        assert API_KEY not in output


def test_a_prompt_with_no_room_for_the_output_is_refused_before_any_request(tmp_path, vllm_server, endpoint):
    before = endpoint.metrics().get("vllm:request_success_total")
    result = run_cli(tmp_path, vllm_server, API_KEY, prompt_tokens="300,4000", max_tokens="256")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert ("--prompt-tokens 4000 plus --max-tokens 256 is more than the served max model length 4096. "
            "Fix: ask for at most 3840 prompt tokens") in " ".join(result.stderr.split())
    assert endpoint.metrics().get("vllm:request_success_total") == before
    assert not list(tmp_path.glob("serving-*.json"))


def test_cli_without_the_key_says_so(tmp_path, vllm_server):
    result = run_cli(tmp_path, vllm_server, None)
    assert result.returncode != 0
    assert "warm-up request failed" in result.stderr and "401" in result.stderr


ARTIFACTS = Path(os.environ.get("SPARKLAB_ARTIFACTS", "/tmp/dual-spark-artifacts"))


def test_report_compares_profiles_from_raw_json(tmp_path, vllm_server):
    for profile in ("cpu-ngram-a", "cpu-ngram-b"):
        result = run_cli(tmp_path, vllm_server, API_KEY, profile=profile)
        assert result.returncode == 0, result.stderr
    out = ARTIFACTS / "report"
    result = subprocess.run([sys.executable, "-m", "bench.report", str(tmp_path), "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    report = (out / "report.md").read_text()
    header = next(line for line in report.splitlines() if line.startswith("| prompt"))
    assert "cpu-ngram-a decode tok/s" in header and "cpu-ngram-b decode tok/s" in header
    rows = [line for line in report.splitlines() if line.startswith("| 300 |")]
    assert [row.split(" | ")[2] for row in rows] == ["1", "2"]
    assert all("-" not in row.split(" | ")[3:] for row in rows), rows
    for chart in ("c1_decode.svg", "c2_aggregate.svg", "ttft.svg"):
        svg = ElementTree.parse(out / chart).getroot()
        bars = [rect for rect in svg.iter("{http://www.w3.org/2000/svg}rect") if rect.get("height") not in (None, "12", "360")]
        assert len(bars) == 2, chart  # one prompt, two profiles
    print(f"report and charts for review: {out}")


def test_report_sets_a_run_beside_a_reference_in_the_published_format(tmp_path, vllm_server):
    """A reference directory of the published layout whose cells have this server's prompt tokens:
    our cells are matched to them by the tokens the server counted, with ratios ours/reference."""
    result = run_cli(tmp_path / "ours", vllm_server, API_KEY, profile="cpu-ngram-a")
    assert result.returncode == 0, result.stderr
    reference = tmp_path / "reference/results/raw/cpu-ngram-a/20260101T000000Z"
    reference.mkdir(parents=True)
    for concurrency in (1, 2):
        (reference / f"book-context-1k-c{concurrency}.json").write_text(json.dumps({
            "configuration": {"max_tokens": 16, "concurrency": concurrency},
            "summary": {"request_count": 2 * concurrency, "mean_prompt_tokens": 300, "mean_ttft_seconds": 0.5,
                        "mean_decode_tokens_per_second": 100.0, "mean_group_aggregate_tokens_per_second": 200.0}}))
    out = tmp_path / "report"
    result = subprocess.run([sys.executable, "-m", "bench.report", str(tmp_path / "ours"), "--reference", str(tmp_path / "reference"),
                             "--out", str(out)], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "2 of 2 cells matched a published one" in result.stdout
    for row in json.loads((out / "report.json").read_text())["against_published"]:
        assert row["ratio"]["decode_tok_s"] == pytest.approx(row["ours"]["decode_tok_s"] / 100.0)
        assert row["ratio"]["aggregate_tok_s"] == pytest.approx(row["ours"]["aggregate_tok_s"] / 200.0)
    assert (out / "c2_aggregate_vs_published.svg").exists()
