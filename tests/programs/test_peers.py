"""peers and image send, the programs the head runs its steps on other nodes with, run from the
archive the deploy ships, with sudo, ssh and docker as scripts on PATH: ssh runs the remote
command here in sh, with NODE naming the address it reached; an address ending in .9 does not
answer. Real ssh between real nodes is the lab's (tests/e2e)."""

import os
import shlex
import subprocess
import sys
import time

import pytest

from tests.programs import ARCHIVE
from tests.test_runtime_commands import SUDO

SSH = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
while args[0] in ("-o", "-c"):
    args = args[2:]
target, command = args[0], " ".join(args[1:])
if target.endswith(".9"):
    sys.exit(255)
with open(os.environ["CALLS"], "a") as calls:
    calls.write(target + " " + command + "\\n")
os.environ["NODE"] = target.split("@")[1]
os.execvp("sh", ["sh", "-c", command])
"""
DOCKER = f"""#!{sys.executable}
import os, sys
args, node = sys.argv[1:], os.environ.get("NODE", "here")
if args[0] == "save":
    sys.stdout.write("layers of " + args[1])
elif args[0] == "load":
    open(os.path.join(os.environ["LOADED"], node), "w").write(sys.stdin.read())
elif args[:3] == ["image", "inspect", "-f"]:
    print(os.environ.get("ID_" + node.replace(".", "_"), "sha256:" + "ab" * 32) if "Id" in args[3] else "14")
"""


@pytest.fixture
def run(tmp_path):
    """The archive run with the stand-ins first on PATH; its result, and the ssh calls made."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("sudo", SUDO), ("ssh", SSH), ("docker", DOCKER)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (tmp_path / "loaded").mkdir()
    calls = tmp_path / "calls"

    def run(*args: str, stdin: str = "", **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        environment = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(calls),
                       "LOADED": str(tmp_path / "loaded"), **env}
        result = subprocess.run([sys.executable, str(ARCHIVE), *args], input=stdin, env=environment, capture_output=True, text=True,
                                timeout=60, cwd=tmp_path)
        return result, calls.read_text().splitlines() if calls.exists() else []

    return run


def test_run_takes_the_first_rail_that_answers_and_passes_arguments_and_stdin_whole(run):
    result, calls = run("peers", "run", "--node", "spark-worker", "--user", "spark", "--rail", "10.0.0.9", "--rail", "10.0.1.2",
                        "--", "sh", "-c", 'printf "%s|" "$NODE" "$0" "$1"; cat', "it's one", "two words", stdin="from the head")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "10.0.1.2|it's one|two words|from the head"
    assert result.stderr == "spark-worker does not answer over SSH at 10.0.0.9: trying the next rail\n"
    assert [call.split(" ", 1)[0] for call in calls] == ["spark@10.0.1.2", "spark@10.0.1.2"]  # the probe, then the command


def test_run_fails_with_the_commands_status_or_naming_a_node_that_answers_on_no_rail(run):
    failed, _ = run("peers", "run", "--node", "spark-worker", "--user", "spark", "--rail", "10.0.0.2", "--", "sh", "-c", "exit 3")
    assert failed.returncode == 3
    gone, calls = run("peers", "run", "--node", "spark-3", "--user", "spark", "--rail", "10.0.0.9", "--rail", "10.0.1.9", "--", "true")
    assert gone.returncode == 1
    assert gone.stderr.splitlines()[-1] == "spark-3 answers on no fabric rail: run pyinfra inventory.py tasks/verify.py"
    assert not any("10.0.0.9" in call or "10.0.1.9" in call for call in calls)


def test_all_runs_the_jobs_at_the_same_time_and_names_each_node_that_failed(run, tmp_path):
    """Each job waits (up to 5 s) until all three have started: together they end at once, one
    after another they could not. The worker's job fails: its lines come under its name, after a
    line saying it failed, and the last line names it with what happens next."""
    started = tmp_path / "started"
    wait = (f'echo start >> {started}; n=0; while [ "$(wc -l < {started})" -lt 3 ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done; '
            'echo "ran on ${NODE:-the head}"')
    begun = time.monotonic()
    result, _ = run("peers", "all", "--what", "the test", "--then", " (again next run)",
                    "--job", "spark-head", "here", wait,
                    "--job", "spark-worker", "spark@10.0.0.9,10.0.1.2", f"{wait}; echo broken >&2; exit 1",
                    "--job", "spark-3", "spark@10.0.0.3", wait)
    assert time.monotonic() - begun < 5, "the jobs ran one after another"
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "spark-head: ran on the head",
        "the test failed on spark-worker:",
        "spark-worker: spark-worker does not answer over SSH at 10.0.0.9: trying the next rail",
        "spark-worker: ran on 10.0.1.2",
        "spark-worker: broken",
        "spark-3: ran on 10.0.0.3",
        "the test failed on: spark-worker (again next run)",
    ]


def test_all_quotes_a_job_once_and_a_node_that_answers_on_no_rail_fails_alone(run, tmp_path):
    result, _ = run("peers", "all", "--what", "recording",
                    "--job", "spark-head", "here", shlex.join(["printf", "%s", "it's $HOME"]),
                    "--job", "spark-worker", "spark@10.0.0.9", "true")
    assert result.returncode == 1
    assert result.stderr.splitlines() == [
        "spark-head: it's $HOME",
        "recording failed on spark-worker:",
        "spark-worker: spark-worker does not answer over SSH at 10.0.0.9: trying the next rail",
        "spark-worker: spark-worker answers on no fabric rail: run pyinfra inventory.py tasks/verify.py",
        "recording failed on: spark-worker",
    ]


def test_all_refuses_a_job_whose_place_is_neither_here_nor_a_user_at_rails(run):
    result, _ = run("peers", "all", "--what", "x", "--job", "spark-worker", "10.0.0.2", "true")
    assert result.returncode != 0 and "spark-worker's WHERE '10.0.0.2' is neither `here` nor USER@ADDRESS" in result.stderr


def test_image_send_streams_the_image_and_compares_the_ids(run, tmp_path):
    result, _ = run("image", "send", "--tag", "x:1", "--node", "spark-worker", "--user", "spark", "--rail", "10.0.0.9",
                    "--rail", "10.0.1.2", "--from", "spark-head")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "loaded/10.0.1.2").read_text() == "layers of x:1"
    assert result.stdout.startswith("streaming x:1 to spark-worker: 13 B in "), result.stdout


def test_image_send_fails_when_the_image_arrives_with_another_id(run):
    result, _ = run("image", "send", "--tag", "x:1", "--node", "spark-worker", "--user", "spark", "--rail", "10.0.0.2",
                    "--from", "spark-head", ID_10_0_0_2="sha256:" + "cd" * 32)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1] == "x:1 reached spark-worker with another image ID than spark-head's: it is sent again next run"
