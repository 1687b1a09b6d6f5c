"""Property tests: every fact's ``process`` and every parser in bench/parsers.py takes random,
truncated and reordered output without raising; output that is only junk gives a reading that
says so and names a line of it.

Each generated output goes to every fact (or every parser) in turn: making an example costs
hypothesis far more than reading it, so the readers share the examples, each reader still
meeting every one of them (a copy, so that none sees what another changed)."""

import json
from contextlib import contextmanager
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import parsers
from tests.test_facts import FIXTURES, facts_of_this_project

HERE = Path(__file__).parent
REAL_LINES = sorted({line for path in FIXTURES for line in json.loads(path.read_text())["output"]})
BENCH_TEXTS = [path.read_text() for path in sorted((HERE / "bench/fixtures").rglob("*")) if path.is_file()]
JUNK = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"), max_size=80)


def mangled_lines():
    """Real lines of every fixture, truncated at random, shuffled, with junk in between."""
    real = st.sampled_from(REAL_LINES)
    truncated = st.builds(lambda line, cut: line[:cut], real, st.integers(0, 120))
    return st.lists(st.one_of(real, truncated, JUNK), max_size=40)


def junk_lines():
    """Lines that no fact has a format for: no spaces, colons, digits or markers."""
    return st.lists(st.text(alphabet="qwxzQWXZ!?~", min_size=1, max_size=30), min_size=1, max_size=5)


FACTS = list(facts_of_this_project())
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@contextmanager
def reading_by(name: str):
    """A failure names the reader it came from (the exception itself is left as it is, so that
    hypothesis tells different bugs apart)."""
    try:
        yield
    except BaseException as error:
        error.add_note(f"-- raised by {name}")
        raise


def test_there_are_readers_to_test():
    """The control case: the loops below would pass over an empty list."""
    assert len(FACTS) >= 20 and len(set(cls for _, cls in FACTS)) == len(FACTS)
    assert REAL_LINES and BENCH_TEXTS


@PROFILE
@given(lines=mangled_lines())
def test_facts_never_raise(lines):
    for name, cls in FACTS:
        with reading_by(name):
            reading = cls().process(list(lines))
            assert isinstance(reading, dict) and isinstance(reading["unreadable"], list)


@PROFILE
@given(lines=junk_lines())
def test_junk_is_named_as_unreadable(lines):
    for name, cls in FACTS:
        with reading_by(name):
            reading = cls().process(list(lines))
            assert unreadable_lines(reading), f"{name} took {lines} for a reading: {reading}"
            assert set(unreadable_lines(reading)) <= set(lines)


def unreadable_lines(reading) -> list[str]:
    """Every unreadable line anywhere in a (possibly combined) reading."""
    found = []
    if isinstance(reading, dict):
        found += reading.get("unreadable", [])
        for key, value in reading.items():
            if key != "unreadable":
                found += unreadable_lines(value)
    elif isinstance(reading, list):
        for value in reading:
            found += unreadable_lines(value)
    return found


def mangled_texts():
    real = st.sampled_from(BENCH_TEXTS)
    truncated = st.builds(lambda text, cut: text[:cut], real, st.integers(0, 4000))
    shuffled = st.builds(lambda text, seed: "\n".join(sorted(text.splitlines(), key=lambda line: hash((line, seed)))), real, st.integers())
    return st.one_of(real, truncated, shuffled, JUNK)


PARSERS = [parsers.parse_ping, parsers.parse_iperf3, parsers.parse_ib_write_bw, parsers.parse_all_reduce_perf]


@PROFILE
@given(text=mangled_texts())
def test_parsers_never_raise(text):
    """The four result parsers, the Prometheus reader and the nvidia-smi CSV reader."""
    for parse in PARSERS:
        with reading_by(parse.__name__):
            result = parse(text)
            assert isinstance(result, dict) and "error" in result and isinstance(result["unreadable"], list)
    with reading_by("parse_prometheus"):
        metrics = parsers.parse_prometheus(text)
        assert all(isinstance(value, float) for value in metrics.totals.values())
    with reading_by("parse_nvidia_smi_csv"):
        rows = parsers.parse_nvidia_smi_csv(text.splitlines())
        assert all(isinstance(row, dict) and all(isinstance(key, str) for key in row) for row in rows)


@PROFILE
@given(lines=junk_lines())
def test_parsers_name_junk(lines):
    for parse in PARSERS:
        with reading_by(parse.__name__):
            result = parse("\n".join(lines))
            assert result["error"] and set(result["unreadable"]) & {line.strip() for line in lines}


def test_prometheus_names_junk():
    metrics = parsers.parse_prometheus("vllm:ok_total 3\nthis is not a sample\n# HELP fine\n")
    assert metrics.totals == {"vllm:ok_total": 3.0} and metrics.unreadable == ["this is not a sample"]
