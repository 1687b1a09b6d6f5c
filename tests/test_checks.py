"""The readiness checks as pure functions of the facts: what each failure says and suggests."""

from types import SimpleNamespace

import pytest

from operations.verify import FAIL, PASS, WARN, active_ports_elsewhere, controller_of, node_checks, render_table

RAILS = [{"netdev": "enp1s0f0np0", "rdma": "rocep1s0f0", "address": "10.0.0.1", "cidr": "10.0.0.1/24", "gid_index": "auto"},
         {"netdev": "enP2p1s0f0np0", "rdma": "roceP2p1s0f0", "address": "10.0.1.1", "cidr": "10.0.1.1/24", "gid_index": "auto"}]
PEER_RAILS = [{**RAILS[0], "address": "10.0.0.2", "cidr": "10.0.0.2/24"}, {**RAILS[1], "address": "10.0.1.2", "cidr": "10.0.1.2/24"}]
DATA = SimpleNamespace(rails=RAILS, peer_rails=PEER_RAILS, fabric_mtu=9000, expected_link_speed_mbps=200000,
                       memory_floor_gib=95, deploy_user="spark", role="worker")


def port(state, netdev, ipv4=None):
    gids = [{"index": 3, "gid": "x", "type": "RoCE v2", "netdev": netdev, "ipv4": ipv4}] if ipv4 else []
    return {"netdevs": [netdev], "ports": {"1": {"state": state, "phys_state": "LinkUp" if state == "ACTIVE" else "Disabled",
                                                "rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet", "gids": gids}}}


def healthy() -> dict:
    link = {"operstate": "up", "speed_mbps": 200000, "mtu": 9000, "ipv6": []}
    return {
        "links": {"enp1s0f0np0": {**link, "ipv4": ["10.0.0.1/24"]}, "enP2p1s0f0np0": {**link, "ipv4": ["10.0.1.1/24"]},
                  "enp1s0f1np1": {**link, "operstate": "down", "speed_mbps": None, "mtu": 1500, "ipv4": []}},
        "rdma": {"rocep1s0f0": port("ACTIVE", "enp1s0f0np0", "10.0.0.1"), "roceP2p1s0f0": port("ACTIVE", "enP2p1s0f0np0", "10.0.1.1"),
                 "rocep1s0f1": port("DOWN", "enp1s0f1np1")},
        "pings": [{"sent": 3, "received": 3, "error": None}] * 2,
        "memlock": "unlimited", "userns": 0, "machine_id": "a" * 32, "host_keys": {"ED25519": "SHA256:mine"},
        "user": {"uid": 1000, "groups": ["docker"]}, "docker": "/usr/bin/docker",
        "memory": {"source": "/proc/meminfo", "gpus": ["NVIDIA GB10"], "total_gib": 121.6, "available_gib": 117.4},
        "ssh_to_peer": [],
    }


PEER = {**healthy(), "machine_id": "b" * 32, "host_keys": {"ED25519": "SHA256:theirs"}}


def checks_with(**changes):
    facts = healthy()
    facts.update(changes)
    return {check.item: check for check in node_checks("spark-worker", DATA, facts, "spark-head", PEER)}


def test_a_healthy_node_passes_everything():
    checks = checks_with()
    assert {check.status for check in checks.values()} == {PASS}
    assert checks["rail 0 rocep1s0f0 RoCE"].detail == "ACTIVE, 200 Gb/sec (4X HDR), RoCE v2 GID index 3"
    assert "readiness: 13 of 13 checks pass" in render_table(list(checks.values()))


@pytest.mark.parametrize("changes, item, detail, fix", [
    ({"memlock": "8192"}, "memlock (fresh login)", "8192 KiB", "OpenSSH"),
    ({"userns": 1}, "userns sysctl", "= 1", "sysctl -w"),
    ({"machine_id": "b" * 32}, "machine id", "also spark-head's", "reboot the worker"),
    ({"docker": None}, "docker", "docker not found", "install Docker"),
    ({"user": {"uid": 1000, "groups": []}}, "docker", "not in the docker group", "run the deploy"),
    ({"user": {"uid": 1001, "groups": ["docker"]}}, "deploy user", "here 1001, spark-head 1000", "same uid"),
    ({"memory": {"source": "nvidia-smi", "gpus": ["NVIDIA H100"], "total_gib": 79.6, "available_gib": 40.0}},
     "GPU memory", "40.0 GiB available of 79.6 (nvidia-smi, NVIDIA H100), floor 95", "memory_floor_gib"),
    ({"pings": [{"sent": 3, "received": 0, "error": "local error: message too long, mtu=1500"}] * 2},
     "rail 1 jumbo ping", "fails (local error: message too long, mtu=1500)", "set MTU 9000 on both ends of rail 1"),
])
def test_each_failure_names_the_problem_and_the_fix(changes, item, detail, fix):
    check = checks_with(**changes)[item]
    assert check.status == FAIL and detail in check.detail and fix in check.fix


def test_a_pinned_gid_index_that_moved_is_caught():
    data = SimpleNamespace(**{**vars(DATA), "rails": [{**RAILS[0], "gid_index": 5}, RAILS[1]]})
    checks = {c.item: c for c in node_checks("spark-worker", data, healthy(), "spark-head", PEER)}
    check = checks["rail 0 rocep1s0f0 RoCE"]
    assert check.status == FAIL and "index 3, site.toml pins 5" in check.detail and "gid_index = 3" in check.fix


def test_shared_host_keys_warn_without_failing():
    facts = {**healthy(), "host_keys": PEER["host_keys"]}
    checks = {c.item: c for c in node_checks("spark-worker", DATA, facts, "spark-head", PEER)}
    assert checks["SSH host keys"].status == WARN and "dpkg-reconfigure openssh-server" in checks["SSH host keys"].fix


def test_the_cable_in_the_other_port_is_pointed_at_on_the_same_controller():
    rdma = {"rocep1s0f0": port("DOWN", "enp1s0f0np0"), "rocep1s0f1": port("ACTIVE", "enp1s0f1np1"),
            "roceP2p1s0f0": port("DOWN", "enP2p1s0f0np0"), "roceP2p1s0f1": port("ACTIVE", "enP2p1s0f1np1")}
    configured = {"enp1s0f0np0", "enP2p1s0f0np0"}
    assert active_ports_elsewhere(rdma, configured, "enp1s0f0np0") == ["rocep1s0f1"]
    assert active_ports_elsewhere(rdma, configured, "enP2p1s0f0np0") == ["roceP2p1s0f1"]
    assert active_ports_elsewhere(rdma, configured, "enp9s0f0np0") == ["roceP2p1s0f1", "rocep1s0f1"]
    assert controller_of("enP2p1s0f1np1") == "enP2p1s0"
