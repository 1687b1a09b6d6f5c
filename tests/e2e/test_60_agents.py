"""Real coding agents on the lab pair: Claude Code and the Codex CLI (npm, pinned, installed by
scripts/setup-agents.sh) each complete one headless turn through the SSH tunnel `python -m
clients` prints, with the files it writes: exit status 0, the tiny model's answer printed, the
request counted by the head's vLLM, and the API key in no output and no file but its own. A client
of its own ([client.NAME]) is let in at the front door, then revoked, with vLLM left running."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from lab.config import AGENTS_DIR, HEAD
from lab.processes import in_node
from layout import DOOR
from site_config import load_site
from tests.e2e.conftest import REPO, SITE, pyinfra
from tests.net import free_port
from tests.observability import samples

pytestmark = pytest.mark.end_to_end
ANSWER = "Hi, this is the tiny spark model."  # what lab/tiny_model.py's chain says, then its end token


def served(url: str) -> float:
    """Requests the head's vLLM finished, whatever the reason (its /metrics is open)."""
    metrics = requests.get(f"{url}/metrics", timeout=30).text
    return sum(float(value) for value in re.findall(r"^vllm:request_success_total\{.*\} (\S+)$", metrics, re.MULTILINE))


def agent(name: str) -> str:
    binary = AGENTS_DIR / "node_modules/.bin" / name
    assert binary.exists(), f"no {name} at {binary}: run scripts/test (scripts/setup-agents.sh installs it)"
    return str(binary)


def one_turn(command: list[str], env: dict, scratch: Path, url: str) -> str:
    """Run an agent headless in an empty directory with an empty HOME; its output, once it is
    seen to have ended well with the model's answer and the head to have served it."""
    (scratch / "home").mkdir()
    (scratch / "work").mkdir()
    before = served(url)
    result = subprocess.run(command, cwd=scratch / "work", env={"PATH": os.environ["PATH"], "HOME": str(scratch / "home"), **env},
                            stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert ANSWER in result.stdout, output[-4000:]
    assert served(url) > before
    return output


def holds_key(root: Path, key: str) -> list[Path]:
    return [path for path in root.rglob("*") if path.is_file() and key.encode() in path.read_bytes()]


def test_the_clients_command_sees_the_agents_requests_taken(clients):
    _, _, text = clients
    for name in ("Codex's tools (tool_choice auto)", "Claude Code's tools (tool_choice auto)", "Claude Code's 32,000 output tokens"):
        assert f"    {name}: answers" in text, text
    assert "tiny: context window 65,536 tokens, Codex compacts at 58,982" in text, text


def test_claude_code_completes_a_turn_through_the_tunnel(clients, tunnel, tmp_path):
    out, _, _ = clients
    key = (out / "api-key").read_text().strip()
    output = one_turn([agent("claude"), "-p", "Say hi", "--settings", str(out / "claude/settings.json")], {}, tmp_path, tunnel)
    assert key not in output
    assert holds_key(tmp_path, key) == [] and holds_key(out, key) == [out / "api-key"]
    assert oct((out / "api-key").stat().st_mode)[-3:] == "600"


def test_the_codex_cli_completes_a_turn_through_the_tunnel(clients, tunnel, tmp_path):
    out, _, _ = clients
    key = (out / "api-key").read_text().strip()
    output = one_turn([agent("codex"), "exec", "--skip-git-repo-check", "Say hi"],
                      {"CODEX_HOME": str(out / "codex"), "DUAL_SPARK_API_KEY": key}, tmp_path, tunnel)
    assert "provider: dual-spark" in output and "model: tiny" in output
    assert key not in output
    assert holds_key(tmp_path, key) == [] and holds_key(out, key) == [out / "api-key"]


def vllm_started() -> str:
    return in_node(HEAD.dir, "docker", "inspect", "-f", "{{.State.StartedAt}}", "dual-spark-vllm", capture_output=True).stdout.strip()


def answers(url: str, key: str) -> int:
    return requests.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=60).status_code


def door_counts() -> dict[str, float]:
    """The door's own counts (files/door/counts.lua), read on the head."""
    port = load_site(SITE).settings.door_metrics_port
    return samples(in_node(HEAD.dir, "python3", "-c", f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}"
                          f"{DOOR['counts_path']}').read().decode())", capture_output=True).stdout)


def test_a_client_of_its_own_is_let_in_then_revoked_with_vllm_left_running(clients, tunnel, tmp_path):
    """[client.laptop] added to the site: the door step alone makes its key on the head and lets it
    in; `python -m clients --client laptop` writes that key, not the deploy's, and the door counts
    that client's requests and the tokens of its answer under its name. The client removed
    from the site: the next run revokes it (401) while the deploy's key still answers, and vLLM
    never restarted. The client's key is in no output and, once revoked, in no file of the head."""
    out, _, _ = clients
    deploy_key = (out / "api-key").read_text().strip()
    started = vllm_started()
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + "\n[client.laptop]\n")
    added = pyinfra("-y", task="tasks/door.py", site=site)
    assert added.returncode == 0, added.stdout
    assert "Will make a key for client laptop on the head, never shown" in added.stdout, added.stdout
    mine = tmp_path / "laptop"
    written = subprocess.run([sys.executable, "-m", "clients", "--site", str(site), "--out", str(mine), "--port", str(free_port()),
                              "--client", "laptop"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert written.returncode == 0, written.stdout + written.stderr
    laptop_key = (mine / "api-key").read_text().strip()
    assert laptop_key != deploy_key and answers(tunnel, laptop_key) == 200 and answers(tunnel, "not-a-key") == 401
    before = door_counts()
    chat = requests.post(f"{tunnel}/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": "Say hi"}],
                                                                "max_tokens": 8}, headers={"Authorization": f"Bearer {laptop_key}"}, timeout=120)
    assert chat.status_code == 200, chat.text
    after = door_counts()  # the one chat, by the door's own count, under laptop's name
    usage = chat.json()["usage"]
    assert {kind: after[f'dual_spark_door_client_{kind}_tokens_total{{client="laptop"}}']
            - before[f'dual_spark_door_client_{kind}_tokens_total{{client="laptop"}}'] for kind in ("prompt", "completion")} \
        == {"prompt": usage["prompt_tokens"], "completion": usage["completion_tokens"]}
    served_2xx = 'dual_spark_door_client_requests_total{client="laptop",code="2xx"}'
    assert after[served_2xx] - before[served_2xx] == 1
    removed = pyinfra("-y", task="tasks/door.py")
    assert removed.returncode == 0, removed.stdout
    assert "Will revoke client laptop's key: it is no longer in the site" in removed.stdout, removed.stdout
    # at once: the run replaced the running door's maps before its reload (CI once saw a revoked key
    # answered while the reload, which returns before it ends, had not)
    assert answers(tunnel, laptop_key) == 401 and answers(tunnel, deploy_key) == 200
    assert vllm_started() == started  # revoking a key restarts nothing but the door's reading of its maps
    for text in (added.stdout, removed.stdout, written.stdout + written.stderr):
        assert laptop_key not in text and deploy_key not in text
    assert holds_key(HEAD.root / "etc", laptop_key) == [] and holds_key(HEAD.root / "var/lib/dual-spark", laptop_key) == []
