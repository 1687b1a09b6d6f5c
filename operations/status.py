"""Status: the serving cluster at a glance, read from every node at once; changes nothing."""

from __future__ import annotations

from functools import partial

from pyinfra import inventory
from pyinfra.api import operation

from checks import Check
from checks.status import status_checks
from facts.status import ServingStatus
from layout import DOOR, VLLM_HOST, paths
from operations.verify import all_checks, answers, report, reports_here

LOG_LINES = 12


def read_status(node) -> dict | None:
    """One node's ServingStatus, or None when it does not answer over SSH."""
    if not answers(node):
        return None
    cluster = node.data.cluster
    settings, me = cluster.settings, cluster.node(node.name)
    where = paths(settings.state_dir, settings.model_dir)
    head = me.role == "head"
    api = {"url": f"http://{VLLM_HOST}:{settings.vllm_port}", "key_file": where["api_key"]} if head else None
    prometheus = {"prometheus": f"http://127.0.0.1:{settings.prometheus_port}"} if head and settings.observability else {}
    return node.get_fact(ServingStatus, programs=where["programs"], rail_ip=me.fabric_addresses[0], port=settings.watchdog_port,
                         state_file=f"{where['serving']}/{me.role}-starts", log_lines=LOG_LINES, stack_dir=settings.stack_dir, api=api,
                         door=DOOR["socket"] if head else None, planned=where["planned"] if head else None,
                         door_counts=f"http://127.0.0.1:{settings.door_metrics_port}{DOOR['counts_path']}" if head else None, **prometheus)


def cluster_status(nodes: list, own_work: bool = False) -> list[Check]:
    """The status rows of every node, in rank order (all read at the same time). A run that
    itself stops and starts serving (``own_work``) sees its failures as failures: the warnings
    for planned work and a heal in its time are for everyone else."""
    return all_checks(nodes, read_status, partial(status_checks, excused=not own_work))


@operation()
def status(node_names: list[str]):
    """
    Print one table of the serving cluster: per node its vLLM container (state, uptime,
    restarts, image, profile), its watchdog, memory and rails; the head's vLLM (a generated token,
    the served model, its max model len), its front door (vLLM's state there, the requests in
    flight and tried again) and speculative-decoding acceptance since the start.
    A failing node shows the last lines of its log; any FAIL fails the run. Changes nothing.

    + node_names: the inventory names of every node, in rank order

    **Example:**

    .. code:: python

        status(node_names=["spark-1", "spark-2", "spark-3", "spark-4"])
    """
    if reports_here():
        nodes = [inventory.get_host(name) for name in node_names]
        yield from report(cluster_status(nodes), "status", "the cluster serves")
