"""The canary program (files/dual_spark/canary.py), as the deploy ships it, against a real vLLM
(this directory's, ngram speculation on): the lab's canary set as the deploy renders it answers,
greedily, the same twice, token for token, and scores its text the same; a recorded answer that
differs is named with its canary and the first token where it differs, a recorded perplexity
half as high with the ratio; the key is printed nowhere."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.config import LAB_DIR
from lab.site import render
from operations.canary import canary_set
from operations.stack import stack_settings
from site_config import load_site
from tests.programs import ARCHIVE
from tests.serving.conftest import API_KEY, SPECULATIVE

pytestmark = pytest.mark.end_to_end  # a real vLLM, set up by scripts/test as root


@pytest.fixture(scope="module")
def lab_set(tmp_path_factory) -> list[dict]:
    """The lab pair's canary set, as operations/canary.py passes it to the program."""
    folder = tmp_path_factory.mktemp("site")
    (folder / "runtime").mkdir()
    (folder / "runtime/Dockerfile").write_text("FROM scratch\n")
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(folder / "id_ed25519")], check=True)
    site = folder / "site.toml"  # the lab's, its key one of its own: the lab need not be up
    site.write_text(render(folder / "runtime", []).replace(str(LAB_DIR / "id_ed25519"), str(folder / "id_ed25519")))
    return canary_set(stack_settings(load_site(site), "spark-head"))


def canary(url: str, tmp_path: Path, canaries: list[dict], out: str, reference: Path | None = None) -> subprocess.CompletedProcess:
    key = tmp_path / "api-key"
    key.write_text(API_KEY + "\n")
    key.chmod(0o600)
    return subprocess.run([sys.executable, str(ARCHIVE), "canary", "--url", url, "--key-file", str(key), "--set", json.dumps(canaries),
                           "--model-digest", "e8e8e8e8e8e8", "--cluster", "c1", "--agree-tokens", "48", "--perplexity-ratio", "1.2",
                           "--speculation", SPECULATIVE, "--acceptance-ratio", "0.5",
                           "--out", str(tmp_path / out),
                           *(["--reference", str(reference)] if reference else [])], capture_output=True, text=True, timeout=600)


def test_the_lab_set_answers_the_same_twice_and_a_changed_answer_is_named(vllm_server, lab_set, tmp_path):
    """Without the tool canary: this directory's vLLM has no tool-call parser (test_clients_probe
    needs one without); the lab's runs it (tests/e2e/test_40_serving.py, tests/cluster)."""
    assert [found["name"] for found in lab_set] == ["code", "fabric", "long", "perplexity", "tool"]
    lab_set = [found for found in lab_set if "tool" not in found]
    first = canary(vllm_server, tmp_path, lab_set, "first.json")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "canary long: 48 tokens in" in first.stdout and "no answer of these weights recorded: passed" in first.stdout
    recorded = json.loads((tmp_path / "first.json").read_text())
    assert recorded["failed"] == {} and len(recorded["answers"]["long"]["tokens"]) == 48
    assert recorded["answers"]["perplexity"]["scored"] > 50 and recorded["answers"]["perplexity"]["perplexity"] > 1
    assert recorded["speculation"] == SPECULATIVE and len(recorded["acceptance"]["per_position"]) == 3, recorded["acceptance"]
    assert re.search(r"canary acceptance: [\d.]+, [\d.]+, [\d.]+ by draft position over \d+ drafts, none recorded", first.stdout), first.stdout

    not_run = {"name": "tool", "not_run": "it offers a tool, and [model] names no tool_call_parser"}
    again = canary(vllm_server, tmp_path, [*lab_set, not_run], "again.json", tmp_path / "first.json")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "canary tool: not run: it offers a tool, and [model] names no tool_call_parser" in again.stdout
    assert "canary: all 4 passed" in again.stdout and "tool" not in json.loads((tmp_path / "again.json").read_text())["answers"]
    assert again.stdout.count("compared with the recorded answers: passed") == 3, again.stdout
    assert re.search(r"canary perplexity: perplexity [\d.e+]+ over \d+ tokens in [\d.]+ s, against [\d.e+]+ recorded: passed", again.stdout)
    assert re.search(r"canary acceptance: .* by draft position over \d+ drafts, against .* recorded: passed", again.stdout), again.stdout

    recorded["answers"]["long"]["tokens"][20] ^= 1
    recorded["answers"]["perplexity"]["perplexity"] /= 2  # as if the weights before had been twice as sure
    recorded["acceptance"]["per_position"] = [3 * share + 0.1 for share in recorded["acceptance"]["per_position"]]  # a drafter since collapsed
    (tmp_path / "changed.json").write_text(json.dumps(recorded))
    changed = canary(vllm_server, tmp_path, lab_set, "changed.json.out", tmp_path / "changed.json")
    assert changed.returncode == 1
    assert "canary: long failed: differs from the recorded answer at token 20 (of 48; the first 48 must agree)" in changed.stderr
    failed = json.loads((tmp_path / "changed.json.out").read_text())["failed"]
    assert failed["long"] == ["differs from the recorded answer at token 20 (of 48; the first 48 must agree)"]
    assert re.fullmatch(r"perplexity [\d.e+]+ is 2\.00 times the [\d.e+]+ recorded \(at most 1\.2 allowed\)", failed["perplexity"][0]), failed
    assert len(failed["acceptance by draft position"]) == 3 and all(
        re.fullmatch(r"acceptance at draft position \d is [\d.]+, [\d.]+ recorded \(at least 0\.5 times it allowed\)", found)
        for found in failed["acceptance by draft position"]), failed
    for result in (first, again, changed):
        assert API_KEY not in result.stdout + result.stderr
