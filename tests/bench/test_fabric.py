"""bench.fabric measures between two nodes of the cluster: the head and rank 1 unless --pair
names two others; a pair it cannot take is refused before any connection."""

from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from bench import fabric
from site_config import load_site

REPO = Path(__file__).resolve().parents[2]
FOUR = REPO / "site.example-4.toml"


def names(pair) -> list[str]:
    return [node.hostname for node in pair]


def test_the_head_and_rank_one_by_default_or_the_pair_named_in_its_order():
    cluster = load_site(FOUR)
    assert names(fabric.pair_of(cluster, None)) == ["spark-1", "spark-2"]
    assert names(fabric.pair_of(cluster, "spark-4, spark-3")) == ["spark-4", "spark-3"]


@pytest.mark.parametrize("pair", ["spark-2", "spark-2,spark-2", "spark-2,spark-9", "spark-1,spark-2,spark-3"])
def test_a_pair_that_is_not_two_nodes_of_the_site_is_refused_before_connecting(pair):
    with pytest.raises(click.BadParameter, match="name two different nodes of the site"):
        fabric.pair_of(load_site(FOUR), pair)
    result = CliRunner().invoke(fabric.main, ["--site", str(FOUR), "--pair", pair, "--out", "/nonexistent/never"])
    assert result.exit_code == 2 and "--pair" in result.output and "spark-1, spark-2, spark-3, spark-4" in result.output
