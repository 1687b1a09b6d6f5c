"""The readiness checks as pure functions of the facts: what each failure says and suggests."""

from types import SimpleNamespace

import pytest

from checks import FAIL, PASS, WARN
from checks.fabric import active_ports_elsewhere, controller_of
from checks.node import node_checks, unreachable
from checks.table import render

RAILS = [{"netdev": "enp1s0f0np0", "rdma": "rocep1s0f0", "address": "10.0.0.1", "cidr": "10.0.0.1/24", "gid_index": "auto"},
         {"netdev": "enP2p1s0f0np0", "rdma": "roceP2p1s0f0", "address": "10.0.1.1", "cidr": "10.0.1.1/24", "gid_index": "auto"}]
PEER_RAILS = [{**RAILS[0], "address": "10.0.0.2", "cidr": "10.0.0.2/24"}, {**RAILS[1], "address": "10.0.1.2", "cidr": "10.0.1.2/24"}]
TAG = "dual-spark/lab-cpu:f24f0f86b830"
MODEL = {"path": "/srv/lab-models/tiny-llama", "served_name": "tiny"}
DATA = SimpleNamespace(rails=RAILS, peer_rails=PEER_RAILS, fabric_mtu=9000, expected_link_speed_mbps=200000,
                       memory_floor_gib=95, deploy_user="spark", role="worker", profile="adaptive",
                       profiles={"adaptive": {"image": "lab-cpu"}}, images={"lab-cpu": {"tag": TAG}}, model=MODEL)
IMAGE_ID, DIGEST = "sha256:" + "5e" * 32, "e8" * 32


def port(state, netdev, ipv4=None):
    gids = [{"index": 3, "gid": "x", "type": "RoCE v2", "netdev": netdev, "ipv4": ipv4}] if ipv4 else []
    return {"netdevs": [netdev], "ports": {"1": {"state": state, "phys_state": "LinkUp" if state == "ACTIVE" else "Disabled",
                                                "rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet", "gids": gids}}}


def ok(**value):
    return {**value, "unreadable": []}


def healthy() -> dict:
    link = {"operstate": "up", "speed_mbps": 200000, "mtu": 9000, "ipv6": []}
    return {
        "links": ok(links={"enp1s0f0np0": {**link, "ipv4": ["10.0.0.1/24"]}, "enP2p1s0f0np0": {**link, "ipv4": ["10.0.1.1/24"]},
                           "enp1s0f1np1": {**link, "operstate": "down", "speed_mbps": None, "mtu": 1500, "ipv4": []}}),
        "rdma": ok(devices={"rocep1s0f0": port("ACTIVE", "enp1s0f0np0", "10.0.0.1"),
                            "roceP2p1s0f0": port("ACTIVE", "enP2p1s0f0np0", "10.0.1.1"), "rocep1s0f1": port("DOWN", "enp1s0f1np1")}),
        "pings": [ok(sent=3, received=3, error=None)] * 2,
        "memlock": ok(limit="unlimited"), "userns": ok(value=0),
        "identity": ok(etc="a" * 32, dbus=None, dbus_is_link=False, hostname="spark-worker"),
        "host_keys": ok(fingerprints={"ED25519": "SHA256:mine"}),
        "user": ok(exists=True, uid=1000, groups=["docker"]), "docker": "/usr/bin/docker",
        "memory": ok(source="/proc/meminfo", gpus=["NVIDIA GB10"], total_gib=121.6, available_gib=117.4, nvidia_smi="ok"),
        "ssh_to_peer": [], "unreadable": [],
        "image": ok(id=IMAGE_ID, smoke_tested=IMAGE_ID),
        "model": ok(exists=True, free_bytes=1 << 40, manifest=None, verified=DIGEST, changed=[], token_mode=None),
        "serving": ok(compose=["services:", "  vllm:", "    labels:", '      dual-spark.stack: "9d2e0c1a"'], launch=["#!/bin/sh"], api_key=False, rdma=ok(devices={}),
                      container={"id": "4f1c", "status": "running", "started": "2026-11-29T20:01:02.512Z", "restarts": 0,
                                 "stack": "9d2e0c1a", "profile": "adaptive", "image": IMAGE_ID, "health": ""}),
        "api": None, "listening": [],
    }


PEER = {**healthy(), "identity": ok(etc="b" * 32, dbus=None, dbus_is_link=False, hostname="spark-head"),
        "host_keys": ok(fingerprints={"ED25519": "SHA256:theirs"}),
        "model": ok(exists=True, free_bytes=1 << 40, verified=None, changed=[], token_mode=None,
                    manifest={"digest": DIGEST, "files": 6, "bytes": 706289, "source": {"path": MODEL["path"]}})}


def checks_with(**changes):
    facts = healthy()
    facts.update(changes)
    return {check.item: check for check in node_checks("spark-worker", DATA, facts, "spark-head", PEER)}


def test_a_healthy_node_passes_everything():
    checks = checks_with()
    assert {check.status for check in checks.values()} == {PASS}
    assert checks["rail 0 rocep1s0f0 RoCE"].detail == "ACTIVE, 200 Gb/sec (4X HDR), RoCE v2 GID index 3"
    assert "readiness: 16 of 16 checks pass" in render(list(checks.values()))


@pytest.mark.parametrize("changes, item, detail, fix", [
    ({"memlock": ok(limit="8192")}, "memlock (fresh login)", "8192 KiB", "OpenSSH"),
    ({"memlock": ok(limit=None)}, "memlock (fresh login)", "could not be read", "OpenSSH"),
    ({"userns": ok(value=1)}, "userns sysctl", "= 1", "sysctl -w"),
    ({"identity": ok(etc="b" * 32, dbus=None, dbus_is_link=False, hostname="x")}, "machine id", "also spark-head's", "reboot the worker"),
    ({"docker": None}, "docker", "docker not found", "install Docker"),
    ({"user": ok(exists=True, uid=1000, groups=[])}, "docker", "not in the docker group", "run the deploy"),
    ({"user": ok(exists=True, uid=1001, groups=["docker"])}, "deploy user", "here 1001, spark-head 1000", "same uid"),
    ({"memory": ok(source="nvidia-smi", gpus=["NVIDIA H100"], total_gib=79.6, available_gib=40.0, nvidia_smi="ok")},
     "GPU memory", "40.0 GiB available of 79.6 (nvidia-smi, NVIDIA H100), floor 95", "memory_floor_gib"),
    ({"memory": ok(source="/proc/meminfo", gpus=[], total_gib=121.6, available_gib=117.4,
                   nvidia_smi="Failed to initialize NVML: Driver/library version mismatch")},
     "GPU driver", "nvidia-smi: Failed to initialize NVML: Driver/library version mismatch", "reboot this node"),
    ({"memory": ok(source="/proc/meminfo", gpus=[], total_gib=121.6, available_gib=117.4, nvidia_smi="No devices were found")},
     "GPU driver", "No devices were found", "nvidia-smi -L"),
    ({"pings": [ok(sent=3, received=0, error="local error: message too long, mtu=1500")] * 2},
     "rail 1 jumbo ping", "fails (local error: message too long, mtu=1500)", "set MTU 9000 on both ends of rail 1"),
    ({"links": ok(links={})}, "rail 0 enp1s0f0np0 link", "no such netdev", "ip -br link"),
    ({"image": ok(id=None, smoke_tested=None)}, f"runtime image {TAG}", "not on this node", "run the deploy again"),
    ({"image": ok(id=IMAGE_ID, smoke_tested=None)}, f"runtime image {TAG}", "has not passed its smoke test", "import vllm"),
    ({"image": ok(id="sha256:" + "a1" * 32, smoke_tested="sha256:" + "a1" * 32)}, f"runtime image {TAG}",
     "sha256:a1a1a1a1a1a1 here, sha256:5e5e5e5e5e5e on spark-head", "it sends what the worker lacks"),
    ({"model": ok(exists=True, free_bytes=1, manifest=None, verified=None, changed=[], token_mode=None)}, "model copy",
     "not verified against the head's manifest", "run the deploy again"),
    ({"model": ok(exists=True, free_bytes=1, manifest=None, verified=DIGEST, changed=["model.safetensors"], token_mode=None)},
     "model copy", "1 file(s) changed since verified: model.safetensors", "only what differs moves"),
    ({"serving": ok(compose=None, launch=None, container=None, api_key=False, rdma=ok(devices={}))}, "vLLM stack",
     "no stack installed", "tasks/serving.py installs it"),
    ({"serving": {**healthy()["serving"], "container": {**healthy()["serving"]["container"], "status": "exited", "restarts": 3}}},
     "vLLM stack", "container exited (restarted 3 times)", "docker logs --tail 50 dual-spark-vllm"),
    ({"serving": {**healthy()["serving"], "container": {**healthy()["serving"]["container"], "profile": "fast", "stack": "0ld"}}},
     "vLLM stack", "runs stack 0ld (fast), installed 9d2e0c1a (adaptive)", "restarts the pair on the installed stack"),
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


def test_a_gpu_memory_reading_after_an_nvml_error_says_where_it_came_from():
    memory = ok(source="/proc/meminfo", gpus=[], total_gib=121.6, available_gib=117.4, nvidia_smi="No devices were found")
    check = checks_with(memory=memory)["GPU memory"]
    assert check.status == PASS and check.detail == "117.4 GiB available of 121.6 (/proc/meminfo, nvidia-smi failed)"


def test_an_unreadable_line_is_reported_not_dropped():
    facts = {**healthy(), "userns": {"value": None, "unreadable": ["sysctl: permission denied on key"]}}
    checks = {c.item: c for c in node_checks("spark-worker", DATA, facts, "spark-head", PEER)}
    assert checks["reading userns"].status == WARN and "sysctl: permission denied on key" in checks["reading userns"].detail


def test_an_unreachable_peer_is_named_and_its_rows_point_there():
    facts = {**healthy(), "ssh_to_peer": [ok(ok=False)] * 2}
    data = SimpleNamespace(**{**vars(DATA), "role": "head"})
    checks = {c.item: c for c in node_checks("spark-head", data, facts, "spark-worker", None)}
    assert checks["SSH to spark-worker at 10.0.0.2"].detail == "spark-worker does not answer"
    assert "deploy user" not in checks and "SSH host keys" not in checks
    row = unreachable("spark-worker", "192.168.1.11", 22)
    assert row.status == FAIL and "192.168.1.11:22" in row.detail and "sshd" in row.fix


def test_the_heads_model_row_reads_its_manifest():
    data = SimpleNamespace(**{**vars(DATA), "role": "head"})
    checks = {c.item: c for c in node_checks("spark-head", data, PEER, "spark-worker", healthy())}
    assert checks["model"].status == PASS and checks["model"].detail == f"6 files, 0.00 GiB, manifest {DIGEST[:12]}"
    other = SimpleNamespace(**{**vars(data), "model": {"repo": "org/name", "revision": "0" * 40}})
    checks = {c.item: c for c in node_checks("spark-head", other, PEER, "spark-worker", healthy())}
    assert checks["model"].status == FAIL and checks["model"].detail == "not fetched for this source"


def api_checks_for(api: dict, listening: list[str]) -> dict:
    data = SimpleNamespace(**{**vars(DATA), "role": "head", "api_host": "127.0.0.1", "api_port": 8888})
    facts = {**healthy(), "api": api, "listening": listening}
    return {c.item: c for c in node_checks("spark-head", data, facts, "spark-worker", PEER)}


def test_the_api_rows_say_whether_a_token_came_back_and_where_it_listens():
    checks = api_checks_for({"ok": True, "model": "tiny", "max_model_len": 512, "error": None}, ["127.0.0.1"])
    assert checks["API"].status == PASS and checks["API"].detail == "generates tokens at 127.0.0.1:8888 as tiny (max model len 512)"
    assert checks["API exposure"].status == PASS
    dead = {"ok": False, "model": "tiny", "max_model_len": 512,
            "error": "generating one token failed with 500: EngineCore encountered an issue"}
    checks = api_checks_for(dead, ["127.0.0.1", "198.51.100.11"])
    assert checks["API"].status == FAIL and "EngineCore" in checks["API"].detail and "worker first" in checks["API"].fix
    assert checks["API exposure"].status == FAIL and "198.51.100.11" in checks["API exposure"].detail
