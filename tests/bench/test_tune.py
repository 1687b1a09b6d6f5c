"""bench.tune's parts that need no cluster: which profiles it tunes, the schedule it is given, the
site.toml snippet it writes (loaded by the deploy's own validation) and the A/B verdicts."""

import dataclasses

import click
import pytest

from bench import tune
from site_config import load_site
from tests.test_serving_pair import PAIR

SITE = PAIR / "site.toml"


def with_tables(tmp_path, text):
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + "\n" + text)
    return load_site(site)


def test_the_snippet_serves_the_schedule_on_top_of_the_running_profile(tmp_path):
    cluster = load_site(SITE)
    name = tune.free_name(cluster, "adaptive")
    text = tune.snippet(name, "adaptive", [[1, 1, 5], [2, 4, 3]], "measured on the pair")
    profile = with_tables(tmp_path, text).profiles[name]
    assert name == "adaptive-tuned" and text.startswith("# measured on the pair\n")
    assert profile == dataclasses.replace(cluster.profiles["adaptive"], speculative_schedule=[[1, 1, 5], [2, 4, 3]])


def test_a_name_already_taken_gets_the_next_free_one(tmp_path):
    cluster = with_tables(tmp_path, '[profile.adaptive-tuned]\nbase = "adaptive"\n')
    assert tune.free_name(cluster, "adaptive") == "adaptive-tuned-2"


@pytest.mark.parametrize(("tables", "running", "says"), [
    ("", "nightly", "does not define"),
    ('[profile.quiet]\nbase = "adaptive"\nspeculative_tokens = 0\n', "quiet", "nothing to tune"),
    ('[profile.adaptive-tuned]\nbase = "adaptive"\nspeculative_schedule = [[1, 4, 3]]\n', "adaptive-tuned", "already has a speculative_schedule"),
    ('[profile.single]\nbase = "adaptive"\nmax_num_seqs = 1\n', "single", "max_num_seqs = 1"),
])
def test_a_profile_without_a_fixed_length_to_measure_is_refused(tmp_path, tables, running, says):
    with pytest.raises(click.ClickException, match=says):
        tune.tunable(with_tables(tmp_path, tables), running)


def test_the_running_default_is_tunable():
    assert tune.tunable(load_site(SITE), "adaptive").speculative_tokens == 5


@pytest.mark.parametrize("text", ["[[1, 1, 7], [2, 4]]", "7", "[]", "[[1, 1, 7.5]]", "[[1, 1, true]]", "1-1:7"])
def test_a_given_schedule_of_the_wrong_shape_is_refused(text):
    with pytest.raises(click.BadParameter, match=r"\[batch_start, batch_end, k\]"):
        tune.parse_schedule(text)


def test_a_given_schedule_the_profile_cannot_take_is_refused_by_the_site_validation(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text())
    with pytest.raises(click.ClickException, match=r"speculative_schedule.*at most speculative_tokens \(5\)"):
        with tune.ExitStack() as stack:
            tune.with_profile(stack, site, tune.snippet("adaptive-tuned", "adaptive", [[1, 1, 7], [2, 4, 3]], "given"))
    assert [p.name for p in tmp_path.iterdir()] == ["site.toml"]  # the copy is gone


def measured(cells):
    """bench.serving cells: (concurrency, decode, aggregate, drafts, draft tokens)."""
    return {"cells": [{"prompt": "512", "concurrency": c, "decode_tok_s": {"mean": d}, "aggregate_tok_s": {"mean": a},
                       "spec_decode": {"drafts": n, "draft_tokens": t}} for c, d, a, n, t in cells]}


def test_the_ab_names_every_concurrency_where_the_schedule_does_not_win(capsys):
    fixed = measured([(1, 10.0, 10.0, 100, 300), (4, 8.0, 30.0, 400, 1200)])
    scheduled = measured([(1, 11.0, 11.0, 100, 300), (4, 7.6, 30.3, 400, 400)])
    rows = tune.compare(fixed, scheduled)
    assert rows[1]["decode_tok_s"]["ratio"] == pytest.approx(0.95) and rows[1]["draft_tokens_per_draft"] == {"fixed": 3.0, "schedule": 1.0}
    losses = tune.print_ab(rows, 3, [[1, 1, 3], [2, 4, 1]])
    assert losses == ["the schedule does not beat k = 3 at C4 (512-token prompt): decode per stream x0.95"]
    out = capsys.readouterr().out
    assert "     512   4          8.00      7.60  0.95x            30.00     30.30  1.01x    3.0 -> 1.0" in out


def test_a_schedule_that_wins_everywhere_says_so(capsys):
    fixed = measured([(1, 10.0, 10.0, 100, 300), (2, 9.0, 18.0, 200, 600)])
    better = measured([(1, 11.0, 11.0, 100, 300), (2, 9.5, 19.0, 200, 400)])
    assert tune.print_ab(tune.compare(fixed, better), 3, [[1, 1, 3], [2, 2, 2]]) == []
    assert "beats k = 3 at every concurrency measured" in capsys.readouterr().out


def test_bad_arguments_are_refused_naming_the_option_before_any_contact(tmp_path):
    from click.testing import CliRunner

    result = CliRunner().invoke(tune.main, ["--site", str(SITE), "--schedule", "[[1, 4]]"])
    assert result.exit_code == 2 and "Invalid value for '--schedule'" in result.output
    result = CliRunner().invoke(tune.main, ["--site", str(tmp_path / "none.toml")])
    assert result.exit_code == 2 and "Invalid value for '--site'" in result.output and "no site file" in result.output
