"""Serving on the lab, for real: the two nodes' Docker engines run the head and worker stacks,
a two-node tensor-parallel vLLM on the CPU over the lab's rail; the API on the head's loopback
behind its key; profile switches restart worker then head and change what is served; a new model
revision is staged while the pair serves, then switched to with one restart; tasks/rollback.py
returns to the state before it; a change that gives no token (a profile, an image, a revision) is
rolled back on its own. A planned change pages nothing: its silence in the head's Alertmanager
spans it, and no critical alert fired in the head's Prometheus while it ran."""

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from datetime import datetime

import pytest
import requests

from bench.remote import head_of, read_secret
from lab.config import HEAD, LAB_DIR, LAB_MODEL, WORKER
from lab.hub import Hub
from lab.processes import in_node
from layout import store_entry
from site_config import load_site
from tests.e2e.conftest import CANARY_RUNS, DOWNTIME, LAB_ENV, PYINFRA, REPO, SITE, pyinfra, site_variant

pytestmark = pytest.mark.end_to_end
OUTPUTS: list[str] = []  # every output of this module's runs, searched for the key at the end


def run(*args, task="deploy.py", site=SITE) -> subprocess.CompletedProcess:
    result = pyinfra(*args, task=task, site=site)
    OUTPUTS.append(result.stdout)
    return result


def container(node) -> dict:
    fields = in_node(node.dir, "docker", "inspect", "-f", '{{.Id}} {{.State.StartedAt}} {{index .Config.Labels "dual-spark.profile"}}',
                     "dual-spark-vllm", capture_output=True).stdout.split()
    return {"id": fields[0], "started": fields[1], "profile": fields[2]}


@pytest.fixture(scope="module")
def serving(converged):
    result = converged
    OUTPUTS.append(result.stdout)
    assert re.search(r"spark-head\s+API\s+PASS\s+generates tokens at 127.0.0.1:8888 as tiny", result.stdout), result.stdout
    return result


def chat(url: str, key: str, content: str = "spark fabric rail", max_tokens: int = 8) -> requests.Response:
    return requests.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, timeout=120,
                         json={"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens})


def test_the_pair_serves_a_chat_through_the_tunnel_behind_the_key(api):
    url, key = api
    answer = chat(url, key)
    assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 8
    assert requests.get(f"{url}/v1/models", timeout=10).status_code == 401
    assert requests.get(f"{url}/v1/models", headers={"Authorization": "Bearer not-the-key"}, timeout=10).status_code == 401


def test_the_api_is_not_reachable_on_the_management_address(serving):
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://{HEAD.address}:8888/v1/models", timeout=5)
    assert re.search(r"spark-head\s+API exposure\s+PASS\s+only on 127.0.0.1:8888", serving.stdout)


def test_both_ranks_run_over_the_fabric(serving):
    """Rank 1 is headless on the worker; the ranks meet at the head's rail address."""
    head_launch = (HEAD.root / "etc/dual-spark/launch.sh").read_text()
    worker_launch = (WORKER.root / "etc/dual-spark/launch.sh").read_text()
    assert "--node-rank 0" in head_launch and "--headless" not in head_launch and "--host 127.0.0.1" in head_launch
    assert "--node-rank 1" in worker_launch and "--headless" in worker_launch and "--master-addr 10.0.0.1" in worker_launch
    connections = in_node(WORKER.dir, "ss", "-Htn", "state", "established", "dst", "10.0.0.1", capture_output=True).stdout
    assert connections.strip(), "the worker has no connection to the head over rail 0"


def test_a_second_run_restarts_nothing(serving):
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    result = run("-y")
    assert result.returncode == 0, result.stdout
    assert re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", result.stdout), result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before


def test_a_dry_profile_switch_shows_the_diff_and_restarts_nothing(serving):
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    result = run("--dry", "--data", "profile=fast", task="tasks/profile.py")
    assert result.returncode == 0, result.stdout
    assert "Will modify /etc/dual-spark/launch.sh" in result.stdout and "Will modify /etc/dual-spark/compose.yaml" in result.stdout
    assert re.search(r"^\s*-\s+--max-num-seqs 4 ", result.stdout, re.M) and re.search(r"^\s*\+\s+--max-num-seqs 1 ", result.stdout, re.M)
    assert re.search(r"^\s*\+\s+dual-spark.profile: fast\s*$", result.stdout, re.M), result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before


def running_at_once(url: str, key: str, requests_: int = 4) -> float:
    """The most requests vLLM ran at once while ``requests_`` long ones were sent together
    (vllm:num_requests_running, sampled from /metrics)."""
    peak = [0.0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            text = requests.get(f"{url}/metrics", timeout=10).text
            match = re.search(r"^vllm:num_requests_running\{[^}]*\} ([\d.]+)", text, flags=re.M)
            peak[0] = max(peak[0], float(match.group(1)) if match else 0.0)
            time.sleep(0.05)

    sampler = threading.Thread(target=sample)
    sampler.start()
    workers = [threading.Thread(target=chat, args=(url, key, "spark fabric", 48)) for _ in range(requests_)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    done.set()
    sampler.join()
    return peak[0]


class Probe:
    """A one-token chat through the front door every half second, each in a thread of its own as
    independent clients send them, with a client's patience (WAIT s): when each was sent, whether
    it was answered, and how long it waited."""

    WAIT = 600

    def __init__(self, url: str, key: str):
        self.url, self.key = url, key
        self.results: list[tuple[float, bool, float]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.senders: list[threading.Thread] = []

    def __enter__(self) -> "Probe":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()
        for sender in self.senders:
            sender.join()

    def run(self) -> None:
        while not self.done.is_set():
            sender = threading.Thread(target=self.send, args=(time.monotonic(),))
            sender.start()
            self.senders.append(sender)
            self.done.wait(0.5)

    def send(self, sent: float) -> None:
        try:
            answered = requests.post(f"{self.url}/v1/chat/completions", headers={"Authorization": f"Bearer {self.key}"},
                                     json={"model": "tiny", "messages": [{"role": "user", "content": "spark"}], "max_tokens": 1},
                                     timeout=self.WAIT).status_code == 200
        except requests.RequestException:
            answered = False
        self.results.append((sent, answered, time.monotonic() - sent))

    def answered_after(self, moment: float) -> bool:
        return any(answered and sent > moment for sent, answered, _ in self.results)

    def failed(self, start: float, end: float = float("inf")) -> list[float]:
        return [sent for sent, answered, _ in self.results if not answered and start <= sent <= end]

    def longest_wait(self) -> float:
        return max(waited for _, _, waited in self.results)


class LongStream(threading.Thread):
    """A streamed chat of TOKENS tokens, started when a change is about to stop vLLM: whether it
    finished whole (every token, finish reason "length") and when."""

    TOKENS = 200

    def __init__(self, url: str, key: str):
        super().__init__()
        self.url, self.key = url, key
        self.tokens, self.finish, self.started, self.ended = 0, None, time.monotonic(), None

    def run(self) -> None:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "spark fabric rail"}], "max_tokens": self.TOKENS,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
        with requests.post(f"{self.url}/v1/chat/completions", headers={"Authorization": f"Bearer {self.key}"}, json=body,
                           stream=True, timeout=Probe.WAIT) as response:
            for line in response.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    self.tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices", []):
                    self.finish = choice.get("finish_reason") or self.finish
        self.ended = time.monotonic()


class Reader(threading.Thread):
    """A client reading one greedy answer of TOKENS tokens after another through the front door:
    each answer it got (None: the request failed), to compare with the answer before a change."""

    TOKENS = 32

    def __init__(self, url: str, key: str):
        super().__init__()
        self.url, self.key, self.answers, self.done = url, key, [], threading.Event()

    def ask(self) -> str | None:
        try:
            answer = requests.post(f"{self.url}/v1/completions", headers={"Authorization": f"Bearer {self.key}"}, timeout=Probe.WAIT,
                                   json={"model": "tiny", "prompt": "spark fabric rail", "max_tokens": self.TOKENS, "temperature": 0,
                                         "ignore_eos": True})
        except requests.RequestException:
            return None
        return answer.json()["choices"][0]["text"] if answer.status_code == 200 else None

    def run(self) -> None:
        while not self.done.is_set():
            self.answers.append(self.ask())

    def __enter__(self) -> "Reader":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.join()


HEAD_STOPS = {"tasks/rollback.py": "Return every node to the state that served before"}  # the step that stops the head's vLLM


def change_through_the_door(url: str, key: str, *args: str, task: str, site=SITE) -> tuple[subprocess.CompletedProcess, Probe, LongStream]:
    """Run a change with the probe on, starting the long stream as the run reaches the step that
    stops the head's vLLM (the door drains it first); then wait until the probe is answered again."""
    step = HEAD_STOPS.get(task, "Stop the head's vLLM")  # after "Starting operation:", and "tasks/serving.py | " when included
    with Probe(url, key) as probe:
        process = subprocess.Popen([str(PYINFRA), *args, "inventory.py", task], cwd=REPO,
                                   env={**LAB_ENV, "DUAL_SPARK_SITE": str(site)}, stdin=subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        stream, lines = LongStream(url, key), []
        for line in process.stdout:
            lines.append(line)
            if stream.ident is None and "Starting operation:" in line and step in line:
                stream.started = time.monotonic()
                stream.start()
        process.wait(timeout=900)
        ended = time.monotonic()
        while not probe.answered_after(ended) and time.monotonic() - ended < 60:
            time.sleep(0.5)
        if stream.ident is not None:
            stream.join()
    result = subprocess.CompletedProcess(process.args, process.returncode, "".join(lines))
    OUTPUTS.append(result.stdout)
    return result, probe, stream


def held_not_failed(change: str, result: subprocess.CompletedProcess, probe: Probe, stream: LongStream) -> None:
    """The front door's promise for a change: no request failed, the long one finished whole."""
    assert not probe.failed(0), f"{len(probe.failed(0))} of {len(probe.results)} requests failed"
    assert stream.ident is not None, f"the run never reached the head's stop:\n{result.stdout[-6000:]}"
    assert stream.finish == "length" and stream.tokens == LongStream.TOKENS, (stream.finish, stream.tokens)
    DOWNTIME[change] = probe.longest_wait()
    if timings := re.findall(r"canary (\S+): .* in ([\d.]+) s", result.stdout):
        CANARY_RUNS[change] = ", ".join(f"{name} {seconds} s" for name, seconds in timings)
    print(f"{change}: {len(probe.results)} requests, none failed, the longest waited {probe.longest_wait():.1f} s; "
          f"the long request ({LongStream.TOKENS} tokens) took {stream.ended - stream.started:.1f} s")


def on_head(url: str):
    """A JSON answer from the head's loopback, asked inside the head (Prometheus, Alertmanager)."""
    ask = "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=10).read().decode())"
    return json.loads(in_node(HEAD.dir, "python3", "-c", ask, url, capture_output=True).stdout)


def paged_nothing(change: str, began: float) -> None:
    """The planned work of a change that began at ``began`` (this clock, the nodes' too): a silence of
    the alerts it quiets, made by the deploy and expired at its end; and no critical alert fired in
    the head's Prometheus (every evaluation since it began)."""
    settings = load_site(SITE).settings
    made = [silence for silence in on_head(f"http://127.0.0.1:{settings.alertmanager_port}/api/v2/silences")
            if silence["createdBy"] == "dual-spark deploy" and datetime.fromisoformat(silence["startsAt"]).timestamp() >= began - 1]
    assert made, f"{change}: no silence of planned work in the head's Alertmanager"
    assert {silence["status"]["state"] for silence in made} == {"expired"}, made
    assert all(silence["matchers"] == [{"name": "planned_work", "value": "quiet", "isRegex": False, "isEqual": True}] for silence in made)
    window = f"{int(time.time() - began) + 1}s"
    fired = on_head(f"http://127.0.0.1:{settings.prometheus_port}/api/v1/query?query="
                    + requests.utils.quote(f'max_over_time(ALERTS{{alertstate="firing", severity="critical"}}[{window}])'))
    assert fired["status"] == "success" and fired["data"]["result"] == [], f"{change} paged: {fired['data']['result']}"
    print(f"{change}: {len(made)} silence(s) of planned work, expired at its end; no critical alert fired in {window}")


def model_label(node) -> str:
    return in_node(node.dir, "docker", "inspect", "-f", '{{index .Config.Labels "dual-spark.model"}}', "dual-spark-vllm",
                   capture_output=True).stdout.strip()


def test_a_new_revision_and_profile_are_staged_while_serving_then_switched_worker_first(api, tmp_path):
    """A new revision of the served model published on the lab's hub (the tiny model and one
    more file), with profile fast, while the pair serves adaptive: fetched, hashed and replicated
    into its own directory of the store by the runtime step alone, a probe every half second
    answered throughout; then the serving step stops the head, starts the worker, then the head,
    no request failing at the front door (the longest wait printed), and fast serves one sequence at a time. The old
    revision stays on disk (the stack before names it), and the next converge changes nothing.
    The next test rolls it all back."""
    url, key = api
    assert running_at_once(url, key) > 1  # adaptive: up to 4 sequences
    published = tmp_path / "published"
    shutil.copytree(HEAD.root / LAB_MODEL.lstrip("/"), published)
    (published / "README.md").write_text("The tiny model again, one file more: a new revision.\n")
    old = store_entry("/var/lib/dual-spark/model", {"path": LAB_MODEL})
    with Hub(published, repo="lab/tiny-llama-next") as hub:
        new = store_entry("/var/lib/dual-spark/model", {"repo": hub.repo, "revision": hub.commit})
        site = site_variant(tmp_path, model={"repo": hub.repo, "revision": hub.commit, "served_name": "tiny", "tokenizer_mode": "auto",
                                             "tool_call_parser": "", "reasoning_parser": ""}, hf_endpoint=hub.endpoint, hf_endpoint_insecure_http=True)
        before = {node.role: container(node) for node in (HEAD, WORKER)}
        with Probe(url, key) as probe:
            started = time.monotonic()
            staged = pyinfra("-y", "--data", "profile=fast", task="tasks/runtime.py", site=site)
            switching = time.monotonic()
        OUTPUTS.append(staged.stdout)
        began = time.time()
        switched, held, stream = change_through_the_door(url, key, "-y", "--data", "profile=fast", task="tasks/serving.py", site=site)
        assert staged.returncode == 0, staged.stdout
        assert f"fetched {hub.repo}: commit {hub.commit}" in staged.stdout and "model replicated: bytes" in staged.stdout
        assert not probe.failed(started, switching), probe.results  # no failure while staging
        assert len([sent for sent, _, _ in probe.results if started <= sent <= switching]) >= 4
        assert switched.returncode == 0, switched.stdout
        stop = re.search(r"Stop the head's vLLM if any node's stack changes.*\n(?:.*\n)*?\s+\[spark-head\]\s+Success", switched.stdout)
        assert stop, switched.stdout
        head, worker = container(HEAD), container(WORKER)
        assert head["profile"] == worker["profile"] == "fast"
        assert worker["started"] < head["started"], "the worker must start before the head"
        assert running_at_once(url, key) == 1  # fast: max_num_seqs 1
        held_not_failed("new model revision and profile fast", switched, held, stream)
        paged_nothing("new model revision and profile fast", began)
        # new weights answer differently by right: no greedy answer to compare, the perplexity bound instead
        assert re.search(r"canary long: 48 tokens in [\d.]+ s, no answer of these weights recorded: passed", switched.stdout), switched.stdout
        assert re.search(r"canary perplexity: perplexity [\d.e+]+ over \d+ tokens in [\d.]+ s, against [\d.e+]+ recorded: passed", switched.stdout)
        print(f"new model revision: staged in {switching - started:.0f} s serving throughout")
        digest = json.loads((HEAD.root / new.lstrip("/") / ".dual-spark-manifest.json").read_text())["digest"][:12]
        for node in (HEAD, WORKER):
            assert container(node)["started"] > before[node.role]["started"] and model_label(node) == digest
            assert f"{new}:/model:ro" in (node.root / "etc/dual-spark/compose.yaml").read_text()
            assert (node.root / new.lstrip("/") / "README.md").is_file()
            assert (node.root / old.lstrip("/") / "model.safetensors").is_file()  # the old revision, whole, for a way back
            assert f"{old}:/model:ro" in (node.root / "etc/dual-spark/compose.yaml.previous").read_text()
        now = {node.role: container(node) for node in (HEAD, WORKER)}
        again = pyinfra("-y", "--data", "profile=fast", site=site)
        OUTPUTS.append(again.stdout)
        assert again.returncode == 0, again.stdout
        assert re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", again.stdout), again.stdout
        assert {node.role: container(node) for node in (HEAD, WORKER)} == now


def state(node, record: str = "served") -> dict | None:
    """A state the node records (operations/records.py), None without one."""
    path = node.root / f"etc/dual-spark/{record}/state.json"
    return json.loads(path.read_text()) if path.exists() else None


def test_rollback_returns_to_the_state_before_the_new_revision(api):
    """tasks/rollback.py after a change that served (the new revision with profile fast): --dry
    shows each node's stack diff and touches nothing; the run returns both nodes to adaptive on
    the lab's model, kept whole in its store directory: the site's own state, so that a deploy
    then changes nothing; the state it left is now the one to return to."""
    url, key = api
    old = store_entry("/var/lib/dual-spark/model", {"path": LAB_MODEL})
    assert state(HEAD)["model"]["repo"] == state(WORKER)["model"]["repo"] == "lab/tiny-llama-next"
    assert state(HEAD, "rollback")["model"] == {"path": LAB_MODEL} and state(HEAD, "rollback")["profile"] == "adaptive"
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    dry = run("--dry", task="tasks/rollback.py")
    assert dry.returncode == 0, dry.stdout
    assert "Will modify spark-worker:/etc/dual-spark/launch.sh" in dry.stdout and "Will modify spark-head:/etc/dual-spark/compose.yaml" in dry.stdout
    assert re.search(rf"^\s*\+\s+- {re.escape(old)}:/model:ro\s*$", dry.stdout, re.M), dry.stdout
    assert re.search(r"^\s*-\s+--max-num-seqs 1 ", dry.stdout, re.M) and re.search(r"^\s*\+\s+--max-num-seqs 4 ", dry.stdout, re.M)
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before
    began = time.time()
    result, probe, stream = change_through_the_door(url, key, "-y", task="tasks/rollback.py")
    assert result.returncode == 0, result.stdout
    held_not_failed("tasks/rollback.py", result, probe, stream)
    paged_nothing("tasks/rollback.py", began)
    assert "will return every node to profile adaptive, image dual-spark/lab-cpu:" in result.stdout and f"model {LAB_MODEL}" in result.stdout
    head, worker = container(HEAD), container(WORKER)
    assert head["profile"] == worker["profile"] == "adaptive" and worker["started"] < head["started"]
    assert all(f"{old}:/model:ro" in (node.root / "etc/dual-spark/compose.yaml").read_text() for node in (HEAD, WORKER))
    assert running_at_once(url, key) > 1
    assert state(HEAD)["model"] == {"path": LAB_MODEL} and state(HEAD)["image_id"].startswith("sha256:")
    assert state(HEAD, "rollback")["model"]["repo"] == "lab/tiny-llama-next"
    status = run("-y", task="tasks/status.py")
    assert re.search(rf"spark-head\s+serving state\s+PASS\s+profile adaptive, image dual-spark/lab-cpu:\S+ \(sha256:[0-9a-f]{{12}}\), "
                     rf"model {LAB_MODEL}, serving since ", status.stdout), status.stdout
    assert re.search(r"spark-head\s+rollback state\s+PASS\s+profile fast, .*model lab/tiny-llama-next@", status.stdout), status.stdout
    after = {node.role: container(node) for node in (HEAD, WORKER)}
    again = run("-y", task="tasks/profile.py")
    assert again.returncode == 0 and re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", again.stdout), again.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == after


FAILING = {  # a change -> the site tables that make it, the profile, and what vLLM says of it
    "a profile whose window does not fit": (
        '[profile.too-long]\nbase = "adaptive"\nmax_model_len = 131072\n', "too-long", "max_model_len"),
    "an image whose vLLM exits": (
        '[image.lab-cpu-exits]\nbuild = "{build}"\nkv_cache_dtypes = ["auto"]\npython = "python3"\nvllm = "false"\n'
        '[profile.exits]\nbase = "adaptive"\nimage = "lab-cpu-exits"\n', "exits", "vLLM ended before it served on spark-"),
    "a revision whose config.json names no model vLLM has": (None, "adaptive", "NoSuchModelForCausalLM"),
}


@pytest.mark.parametrize("change", FAILING)
def test_a_change_that_does_not_serve_is_rolled_back(api, tmp_path, change):
    """The change starts and gives no token (vLLM exits on one node or both), and every node returns
    to the state that served (adaptive, the lab's model), the time without service printed: the
    run fails, naming the failing side with vLLM's reason from its log, saying it rolled back and
    that the pair serves again; verification, run by the worker, reads the head (a step failed
    there) instead of calling it unreachable. The next deploy of the site's own state changes
    nothing."""
    url, key = api
    tables, profile, reason = FAILING[change]
    served = state(HEAD)
    with ExitStack() as stack:
        if tables is None:  # the lab's model, its architecture renamed, published as a new revision
            broken = tmp_path / "broken"
            shutil.copytree(HEAD.root / LAB_MODEL.lstrip("/"), broken)
            config = json.loads((broken / "config.json").read_text())
            (broken / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchModelForCausalLM"]}))
            hub = stack.enter_context(Hub(broken, repo="lab/tiny-llama-broken"))
            site = site_variant(tmp_path, model={"repo": hub.repo, "revision": hub.commit, "served_name": "tiny", "tokenizer_mode": "auto",
                                                 "tool_call_parser": "", "reasoning_parser": ""}, hf_endpoint=hub.endpoint, hf_endpoint_insecure_http=True)
        else:
            site = tmp_path / "site.toml"
            site.write_text(SITE.read_text() + "\n" + tables.format(build=load_site(SITE).images["lab-cpu"].build))
        result, probe, stream = change_through_the_door(url, key, "-y", "--data", f"profile={profile}", task="tasks/profile.py", site=site)
    assert result.returncode != 0, result.stdout
    held_not_failed(f"{change}, rolled back", result, probe, stream)
    assert re.search(rf"serving tiny \(profile {profile}\): no token after [\d.]+ s \(.*\); failing: .*spark-(head|worker): ", result.stdout), \
        result.stdout
    assert re.search(r"\|\s.*" + re.escape(reason), result.stdout) or reason in result.stdout, result.stdout
    assert "rolling every node back to the state that served before it: profile adaptive" in result.stdout, result.stdout
    assert re.search(r"rolled back to profile adaptive.*: first token after", result.stdout), result.stdout
    assert "so every node was rolled back, and serves again" in result.stdout
    assert re.search(r"spark-head\s+steps of this run\s+FAIL\s+failed here: (tasks/serving.py \| )?Start the head's stack", result.stdout), \
        result.stdout
    assert "no SSH answer" not in result.stdout
    assert container(HEAD)["profile"] == container(WORKER)["profile"] == "adaptive"
    assert chat(url, key).status_code == 200
    assert state(HEAD) == served  # the state that served is still the one recorded, since when it served
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    again = run("-y", task="tasks/profile.py")
    assert again.returncode == 0 and re.search(r"Grand total\s+\d+\s+-\s+-\s+\d+", again.stdout), again.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before


def test_a_change_that_answers_wrongly_is_refused_by_the_canaries_and_rolled_back(api, tmp_path):
    """A profile whose vLLM answers wrongly from its token 24 on (the lab's fault: each token then
    the next ID over), its first token and every check of the API green: the short canaries (up to
    12 tokens) pass, the long one (48) differs from the answer recorded with the state that serves
    at token 24, asked twice, and the tool call (64 tokens) no longer parses; the change is not
    kept, every node returns to that state, no request fails at the door, and a client reading a
    greedy answer of 32 tokens all along gets the right one every time."""
    url, key = api
    served = state(HEAD)
    assert served.get("canaries", {}).get("passed") == ["code", "fabric", "long", "perplexity", "tool"], served
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + '\n[profile.wrong]\nbase = "adaptive"\nenv = { SPARKLAB_ANSWER_FAULT = "shift:24" }\n')
    with Reader(url, key) as reader:
        right = reader.ask()
        result, probe, stream = change_through_the_door(url, key, "-y", "--data", "profile=wrong", task="tasks/profile.py", site=site)
    assert result.returncode != 0, result.stdout
    held_not_failed("a profile that answers wrongly, rolled back", result, probe, stream)
    # The state the canaries refused served no client: the door held them until the state before was back.
    assert right is not None and len(reader.answers) >= 3 and reader.answers == [right] * len(reader.answers), (right, reader.answers)
    for short in ("code", "fabric"):
        assert re.search(rf"canary {short}: \d+ tokens in [\d.]+ s, compared with the recorded answers: passed", result.stdout), result.stdout
    assert re.search(r"canary long: 48 tokens in [\d.]+ s, compared with the recorded answers: differs from the recorded answer at token "
                     r"24 \(of 48; the first 48 must agree\)", result.stdout), result.stdout
    assert re.search(r"canary tool: \d+ tokens in [\d.]+ s, compared with the recorded answers: no tool call parsed from the "
                     r"answer \(finish reason stop\): the served tool parser found none; differs from the recorded answer at token 24",
                     result.stdout), result.stdout
    assert "serving tiny (profile wrong) answered wrongly" in result.stdout, result.stdout
    assert "rolling every node back to the state that served before it: profile adaptive" in result.stdout
    assert "so every node was rolled back, and serves again" in result.stdout
    assert container(HEAD)["profile"] == container(WORKER)["profile"] == "adaptive"
    assert state(HEAD) == served  # the state that served is still the one recorded, with its canaries


def test_verify_runs_the_canaries_on_demand_against_the_state_that_serves(api):
    """tasks/verify.py --data canary=full: the state that serves answers as recorded with it, and
    nothing changes (no container restarts, the record stays)."""
    before, served = {node.role: container(node) for node in (HEAD, WORKER)}, state(HEAD)
    result = run("-y", "--data", "canary=full", task="tasks/verify.py")
    assert result.returncode == 0, result.stdout
    assert re.search(r"canary long: 48 tokens in [\d.]+ s, compared with the recorded answers: passed", result.stdout), result.stdout
    assert "canary: all 5 passed" in result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before and state(HEAD) == served


@pytest.mark.parametrize("args, field", [
    (["--data", "profile=turbo"], "--data profile = 'turbo': choose one of adaptive, fast, long-c4"),
    (["--data", "api_host=0.0.0.0"], "--data api_host = '0.0.0.0': the API would answer beyond this machine"),
])
def test_a_bad_profile_or_override_is_refused_before_contact(serving, args, field):
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    result = run("-y", *args, task="tasks/profile.py")
    assert result.returncode != 0 and field in result.stdout and "no host was contacted" in result.stdout, result.stdout
    assert "Connecting to hosts" not in result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before


def test_bench_reads_what_the_nodes_serve_and_never_records_the_key(serving, tmp_path):
    result = subprocess.run([sys.executable, "-m", "bench.serving", "--site", str(SITE), "--prompt-tokens", "100",
                             "--concurrency", "1", "--requests", "2", "--max-tokens", "16", "--out", str(tmp_path)],
                            cwd=REPO, capture_output=True, text=True, timeout=600)
    OUTPUTS.extend([result.stdout, result.stderr])
    assert result.returncode == 0, result.stderr
    [raw] = tmp_path.glob("serving-adaptive-*.json")
    record = json.loads(raw.read_text())
    OUTPUTS.append(raw.read_text())
    assert record["profile"] == "adaptive" and record["model"] == "tiny"
    assert abs(record["cells"][0]["prompt_tokens"]["mean"] - 100) <= 1  # sized by /tokenize through the tunnel
    assert record["runtime_image_id"].startswith("sha256:") and record["model_revision"] == "/srv/lab-models/tiny-llama"


def test_the_key_never_appears_in_any_output(serving):
    site = load_site(SITE)
    with head_of(site) as client:
        key = read_secret(client, "/var/lib/dual-spark/api-key")
    mode = oct((HEAD.root / "var/lib/dual-spark/api-key").stat().st_mode)[-3:]
    assert len(key) >= 32 and mode == "600"
    logs = [in_node(node.dir, "docker", "logs", "dual-spark-vllm", capture_output=True, check=False) for node in (HEAD, WORKER)]
    texts = OUTPUTS + [log.stdout + log.stderr for log in logs] + [
        p.read_text(errors="replace") for p in (HEAD.root / "etc/dual-spark").rglob("*") if p.is_file()] + [
        (LAB_DIR / node.role / "dockerd.log").read_text(errors="replace") for node in (HEAD, WORKER)]
    inspect = in_node(HEAD.dir, "docker", "inspect", "dual-spark-vllm", capture_output=True).stdout
    assert len(texts) > 10
    for text in texts + [inspect]:
        assert key not in text
