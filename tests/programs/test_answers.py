"""The watch of the answers while the head serves (files/dual_spark/answers.py), through its CLI
against an API that answers as vLLM does (token IDs), with the records `stack record` keeps:
an answer that changes twice is a metric, one that changes once is not, nothing is compared
while planned work is marked or without a record that passed, and a refused key ends it.
Against a real vLLM and the lab's fault: tests/e2e/test_48_observability.py."""

import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler

import pytest

from tests.net import QuietServer
from tests.programs import ARCHIVE

TOKENS = [514, 1311, 1746, 165, 143, 355, 1032, 1783]
PROMPT = "Two NVIDIA DGX Spark machines are joined by one QSFP cable. In two sentences, that cable carries"


class Api:
    """/v1/models and /v1/completions; each completion answers the next of ``answers`` (the last
    again once they run out), or ``status`` when it is not 200. ``asked`` keeps each request."""

    def __init__(self):
        self.answers, self.status, self.asked = [TOKENS], 200, []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status: int, body: dict):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.reply(200, {"data": [{"id": "tiny"}]})

            def do_POST(self):
                api.asked.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                if api.status != 200:
                    self.reply(api.status, {"error": {"message": "invalid key"}})
                    return
                tokens = api.answers.pop(0) if len(api.answers) > 1 else api.answers[0]
                self.reply(200, {"choices": [{"text": "carries", "token_ids": tokens}]})

        self.server = QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()


@pytest.fixture
def api():
    found = Api()
    yield found
    found.server.shutdown()


def served(stack_dir, cluster="c1", answers_of="c1", failed=None, prompt=PROMPT):
    """served/ as `stack record` keeps it: the state, and the canaries' answers that passed on it."""
    (stack_dir / "served").mkdir(parents=True, exist_ok=True)
    (stack_dir / "served/state.json").write_text(json.dumps({"cluster": cluster}))
    answer = {"prompt": prompt, "max_tokens": len(TOKENS), "ignore_eos": False, "tokens": TOKENS, "text": "carries"}
    (stack_dir / "served/canary.json").write_text(json.dumps({"cluster": answers_of, "answers": {"fabric": answer}, "failed": failed or {}}))


def watch(api, tmp_path, planned=None):
    """One round of the watch; its textfile's samples by name and canary, and what it said."""
    key, out, mark = tmp_path / "key", tmp_path / "answers.prom", tmp_path / "planned-work"
    key.write_text("sk-test\n")
    key.chmod(0o600)
    if planned is not None:
        mark.write_text(json.dumps(planned))
    done = subprocess.run([sys.executable, str(ARCHIVE), "answers", "watch", "--url", api.url, "--key-file", str(key),
                           "--stack-dir", str(tmp_path / "stack"), "--planned", str(mark), "--canary", "fabric", "--canary", "code",
                           "--agree-tokens", "64", "--every", "1", "--out", str(out), "--once"],
                          capture_output=True, text=True, timeout=60)
    samples = {}
    for line in (out.read_text().splitlines() if out.exists() else []):
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples, done


def test_answers_that_agree_are_a_zero_and_a_time(api, tmp_path):
    served(tmp_path / "stack")
    samples, done = watch(api, tmp_path)
    assert done.returncode == 0 and "fabric: the same answers as recorded" in done.stdout, done.stderr
    assert samples['dual_spark_answers_changed{canary="fabric"}'] == 0
    assert abs(samples["dual_spark_answers_checked_timestamp_seconds"] - time.time()) < 60
    assert api.asked == [{"model": "tiny", "prompt": PROMPT, "max_tokens": len(TOKENS), "ignore_eos": False, "temperature": 0,
                          "return_token_ids": True}]  # the recorded request, and code (none recorded) not asked


@pytest.mark.parametrize("second, changed", [("differs again", True), ("agrees", False)])
def test_an_answer_that_changes_twice_is_a_one_at_its_token_and_once_is_not(api, tmp_path, second, changed):
    wrong = TOKENS[:5] + [token ^ 1 for token in TOKENS[5:]]
    api.answers = [wrong, wrong if second == "differs again" else TOKENS]
    served(tmp_path / "stack")
    samples, done = watch(api, tmp_path)
    assert done.returncode == 0 and len(api.asked) == 2
    assert samples['dual_spark_answers_changed{canary="fabric"}'] == int(changed)
    if changed:
        assert samples['dual_spark_answers_first_difference_tokens{canary="fabric"}'] == 5
        assert "answers changed while serving: fabric from token 5" in done.stdout
    else:
        assert 'dual_spark_answers_first_difference_tokens{canary="fabric"}' not in samples


@pytest.mark.parametrize("case, said", [
    ("planned work", "planned work in progress (a profile switch)"),
    ("no record", "the state that serves was recorded without canaries that passed"),
    ("answers of another state", "the state that serves was recorded without canaries that passed"),
    ("a canary failed", "the state that serves was recorded without canaries that passed"),
    ("another prompt now", "no watched canary (fabric, code) has a recorded greedy answer"),
])
def test_nothing_is_compared_without_a_record_of_the_state_that_serves_or_during_planned_work(api, tmp_path, case, said):
    stack = tmp_path / "stack"
    if case != "no record":
        served(stack, answers_of="c0" if case == "answers of another state" else "c1",
               failed={"fabric": ["x"]} if case == "a canary failed" else None, prompt=None if case == "another prompt now" else PROMPT)
    mark = {"since": time.time() - 5, "until": time.time() + 600, "what": "a profile switch"} if case == "planned work" else None
    samples, done = watch(api, tmp_path, mark)
    assert done.returncode == 0 and f"not compared: {said}" in done.stdout, done.stdout
    assert api.asked == [] and "dual_spark_answers_changed" not in "".join(samples)


def test_a_refused_key_ends_the_watch_for_systemd_to_start_it_with_the_key_now(api, tmp_path):
    api.status = 401
    served(tmp_path / "stack")
    _, done = watch(api, tmp_path)
    assert done.returncode != 0 and "the API answered 401: invalid key: the key is read again at the next start" in done.stderr
    assert "sk-test" not in done.stdout + done.stderr
