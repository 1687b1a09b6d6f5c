"""What the steps read of each node, read once per node (operations/readings.py): the plan names
every reading the operations take, a node is read once while the run changes nothing, and anew
once it has changed something or the changes start executing."""

import importlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from facts.host_prep import ManagedPaths
from facts.identity import MachineIds
from facts.node import NodeState, fact_named
from facts.serving import ServingState
from facts.ssh_trust import SshTrust
from operations.managed import managed_files
from operations.own import NAMES, Claim, reading_paths
from operations.readings import _plans, key, plan_every_module, read, step_readings
from tests.fake_host import args_key, fact_key, load, run_operation, running, site, task_arguments
from tests.test_facts import facts_of_this_project
from tests.test_operations import FIXTURES

plan_every_module()  # as deploy.py does: every module's plan, whichever tests ran before these
PROJECT = {name for name, _ in facts_of_this_project()}
# What an operation reads of a node outside the plan: only as a change is shown (a program's old
# text, a rollback's record files), while the changes execute (a callback's status), in verification,
# and the plan's own reading.
ALONE = {"host_prep.ArchiveFiles", "serving.RecordFiles", "status.ServingStatus", "verify.Readiness", "node.NodeState"}


def planned(case: dict, name: str) -> set[str]:
    return {key(fact, arguments) for fact, arguments in step_readings(site(case["site"], case.get("settings"), case.get("tables")), name)}


@pytest.mark.parametrize("fixture", [path for path in FIXTURES if set(load(path).get("args", {})) <= {"role"} and "exception" not in load(path)],
                         ids=lambda path: f"{path.parent.name}/{path.stem}")
def test_the_plan_names_every_reading_an_operation_takes(fixture):
    """Every fact of facts/ an operation reads on any node, but those it reads alone, it reads with the
    plan's arguments there (else it reads that node twice); every node is read whole at most once."""
    case = load(fixture)
    module, name = fixture.parent.name.rsplit(".", 1)
    op = getattr(importlib.import_module(f"operations.{module}"), name)
    _, host = run_operation(op, case)
    for node in host.nodes.values():
        for fact, arguments in [(fact, arguments) for fact, arguments in node.read if fact in PROJECT - ALONE]:
            assert key(fact_named(fact), arguments) in planned(case, node.name), f"{node.name} reads {fact}({args_key(arguments)})"
        assert [fact for fact, _ in node.read].count(fact_key(NodeState)) <= 1


def test_the_plan_names_the_managed_paths_the_task_reads():
    """What the managed_files cases cannot say: they lay programs of their own over the task's."""
    cluster = site("pair")
    with running(pair()):
        arguments = task_arguments(managed_files, {})
    reading = {"files": [dest for _, dest, _ in arguments["programs"]],
               "directories": reading_paths([Claim(*entry) for entry in arguments["directories"]]), "names": NAMES}
    assert key(ManagedPaths, reading) in {
        key(fact, planned_arguments) for fact, planned_arguments in step_readings(cluster, "spark-head")}


STATE = {"stack_dir": "/etc/dual-spark", "key_file": "/var/lib/dual-spark/api-key",
         "model_record": "/var/lib/dual-spark/model/drowzeys-DeepSeek-V4-Flash-DSpark-Abli-14c06b6db367-298b2bba0fa1/.dual-spark-manifest.json"}
IDS = {"etc": "1" * 32, "dbus": None, "dbus_is_link": False, "hostname": "spark-head", "unreadable": []}
SERVING = {"compose": None, "launch": None, "container": None, "rdma": {"devices": {}, "unreadable": []}, "api_key": False,
           "model_digest": None, "unreadable": []}


def pair(**case) -> dict:
    facts = {"identity.MachineIds": {"": IDS}, "serving.ServingState": {args_key(STATE): SERVING},
             "ssh_trust.SshTrust": {args_key({"user": "spark", "netdevs": ["eth9"]}): {"home": "/home/spark"}}}
    return {"site": "pair", "host": "spark-head", "facts": {"spark-head": facts, "spark-worker": facts}, **case}


def read_alone(node) -> list[str]:
    return [fact for fact, _ in node.read if fact != fact_key(NodeState)]


def whole(node) -> int:
    return [fact for fact, _ in node.read].count(fact_key(NodeState))


def test_the_plan_names_serving_state_as_the_steps_read_it():
    assert key(ServingState, STATE) in {key(fact, arguments) for fact, arguments in step_readings(site("pair"), "spark-worker")}


@pytest.mark.parametrize("executing", [False, True])
def test_every_node_is_read_once_while_the_run_changes_nothing(executing):
    with running(pair(executing=executing)) as (_, hosts):
        head, worker = hosts["spark-head"], hosts["spark-worker"]
        assert read(head, MachineIds) == IDS
        assert read(worker, ServingState, **STATE) == SERVING
        assert read(head, ServingState, **STATE) == SERVING
        assert read(worker, MachineIds) == IDS
    assert (whole(head), whole(worker)) == (1, 1)
    assert read_alone(head) == read_alone(worker) == []


def test_a_reading_the_plan_lacks_is_taken_when_asked():
    with running(pair()) as (_, hosts):
        head = hosts["spark-head"]
        assert read(head, SshTrust, user="spark", netdevs=["eth9"]) == {"home": "/home/spark"}
    assert read_alone(head) == ["ssh_trust.SshTrust"]


def test_once_a_step_ran_a_command_every_reading_is_taken_anew():
    with running(pair(executing=True, changes={"spark-worker": 1})) as (state, hosts):
        head = hosts["spark-head"]
        read(head, MachineIds)
        state.ops[hosts["spark-worker"]] = {"op": SimpleNamespace(operation_meta=SimpleNamespace(executed=True))}
        read(head, MachineIds)
        read(head, MachineIds)
    assert whole(head) == 1
    assert read_alone(head) == ["identity.MachineIds", "identity.MachineIds"]


@pytest.mark.parametrize("changes", [{"spark-worker": 1}, {}], ids=["a change found", "nothing to change"])
def test_the_run_reads_again_what_change_detection_read_unless_it_found_nothing_to_change(changes):
    """Before it changes anything the run reads every node again; a run with nothing to change
    decides again from the readings change detection took (verification then reads each node back)."""
    with running(pair(changes=changes)) as (state, hosts):
        head, worker = hosts["spark-head"], hosts["spark-worker"]
        read(head, MachineIds)
        state.is_executing = True
        read(head, MachineIds)
        read(worker, MachineIds)
    assert (whole(head), whole(worker)) == ((2, 2) if changes else (1, 1))
    assert read_alone(head) == read_alone(worker) == []


def test_a_node_that_does_not_answer_is_not_read_whole():
    with running(pair(unreachable=["spark-worker"])) as (_, hosts):
        read(hosts["spark-head"], MachineIds)
    assert whole(hosts["spark-worker"]) == 0


@pytest.mark.parametrize("name", ["serving.", ".ServingState", "nosuch.Fact", "serving.ServingStatus_", "serving.os", "..x.y",
                                  "combine.split"])
def test_a_section_that_names_no_fact_is_left_out_and_never_run(name):
    """The output names each section's fact; one that names no fact of facts/ is not a reading,
    and a plan naming it is refused before any command is made."""
    reading = NodeState().process([f"@@section 0 {name}", "x", "@@section 1 identity.MachineIds", "etc 0123"])
    assert reading["readings"][0] is None and reading["readings"][1] is not None
    with pytest.raises(ValueError, match="not a fact of facts/"):
        NodeState().command(readings=[[name, {}]])


def test_the_deploy_plans_for_every_task_before_the_first_reading():
    """Change detection reads a node as soon as the first task calls its first step, before
    deploy.py has loaded the tasks after it: deploy.py loads every module's plan before its first
    include (so that `pyinfra --dry` reads each node once). Its preamble alone, in a fresh process."""
    import subprocess
    import sys

    script = ("import pyinfra.local\npyinfra.local.include = lambda *args, **kwargs: None\n"
              "exec(compile(open('deploy.py').read(), 'deploy.py', 'exec'))\n"
              "from operations.readings import fact_name, step_readings\nfrom tests.fake_host import site\n"
              "print(' '.join(sorted({fact_name(fact) for fact, _ in step_readings(site('pair'), 'spark-head')})))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[1])
    assert done.returncode == 0, done.stderr
    assert {"host_prep.PackageStatus", "verify.Readiness", "observability.ObservabilityState", "door.DoorState",
            "serving.ServingState"} <= set(done.stdout.split())


@pytest.mark.parametrize("name", ["spark-head", "spark-worker"])
def test_verification_reads_what_it_shares_as_the_steps_read_it(name):
    """Readiness's rows of the five readings it shares (facts/verify.py SHARED) come from the steps'
    own readings: the same facts with the same arguments as some step's, so the round trip reads
    each once."""
    from facts.verify import SHARED, Readiness
    from operations.verify import readings

    cluster = site("pair")
    own, *shared = readings(cluster, name)
    assert own[0] is Readiness and [fact for fact, _ in shared] == list(SHARED.values())
    steps = [reading for plan in _plans if plan is not readings for reading in plan(cluster, name)]
    assert all(any(key(*reading) == key(*step) for step in steps) for reading in shared)
