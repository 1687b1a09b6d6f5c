"""Speculative decoding figures from vLLM's counters, and the draft length a measurement favours."""

import pytest

from bench import speculation
from bench.parsers import parse_prometheus

PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


def metrics(drafts, accepted_by_engine):
    """/metrics text of a server with one engine per entry of accepted_by_engine (per-position lists)."""
    lines = []
    for engine, positions in enumerate(accepted_by_engine):
        labels = f'engine="{engine}",model_name="m"'
        lines += [f'{PER_POS}{{{labels},position="{k}"}} {v}' for k, v in enumerate(positions)]
        lines += [f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
                  f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafts * len(positions)}",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {sum(positions)}"]
    return parse_prometheus("\n".join(lines))


def test_per_position_deltas_sum_over_engines_and_to_the_accepted_counter():
    before = metrics(10, [[5, 2, 1], [4, 1, 0]])
    after = metrics(110, [[85, 52, 21], [84, 41, 20]])
    counted = speculation.delta(before, after)
    assert counted["accepted_per_position"] == [160, 90, 40]
    assert sum(counted["accepted_per_position"]) == counted["accepted_tokens"] == 290
    assert counted["drafts"] == 200


def test_summary_gives_acceptance_by_position_and_what_shorter_drafts_carry():
    summary = speculation.summary({"drafts": 200.0, "draft_tokens": 600.0, "accepted_tokens": 290.0,
                                   "generation_tokens": 0.0, "accepted_per_position": [160.0, 90.0, 40.0]})
    assert summary["acceptance_per_position"] == [0.8, 0.45, 0.2]
    assert [length["expected_accepted"] for length in summary["draft_lengths"]] == pytest.approx([0, 0.8, 1.25, 1.45])
    assert summary["draft_lengths"][-1]["tokens_per_step"] == pytest.approx(1 + summary["accepted_per_draft"])
    assert summary["acceptance_rate"] == pytest.approx(290 / 600)


def test_no_drafts_means_no_acceptance_figures():
    summary = speculation.summary({"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0,
                                   "generation_tokens": 0.0, "accepted_per_position": []})
    assert summary["acceptance_rate"] is None and summary["draft_lengths"] == [
        {"num_speculative_tokens": 0, "expected_accepted": 0, "tokens_per_step": 1}]


def cell(concurrency, by_position, base, per_token):
    """A cell measured on a server whose step costs base + per_token * C * (n + 1)."""
    drafts = 1000.0
    spec = speculation.summary({"drafts": drafts, "draft_tokens": drafts * len(by_position), "generation_tokens": 0.0,
                                "accepted_tokens": drafts * sum(by_position),
                                "accepted_per_position": [drafts * rate for rate in by_position]})
    step = base + per_token * concurrency * (len(by_position) + 1)
    return {"prompt": "10K", "concurrency": concurrency, "decode_tok_s": spec["draft_lengths"][-1]["tokens_per_step"] / step,
            "spec": spec}


def test_the_fit_recovers_the_step_cost_and_favours_the_best_length_per_concurrency():
    by_position, base, per_token = [0.8, 0.6, 0.45, 0.3, 0.1], 0.050, 0.004
    rows = speculation.favoured_lengths([cell(1, by_position, base, per_token), cell(4, by_position, base, per_token)])
    assert [row["concurrency"] for row in rows] == [1, 4]
    for row in rows:
        assert row["base_step_ms"] == pytest.approx(50) and row["per_token_ms"] == pytest.approx(4)
        expected = [sum(by_position[:n]) for n in range(6)]
        throughput = [row["concurrency"] * (1 + e) / (base + per_token * row["concurrency"] * (n + 1)) for n, e in enumerate(expected)]
        assert row["favoured_length"] == throughput.index(max(throughput))
        assert row["predicted_decode_tok_s"] == pytest.approx(throughput)
    assert [row["favoured_length"] for row in rows] == [4, 3]  # one stream wants longer drafts than four


def test_a_wider_cell_faster_per_step_is_said_not_to_fit():
    by_position = [0.8, 0.6]
    single, wide = cell(1, by_position, 0.05, 0.004), cell(4, by_position, 0.05, 0.004)
    wide["decode_tok_s"] = single["decode_tok_s"] * 1.2
    rows = speculation.favoured_lengths([single, wide])
    assert all(row["favoured_length"] is None and "do not fit" in row["why"] for row in rows)


def test_no_single_stream_cell_means_no_verdict():
    assert speculation.favoured_lengths([cell(4, [0.8], 0.05, 0.004)]) == []


def brute_force(by_position, base, per_token, concurrency):
    rates = [(1 + sum(by_position[:k])) / (base + per_token * concurrency * (k + 1)) for k in range(len(by_position) + 1)]
    return rates.index(max(rates))


def test_the_schedule_takes_the_favoured_length_at_every_concurrency_as_ranges():
    by_position, base, per_token = [0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6], 0.020, 0.004
    derived = speculation.schedule([cell(c, by_position, base, per_token) for c in (1, 2, 3, 4)])
    assert derived["fits"]["10K"] == {"base_step_ms": pytest.approx(20), "per_token_ms": pytest.approx(4)}
    favoured = [brute_force(by_position, base, per_token, c) for c in (1, 2, 3, 4)]
    assert [row["favoured_length"] for row in derived["rows"]] == favoured == [7, 7, 5, 5]
    assert derived["schedule"] == [[1, 2, 7], [3, 4, 5]] and derived["measured_length"] == 7
    c4 = derived["rows"][3]
    assert c4["relative_to_measured"][7] == pytest.approx(1) and max(c4["relative_to_measured"]) == c4["relative_to_measured"][5] > 1


def test_acceptance_is_read_per_concurrency_and_prompts_count_alike():
    """A wider batch that accepts less drafts less; two prompts of one shape agree with either."""
    base, per_token = 0.020, 0.004
    cells = [cell(1, [0.9, 0.85, 0.8], base, per_token), cell(2, [0.9, 0.85, 0.8], base, per_token),
             cell(3, [0.2, 0.05, 0.0], base, per_token)]
    other = [{**c, "prompt": "200K"} for c in cells]
    derived = speculation.schedule(cells + other)
    assert derived["schedule"] == [[1, 2, 3], [3, 3, brute_force([0.2, 0.05, 0.0], base, per_token, 3)]]
    assert derived["schedule"][1][2] < 3 and len(derived["rows"][2]["behind"]) == 2


def test_step_times_that_do_not_fit_keep_the_measured_length_and_say_why():
    cells = [cell(c, [0.8, 0.6], 0.05, 0.004) for c in (1, 2)]
    cells[1]["decode_tok_s"] = cells[0]["decode_tok_s"] * 1.5  # two streams step faster than one
    derived = speculation.schedule(cells)
    assert derived["fits"] == {"10K": None} and derived["schedule"] == [[1, 2, 2]]
    assert all("keeps the measured length" in row["why"] for row in derived["rows"])
    assert [len(row["behind"]) for row in derived["rows"]] == [1, 1] and derived["rows"][1]["behind"][0]["predicted_decode_tok_s"] is None
    assert derived["rows"][0]["behind"][0]["acceptance_per_position"] == pytest.approx([0.8, 0.6])


def test_no_speculation_measured_means_no_schedule():
    spec = speculation.summary({"drafts": 0.0, "draft_tokens": 0.0, "accepted_tokens": 0.0, "generation_tokens": 0.0,
                                "accepted_per_position": []})
    assert speculation.schedule([{"prompt": "10K", "concurrency": 1, "decode_tok_s": 10.0, "spec": spec}])["schedule"] == []
