"""The lab's shapes, without the lab: the site file of four nodes through the switch is one the
deploy takes (nodes in rank order, one subnet per rail, TP over all four), the pair's keeps its
roles and default topology, and a shape the lab cannot build is refused naming it."""

from pathlib import Path

import pytest

from lab.config import LAB_DIR, lab_nodes
from lab.core import Lab
from lab.site import render
from site_config import load_site


def lab_site(tmp_path: Path, count: int, topology: str) -> Path:
    context = tmp_path / "context"
    context.mkdir(exist_ok=True)
    (context / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")  # the lab's own exists only while the lab is up
    site = tmp_path / f"lab-{count}.toml"
    site.write_text(render(context, ["/opt/vllm"], lab_nodes(count), topology).replace(str(LAB_DIR / "id_ed25519"),
                                                                                     str(tmp_path / "id_ed25519")))
    return site


def test_the_four_node_site_is_a_switch_cluster_in_rank_order(tmp_path):
    cluster = load_site(lab_site(tmp_path, 4, "switch"))
    assert cluster.topology == "switch" and cluster.size == 4
    assert [node.hostname for node in cluster.nodes] == ["spark-head", "spark-worker1", "spark-worker2", "spark-worker3"]
    assert [node.ssh_host for node in cluster.nodes] == [f"198.51.100.{11 + rank}" for rank in range(4)]
    assert [[str(rail.address) for rail in node.rails] for node in cluster.nodes] == \
        [[f"10.0.0.{rank}/24", f"10.0.1.{rank}/24"] for rank in range(1, 5)]
    assert (cluster.tensor_parallel, cluster.pipeline_parallel, cluster.master_addr) == (4, 1, "10.0.0.1")


def test_the_pair_keeps_its_roles_and_the_direct_topology(tmp_path):
    text = lab_site(tmp_path, 2, "direct").read_text()
    assert 'role = "head"' in text and 'role = "worker"' in text and "topology" not in text
    cluster = load_site(tmp_path / "lab-2.toml")
    assert cluster.topology == "direct" and [node.hostname for node in cluster.nodes] == ["spark-head", "spark-worker"]


@pytest.mark.parametrize(("nodes", "topology", "message"), [
    (4, "direct", "4 nodes: a direct topology has exactly 2"),
    (1, "switch", "1 nodes: a direct topology has exactly 2 (one cable); a switch takes 2 or more"),
    (4, "mesh", "topology 'mesh': use one of direct, switch"),
])
def test_a_shape_the_lab_cannot_build_is_refused(nodes, topology, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Lab("f0", nodes, topology)
