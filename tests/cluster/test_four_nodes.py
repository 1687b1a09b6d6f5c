"""End to end on four lab nodes through the switch, from the factory state: the deploy
converges them to one TP=4 vLLM serving through the head's API and the printed tunnel, a second
run changes nothing, the head's Prometheus scrapes every node's exporter over the fabric, a
switch port left at auto-negotiation (100G) is a verification FAIL with its fix and is seen in
Prometheus's rule, a profile switch there fails no request at the front door, and each
single fault (a worker's or the head's vLLM killed, a worker's Docker restarted, a worker
stopped and started, a worker's vLLM frozen) heals with no one touching anything (the times
printed)."""

import re
import time

import pytest
import requests

from bench.remote import forward, head_of
from lab import faults
from lab.config import CABLE_LAYOUTS
from lab.processes import in_node
from site_config import load_site
from tests.cluster.conftest import MEASURED, NODES
from tests.e2e.conftest import SITE, healed_after, pyinfra
from tests.e2e.test_10_converge import changed_operations
from tests.e2e.test_40_serving import change_through_the_door, held_not_failed

pytestmark = pytest.mark.end_to_end
ANSWER = "Hi, this is the tiny spark model."  # lab/tiny_model.py


def running_container(node) -> str:
    """The ID and start time of the node's vLLM container."""
    return in_node(node.dir, "docker", "inspect", "-f", "{{.Id}} {{.State.StartedAt}} {{.State.Running}}", "dual-spark-vllm",
                   capture_output=True).stdout.strip()


def test_the_deploy_converges_four_nodes_to_one_tensor_parallel_endpoint(cluster_lab, converged):
    first_token = re.search(r"first token after ([\d.]+) s", converged.stdout)
    if first_token:
        MEASURED["vLLM start: first token after (deploy's wait)"] = f"{float(first_token.group(1)):.0f} s"
    assert re.search(r"spark-head\s+API\s+PASS\s+generates tokens at 127.0.0.1:8888 as tiny", converged.stdout), converged.stdout
    for rank, node in enumerate(cluster_lab.nodes):
        assert running_container(node).endswith("true"), f"{node.hostname} runs no vLLM container"
        launch = (node.root / "etc/dual-spark/launch.sh").read_text()
        assert "--tensor-parallel-size 4" in launch and f"--nnodes {NODES}" in launch and f"--node-rank {rank}" in launch, launch
        assert ("--headless" in launch) == (rank > 0), launch
        if rank:
            assert "--master-addr 10.0.0.1" in launch, launch


def test_a_chat_completion_is_served_through_the_tunnel(clients, tunnel):
    out, _, _ = clients
    headers = {"Authorization": f"Bearer {(out / 'api-key').read_text().strip()}"}
    chat = requests.post(f"{tunnel}/v1/chat/completions", headers=headers, timeout=120,
                         json={"model": "tiny", "messages": [{"role": "user", "content": "spark"}], "max_tokens": 32})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["content"] == ANSWER, chat.text
    assert requests.get(f"{tunnel}/v1/models", timeout=10).status_code == 401


def test_a_second_run_changes_nothing(cluster_lab, converged):
    before = {node.hostname: running_container(node) for node in cluster_lab.nodes}
    started = time.monotonic()
    result = pyinfra("-y", timeout=1800)
    MEASURED["second converge (4 nodes, no change)"] = f"{time.monotonic() - started:.0f} s"
    assert result.returncode == 0, result.stdout
    assert changed_operations(result.stdout) == 0, result.stdout
    assert {node.hostname: running_container(node) for node in cluster_lab.nodes} == before


def test_a_switch_port_at_100g_fails_verification_with_the_fix_and_shows_in_prometheus(cluster_lab, converged):
    """Every node's exporter is up on its rail 0 address. A port at 100G is a verification FAIL
    naming the fix, and the head's Prometheus reads it in the textfile metrics and in the rule
    its alert reads (pending: its 'for' is longer than this test waits)."""
    cluster = load_site(SITE)
    node, netdev = cluster_lab.nodes[2], CABLE_LAYOUTS["f0"][0][0]
    with head_of(cluster) as client, forward(client, "127.0.0.1", cluster.settings.prometheus_port) as port:
        url = f"http://127.0.0.1:{port}"

        def query(expr: str) -> list[dict]:
            return requests.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()["data"]["result"]

        deadline = time.monotonic() + 120
        while len(query('up{job="node"} == 1')) < NODES:
            assert time.monotonic() < deadline, query('up{job="node"}')
            time.sleep(2)
        assert {series["metric"]["instance"] for series in query('up{job="node"}')} == {f"10.0.0.{rank + 1}:9100" for rank in range(NODES)}
        faults.switch_port_autonegotiated(node, netdev)
        try:
            result = pyinfra("-y", task="tasks/verify.py")
            deadline = time.monotonic() + 120
            while not query(f'dual_spark_rail_speed_mbps{{node="{node.hostname}", netdev="{netdev}"}} == 100000'):
                assert time.monotonic() < deadline, "the collector never read the port at 100G"
                time.sleep(2)
            while not query('ALERTS{alertname="DualSparkRailSlow"}'):
                assert time.monotonic() < deadline + 60, "the alert on the slow port is not even pending"
                time.sleep(2)
        finally:
            faults.switch_port_autonegotiated(node, netdev, 200000)
    assert result.returncode != 0, result.stdout
    row = rf"{node.hostname}\s+rail 0 {netdev} link\s+FAIL\s+100000 Mb/s, expected 200000"
    assert re.search(row, result.stdout), result.stdout
    assert "force 200G, auto-negotiation off on the switch" in result.stdout, result.stdout
    assert not re.search(r"spark-(head|worker[13])\s+rail \d \S+ link\s+FAIL", result.stdout), result.stdout
    put_right = pyinfra("-y", task="tasks/verify.py")
    assert put_right.returncode == 0, put_right.stdout


def test_a_profile_switch_fails_no_request_at_the_door(clients, tunnel):
    """The front door on four nodes: a probe every half second and a long streamed request
    through it while the serving step switches every rank to fast. No request fails; the longest
    wait is printed. (The pair's tier switches there and back; here one way: each switch of four
    CPU vLLMs on two cores takes minutes, and the faults below heal whatever profile serves.)"""
    out, _, _ = clients
    key = (out / "api-key").read_text().strip()
    result, probe, stream = change_through_the_door(tunnel, key, "-y", "--data", "profile=fast", task="tasks/serving.py")
    assert result.returncode == 0, result.stdout
    held_not_failed("profile fast (4 nodes)", result, probe, stream)
    # the same weights under another profile: every canary answers as the state before did, token for token
    assert re.search(r"canary long: 48 tokens in [\d.]+ s, compared with the recorded answers: passed", result.stdout), result.stdout
    assert "canary: all 5 passed" in result.stdout
    MEASURED["profile switch to fast -> longest wait at the door"] = f"{probe.longest_wait():.1f} s"


# By rank: the head is 0, each fault on another worker. Docker restarted and a node rebooted are
# the pair's tier's (tests/e2e/test_50_operate.py): the same watchdogs heal them, and here each
# took a minute of CI for no rank-specific path (docs/lab.md, "Four nodes").
FAULTS = {
    "worker vLLM killed (rank 3)": lambda nodes: faults.kill(nodes[3], "vllm serve"),
    "head vLLM killed": lambda nodes: faults.kill(nodes[0], "vllm serve"),
    "worker frozen (rank 2, SIGSTOP)": lambda nodes: faults.freeze(nodes[2]),
}


@pytest.mark.parametrize("name", FAULTS)
def test_any_single_fault_heals_with_no_one_touching_anything(cluster_lab, converged, name):
    """Every rank restarts for any of them (a tensor-parallel cluster has no spare): the time
    from the fault to the first token served again is printed (the goal: 90 s)."""
    took = healed_after(name, lambda: FAULTS[name](cluster_lab.nodes))
    MEASURED[f"{name} -> first served token"] = f"{took:.0f} s"
