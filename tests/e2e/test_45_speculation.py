"""Speculation tuned to the load, on the lab's pair (ngram drafting on the CPU): bench.tune measures
the running profile at every concurrency, derives a schedule, and A/Bs a given one through the
deploy's own profile switch; vLLM's counters show that schedule at work (3 drafted tokens per
draft for one stream, 1 for two to four); the pair serves its profile again afterwards. Ngram on a
tiny random model says nothing about which schedule wins with DSpark on Sparks."""

import json
import re
import subprocess
import sys

import pytest

from bench.remote import head_of, read_secret
from lab.config import HEAD, WORKER
from site_config import load_site
from tests.e2e.conftest import REPO, SITE, pyinfra
from tests.e2e.test_42_image_support import container

pytestmark = pytest.mark.end_to_end
SCHEDULE = [[1, 1, 3], [2, 4, 1]]  # the lab's profiles draft 3 tokens and batch 4 sequences


@pytest.fixture(scope="module")
def tuned(converged, tmp_path_factory):
    """One tuner run, end to end: its output, its record and its snippet."""
    out = tmp_path_factory.mktemp("tune")
    result = subprocess.run([sys.executable, "-m", "bench.tune", "--site", str(SITE), "--prompt-tokens", "512", "--requests", "1",
                             "--max-tokens", "32", "--schedule", json.dumps(SCHEDULE), "--out", str(out)],
                            cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    [raw] = out.glob("tune-adaptive-*.json")
    [snippet] = out.glob("tune-adaptive-*.toml")
    return result.stdout + result.stderr, json.loads(raw.read_text()), snippet.read_text()


def per_draft(cell: dict) -> float:
    spec = cell["spec_decode"]
    assert spec["drafts"] > 0, cell
    return spec["draft_tokens"] / spec["drafts"]


def test_the_tuner_measures_every_concurrency_and_derives_a_schedule_from_it(tuned):
    output, record, _ = tuned
    assert record["profile"] == "adaptive" and record["speculative_tokens"] == 3
    assert [cell["concurrency"] for cell in record["fixed"]["cells"]] == [1, 2, 3, 4]
    assert all(per_draft(cell) > 2.5 for cell in record["fixed"]["cells"])  # the fixed k = 3 drafts 3
    derived = record["derived"]
    assert [row["concurrency"] for row in derived["rows"]] == [1, 2, 3, 4] and derived["measured_length"] == 3
    ranges = derived["schedule"]
    assert ranges[0][0] == 1 and ranges[-1][1] == 4 and all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(0 <= k <= 3 for _, _, k in ranges)
    assert f"the measurement favours speculative_schedule = {json.dumps(ranges)}" in output
    # The CPU pair's step barely grows with the batch, and noise can make it shrink: then no fit, and k stays 3.
    fitted = derived["fits"]["512"]
    assert re.search(r"C4: k = \d.*\n\s+512: step [\d.]+ ms; acceptance by position \d+% \d+% \d+%"
                     + ("; predicted decode tok/s for k = 0..3: " if fitted else "\n"), output), output
    assert fitted or (ranges == [[1, 4, 3]] and "prompt 512: decode step does not fit" in output)


def test_vllms_counters_show_the_schedule_at_work(tuned):
    _, record, _ = tuned
    cells = {cell["concurrency"]: cell for cell in record["ab"]["scheduled"]["cells"]}
    assert record["ab"]["profile"] == "adaptive-tuned" and record["schedule_tried"] == SCHEDULE
    assert per_draft(cells[1]) > 2.5  # one stream: k = 3
    assert all(per_draft(cells[c]) < 1.3 for c in (2, 3, 4)), {c: per_draft(cells[c]) for c in cells}  # two to four: k = 1


def test_the_ab_prints_both_runs_and_their_ratios_and_names_each_loss(tuned):
    output, record, _ = tuned
    assert "A/B: fixed k = 3 against speculative_schedule = [[1, 1, 3], [2, 4, 1]]" in output
    rows = record["ab"]["comparison"]
    assert [row["concurrency"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        decode, aggregate = row["decode_tok_s"], row["aggregate_tok_s"]
        assert decode["ratio"] == pytest.approx(decode["schedule"] / decode["fixed"])
        assert re.search(rf"\n\s+512\s+{row['concurrency']}\s+{decode['fixed']:.2f}\s+{decode['schedule']:.2f}\s+{decode['ratio']:.2f}x\s+"
                         rf"{aggregate['fixed']:.2f}\s+{aggregate['schedule']:.2f}\s+{aggregate['ratio']:.2f}x", output)
        lost = decode["ratio"] <= 1 or aggregate["ratio"] <= 1
        said = f"the schedule does not beat k = 3 at C{row['concurrency']} (512-token prompt)"
        assert (said in output) == lost and any(loss.startswith(said) for loss in record["ab"]["losses"]) == lost


def test_the_snippet_is_a_profile_the_deploy_takes(tuned, tmp_path):
    _, _, snippet = tuned
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + "\n" + snippet)
    profile = load_site(site).profiles["adaptive-tuned"]
    assert profile.speculative_schedule == SCHEDULE and profile.speculative_tokens == 3


def test_the_pair_serves_its_profile_again_and_a_deploy_changes_nothing(tuned):
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    assert {state["profile"] for state in before.values()} == {"adaptive"}
    result = pyinfra("-y")
    assert result.returncode == 0, result.stdout
    assert re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", result.stdout), result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before


def test_the_key_never_appears_in_the_tuners_output_or_files(tuned):
    output, record, snippet = tuned
    with head_of(load_site(SITE)) as client:
        key = read_secret(client, "/var/lib/dual-spark/api-key")
    assert len(key) >= 32
    for text in (output, json.dumps(record), snippet):
        assert key not in text
