"""The serving step's wait for the first token, when none comes: the step fails saying which side
failed, with the last lines of that side's container log (the status rows of both nodes), never
with pyinfra's bare "executed N commands". The nodes are those of the status fixture whose worker
container stopped; the health probe's answer is the one it prints when nothing listens."""

import json
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import click
from pyinfra.connectors.util import CommandOutput, OutputLine
from pyinfra.context import ctx_inventory, ctx_state

from operations.serving import first_token
from tests.fake_host import FakeHost, FakeInventory, fake_hosts, load

FIXTURE = Path(__file__).parent / "operations/status.status/worker_stopped.json"
NO_ANSWER = {"ok": False, "model": None, "max_model_len": None, "status": None, "seconds": 300.4,
             "error": "no answer at http://127.0.0.1:8888: <urlopen error [Errno 111] Connection refused>"}


class Head(FakeHost):
    """The head as the step runs there: the probe's exit status and output, what the step logs."""

    def __init__(self, node: FakeHost, answer: dict, status: bool):
        super().__init__(node.name, vars(node.data), node.facts, node.state)
        self.answer, self.status, self.logged = answer, status, []

    def run_shell_command(self, command, **kwargs):
        return self.status, CommandOutput([OutputLine("stdout", json.dumps(self.answer))])

    def log(self, message: str, log_func=None) -> None:
        self.logged.append(message)


def wait(answer: dict, status: bool) -> tuple[bool, Head]:
    state = SimpleNamespace(failed_hosts=set(), ops={})
    nodes = fake_hosts(load(FIXTURE), state)
    head = Head(nodes["spark-head"], answer, status)
    worker = nodes["spark-worker"]
    state.inventory = FakeInventory({head.name: head, worker.name: worker})
    with ExitStack() as stack:
        stack.enter_context(ctx_state.use(state))
        stack.enter_context(ctx_inventory.use(state.inventory))
        ok = first_token(state, head, "python3 health.py --wait 300", "serving tiny (profile adaptive)", [head.name, worker.name])
    return ok, head


def test_no_token_fails_naming_the_failing_side_with_its_log(capsys):
    ok, head = wait(NO_ANSWER, False)
    table = click.unstyle(capsys.readouterr().out)
    assert not ok
    assert "spark-worker  vLLM container" in table and "exited (exit code 137" in table
    assert "| (MainProcess pid=7) WARNING 11-29 21:11:34 [multiproc_executor.py:501]" in table  # the worker's last log line
    [message] = head.logged
    assert message.startswith("serving tiny (profile adaptive): no token after 300.4 s (no answer at http://127.0.0.1:8888")
    assert "failing: spark-head: API: " in message and "spark-worker: vLLM container: exited (exit code 137" in message


def test_a_token_passes_and_reads_nothing_else(capsys):
    ok, head = wait({**NO_ANSWER, "ok": True, "error": None, "seconds": 41.0}, True)
    assert ok and capsys.readouterr().out == ""
    assert head.logged == ["serving tiny (profile adaptive): first token after 41.0 s"]
