"""The serving step's wait for the first token, when none comes: the step fails saying which side
failed, with the last lines of that side's container log (the status rows of both nodes), never
with pyinfra's bare "executed N commands"; and it stops waiting once a node's backoff record says
a start failed. The nodes are those of the status fixture whose worker container stopped; the
health probe's answer is the one it prints when nothing listens."""

import json
import re
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import click
from pyinfra.api import StringCommand
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_inventory, ctx_state

from operations.handover import PROBE_SLICE, failed_starts, first_token
from tests.fake_host import FakeHost, FakeInventory, fake_hosts, load

FIXTURE = Path(__file__).parent / "operations/status.status/worker_stopped.json"
NO_ANSWER = {"ok": False, "model": None, "max_model_len": None, "status": None, "seconds": 300.4,
             "error": "no answer at http://127.0.0.1:8888: <urlopen error [Errno 111] Connection refused>"}


class Node(FakeHost):
    """A node as the step runs: the probe's exit status and output (on the head), its backoff
    record (``starts``, what `cat` prints), the commands it ran, what the step logs."""

    def __init__(self, node: FakeHost, answer: dict, status: bool, starts: dict | None):
        super().__init__(node.name, vars(node.data), node.facts, node.state)
        self.answer, self.status, self.starts, self.ran, self.logged = answer, status, starts, [], []

    def run_shell_command(self, command, **kwargs):
        text = command.get_raw_value()
        self.ran.append(text)
        if text.startswith("cat "):
            return self.starts is not None, CommandOutput([OutputLine("stdout", json.dumps(self.starts))] if self.starts else [])
        return self.status, CommandOutput([OutputLine("stdout", json.dumps(self.answer))])

    def log(self, message: str, log_func=None) -> None:
        self.logged.append(message)


def wait(answer: dict, status: bool, seconds: int = 0, worker_starts: dict | None = None) -> tuple[bool, Node, Node]:
    state = SimpleNamespace(failed_hosts=set(), ops={})
    nodes = fake_hosts(load(FIXTURE), state)
    head = Node(nodes["spark-head"], answer, status, {"failed_starts": 0, "healthy": False})
    worker = Node(nodes["spark-worker"], answer, status, worker_starts)
    state.inventory = FakeInventory({head.name: head, worker.name: worker})
    backoff = [(head.name, "/var/lib/dual-spark/serving/head-starts"), (worker.name, "/var/lib/dual-spark/serving/worker-starts")]
    with ExitStack() as stack:
        stack.enter_context(ctx_state.use(state))
        stack.enter_context(ctx_inventory.use(state.inventory))
        ok = first_token(state, head, StringCommand("python3", "health.py"), seconds, "serving tiny (profile adaptive)",
                         [head.name, worker.name], backoff)
    return ok, head, worker


def test_no_token_fails_naming_the_failing_side_with_its_log(capsys):
    ok, head, _ = wait(NO_ANSWER, False)
    table = click.unstyle(capsys.readouterr().out)
    assert not ok
    assert "spark-worker  vLLM container" in table and "exited (exit code 137" in table
    assert "| (MainProcess pid=7) WARNING 11-29 21:11:34 [multiproc_executor.py:501]" in table  # the worker's last log line
    [message] = head.logged
    assert re.match(r"serving tiny \(profile adaptive\): no token after 0\.\d s \(no answer at http://127.0.0.1:8888", message), message
    assert head.ran[0] == "python3 health.py --wait 0"
    assert "failing: spark-head: API: " in message and "spark-worker: vLLM container: exited (exit code 137" in message


def test_a_token_passes_and_reads_nothing_else(capsys):
    ok, head, worker = wait({**NO_ANSWER, "ok": True, "error": None, "seconds": 41.0}, True, seconds=300)
    assert ok and capsys.readouterr().out == ""
    assert re.fullmatch(r"serving tiny \(profile adaptive\): first token after 0\.\d s", head.logged[0]), head.logged
    assert head.ran == [f"python3 health.py --wait {PROBE_SLICE}"] and worker.ran == []


def test_the_wait_ends_once_a_node_has_failed_a_start(capsys):
    """The worker's vLLM ended before it served and Docker started it again: the step fails after
    one probe of PROBE_SLICE seconds, not at the end of its 300, naming the node; a record of a
    start under way (failed_starts 0) or of a run that served does not end it."""
    ok, head, worker = wait(NO_ANSWER, False, seconds=300, worker_starts={"failed_starts": 1, "healthy": False})
    capsys.readouterr()
    assert not ok and head.ran[0] == f"python3 health.py --wait {PROBE_SLICE}" and len(head.ran) == 2  # one probe, one record
    assert worker.ran == ["cat /var/lib/dual-spark/serving/worker-starts 2>/dev/null"]
    assert "vLLM ended before it served on spark-worker, and Docker started it again; the probe: no answer at" in head.logged[-1]
    state = SimpleNamespace(inventory=FakeInventory({worker.name: worker}))
    for record in ({"failed_starts": 0, "healthy": False}, {"failed_starts": 0, "healthy": True}, None):
        worker.starts = record
        assert failed_starts(state, [(worker.name, "/var/lib/dual-spark/serving/worker-starts")]) == []
