"""The readiness checks as pure functions of the facts: what each failure says and suggests."""

import pytest

from checks import FAIL, PASS, WARN
from checks.fabric import active_ports_elsewhere, controller_of
from checks.node import node_checks, unreachable
from checks.table import render
from tests.fake_host import site

PAIR = site("lab-pair")  # rail i of rank r at 10.0.i.(r+1), as healthy() reads it
TAG = PAIR.image.tag
IMAGE_ID, DIGEST = "sha256:" + "5e" * 32, "e8" * 32


def port(state, netdev, ipv4=None):
    gids = [{"index": 3, "gid": "x", "type": "RoCE v2", "netdev": netdev, "ipv4": ipv4}] if ipv4 else []
    return {"netdevs": [netdev], "ports": {"1": {"state": state, "phys_state": "LinkUp" if state == "ACTIVE" else "Disabled",
                                                "rate": "200 Gb/sec (4X HDR)", "link_layer": "Ethernet", "gids": gids}}}


def ok(**value):
    return {**value, "unreadable": []}


def healthy(rank: int = 1, others: int = 1, ssh: int = 0) -> dict:
    """The readings of the node of ``rank`` (rails at 10.0.i.(rank+1)) that pings ``others`` nodes
    and logs in at ``ssh`` addresses, all passing."""
    link = {"operstate": "up", "speed_mbps": 200000, "mtu": 9000, "ipv6": []}
    mine = [f"10.0.0.{rank + 1}", f"10.0.1.{rank + 1}"]
    return {
        "links": ok(links={"enp1s0f0np0": {**link, "ipv4": [f"{mine[0]}/24"]}, "enP2p1s0f0np0": {**link, "ipv4": [f"{mine[1]}/24"]},
                           "enp1s0f1np1": {**link, "operstate": "down", "speed_mbps": None, "mtu": 1500, "ipv4": []}}),
        "rdma": ok(devices={"rocep1s0f0": port("ACTIVE", "enp1s0f0np0", mine[0]),
                            "roceP2p1s0f0": port("ACTIVE", "enP2p1s0f0np0", mine[1]), "rocep1s0f1": port("DOWN", "enp1s0f1np1")}),
        "pings": [ok(sent=3, received=3, error=None)] * (2 * others),
        "memlock": ok(limit="unlimited"), "userns": ok(value=0),
        "identity": ok(etc=f"{rank:x}" * 32, dbus=None, dbus_is_link=False, hostname=f"spark-{rank}"),
        "host_keys": ok(fingerprints={"ED25519": f"SHA256:node{rank}"}),
        "user": ok(exists=True, uid=1000, groups=["docker"]), "docker": "/usr/bin/docker",
        "memory": ok(source="/proc/meminfo", gpus=["NVIDIA GB10"], total_gib=121.6, available_gib=117.4, nvidia_smi="ok"),
        "ssh_to": [ok(ok=True)] * ssh, "unreadable": [],
        "image": ok(id=IMAGE_ID, smoke_tested=IMAGE_ID),
        "model": ok(exists=True, free_bytes=1 << 40, manifest=None, verified=DIGEST, changed=[], token=None),
        "serving": ok(compose=["services:", "  vllm:", "    labels:", '      dual-spark.stack: "9d2e0c1a"'], launch=["#!/bin/sh"], api_key=False, rdma=ok(devices={}),
                      container={"id": "4f1c", "status": "running", "started": "2026-11-29T20:01:02.512Z", "restarts": 0,
                                 "stack": "9d2e0c1a", "profile": "adaptive", "image": IMAGE_ID, "health": ""}),
        "api": None, "listening": [],
    }


def head_reading(others: int = 1) -> dict:
    return {**healthy(0, others, 2 * others),
            "model": ok(exists=True, free_bytes=1 << 40, verified=None, changed=[], token=None,
                        manifest={"digest": DIGEST, "files": 6, "bytes": 706289, "source": PAIR.model.source})}


PEER = head_reading()


def rows(name: str, cluster, readings: dict) -> dict:
    return {check.item: check for check in node_checks(name, cluster, readings)}


def checks_with(**changes):
    return rows("spark-worker", PAIR, {"spark-head": PEER, "spark-worker": {**healthy(), **changes}})


def test_a_healthy_node_passes_everything():
    checks = checks_with()
    assert {check.status for check in checks.values()} == {PASS}
    assert checks["rail 0 rocep1s0f0 RoCE"].detail == "ACTIVE, 200 Gb/sec (4X HDR), RoCE v2 GID index 3"
    assert "readiness: 16 of 16 checks pass" in render(list(checks.values()))


@pytest.mark.parametrize("changes, item, detail, fix", [
    ({"memlock": ok(limit="8192")}, "memlock (fresh login)", "8192 KiB", "OpenSSH"),
    ({"memlock": ok(limit=None)}, "memlock (fresh login)", "could not be read", "OpenSSH"),
    ({"userns": ok(value=1)}, "userns sysctl", "= 1", "sysctl -w"),
    ({"identity": ok(etc="0" * 32, dbus=None, dbus_is_link=False, hostname="x")}, "machine id", "also spark-head's", "reboot that worker"),
    ({"identity": ok(etc=None, dbus=None, dbus_is_link=False, hostname="x")}, "machine id", "none", "systemd-machine-id-setup"),
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
     "rail 1 jumbo ping to spark-head", "8972-byte DF ping to 10.0.1.1 fails (local error: message too long, mtu=1500)",
     "set MTU 9000 on rail 1 of spark-worker and spark-head (`ip link show`"),
    ({"links": ok(links={**healthy()["links"]["links"], "enp1s0f0np0": {**healthy()["links"]["links"]["enp1s0f0np0"], "speed_mbps": 100000}})},
     "rail 0 enp1s0f0np0 link", "100000 Mb/s, expected 200000", "reseat or replace the QSFP cable"),
    ({"links": ok(links={})}, "rail 0 enp1s0f0np0 link", "no such netdev", "ip -br link"),
    ({"image": ok(id=None, smoke_tested=None)}, f"runtime image {TAG}", "not on this node", "run the deploy again"),
    ({"image": ok(id=IMAGE_ID, smoke_tested=None)}, f"runtime image {TAG}", "has not passed its smoke test", "import vllm"),
    ({"image": ok(id="sha256:" + "a1" * 32, smoke_tested="sha256:" + "a1" * 32)}, f"runtime image {TAG}",
     "sha256:a1a1a1a1a1a1 here, sha256:5e5e5e5e5e5e on spark-head", "it sends what a worker lacks"),
    ({"model": ok(exists=True, free_bytes=1, manifest=None, verified=None, changed=[], token=None)}, "model copy",
     "not verified against the head's manifest", "run the deploy again"),
    ({"model": ok(exists=True, free_bytes=1, manifest=None, verified=DIGEST, changed=["model.safetensors"], token=None)},
     "model copy", "1 file(s) changed since verified: model.safetensors", "only what differs moves"),
    ({"serving": ok(compose=None, launch=None, container=None, api_key=False, rdma=ok(devices={}))}, "vLLM stack",
     "no stack installed", "tasks/serving.py installs it"),
    ({"serving": {**healthy()["serving"], "container": {**healthy()["serving"]["container"], "status": "exited", "restarts": 3}}},
     "vLLM stack", "container exited (restarted 3 times)", "docker logs --tail 50 dual-spark-vllm"),
    ({"serving": {**healthy()["serving"], "container": {**healthy()["serving"]["container"], "profile": "fast", "stack": "0ld"}}},
     "vLLM stack", "runs stack 0ld (fast), installed 9d2e0c1a (adaptive)", "restarts every node on the installed stack"),
])
def test_each_failure_names_the_problem_and_the_fix(changes, item, detail, fix):
    check = checks_with(**changes)[item]
    assert check.status == FAIL and detail in check.detail and fix in check.fix


def test_a_pinned_gid_index_that_moved_is_caught():
    pinned = site("lab-pair", tables={"node": {"1": {"rail": {"0": {"gid_index": 5}}}}})
    check = rows("spark-worker", pinned, {"spark-head": PEER, "spark-worker": healthy()})["rail 0 rocep1s0f0 RoCE"]
    assert check.status == FAIL and "index 3, site.toml pins 5" in check.detail and "gid_index = 3" in check.fix


def test_shared_host_keys_warn_without_failing():
    checks = checks_with(host_keys=PEER["host_keys"])
    assert checks["SSH host keys"].status == WARN and "dpkg-reconfigure openssh-server" in checks["SSH host keys"].fix
    assert checks["SSH host keys"].detail == "ED25519 shared with spark-head (cloned image)"


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
    checks = checks_with(userns={"value": None, "unreadable": ["sysctl: permission denied on key"]})
    assert checks["reading userns"].status == WARN and "sysctl: permission denied on key" in checks["reading userns"].detail


def test_an_unreachable_worker_is_named_and_its_rows_point_there():
    facts = {**PEER, "ssh_to": [ok(ok=False)] * 2}
    checks = rows("spark-head", PAIR, {"spark-head": facts, "spark-worker": None})
    assert checks["SSH to spark-worker at 10.0.0.2"].detail == "spark-worker does not answer"
    assert checks["machine id"].detail == f"{'0' * 32} (spark-worker not read)"
    assert "deploy user" not in checks and "SSH host keys" not in checks
    row = unreachable("spark-worker", "192.168.1.11", 22)
    assert row.status == FAIL and "192.168.1.11:22" in row.detail and "sshd" in row.fix


def test_the_heads_model_row_reads_its_manifest():
    readings = {"spark-head": PEER, "spark-worker": healthy()}
    checks = rows("spark-head", PAIR, readings)
    assert checks["model"].status == PASS and checks["model"].detail == f"6 files, 0.00 GiB, manifest {DIGEST[:12]}"
    assert checks[f"runtime image {TAG}"].detail == f"{IMAGE_ID[:19]}, smoke-tested"
    other = site("pair", tables={"model": {"repo": "org/name", "revision": "0" * 40}})
    checks = rows("spark-head", other, readings)
    assert checks["model"].status == FAIL and checks["model"].detail == "not fetched for this source"


def api_checks_for(api: dict, listening: list[str]) -> dict:
    return rows("spark-head", PAIR, {"spark-head": {**PEER, "api": api, "listening": listening}, "spark-worker": healthy()})


def test_the_api_rows_say_whether_a_token_came_back_and_where_it_listens():
    checks = api_checks_for({"ok": True, "model": "tiny", "max_model_len": 512, "error": None}, ["127.0.0.1"])
    assert checks["API"].status == PASS and checks["API"].detail == "generates tokens at 127.0.0.1:8888 as tiny (max model len 512)"
    assert checks["API exposure"].status == PASS
    dead = {"ok": False, "model": "tiny", "max_model_len": 512,
            "error": "generating one token failed with 500: EngineCore encountered an issue"}
    checks = api_checks_for(dead, ["127.0.0.1", "198.51.100.11"])
    assert checks["API"].status == FAIL and "EngineCore" in checks["API"].detail and "workers first" in checks["API"].fix
    assert checks["API exposure"].status == FAIL and "198.51.100.11" in checks["API exposure"].detail


def test_an_api_busy_with_a_long_request_warns_and_one_that_stands_still_fails():
    """fast serves one request at a time: the probe waits behind a long one and gets no token in
    time. The engine moving meanwhile (health's busy) is a warning; standing still, a failure."""
    timed_out = {"ok": False, "model": "tiny", "max_model_len": 512, "error": "no answer at http://127.0.0.1:8888: timed out"}
    busy = api_checks_for({**timed_out, "busy": {"running": 1, "waiting": 0}}, ["127.0.0.1"])["API"]
    assert busy.status == WARN and "1 running and 0 waiting" in busy.detail and "timed out" in busy.detail
    assert "again when it is idle" in busy.fix
    assert api_checks_for({**timed_out, "busy": None}, ["127.0.0.1"])["API"].status == FAIL


FOUR = site("lab-four")


def four_readings(**changes) -> dict:
    """Every node of FOUR healthy (the head with the manifest, each worker logging in to the next);
    ``changes`` by node name."""
    readings = {"spark-head": head_reading(3)}
    readings |= {node.hostname: healthy(node.rank, 3, 2 if node.rank < 3 else 0) for node in FOUR.workers}
    return {name: {**reading, **changes.get(name.replace("-", "_"), {})} for name, reading in readings.items()}


def four_rows(name: str, readings: dict) -> dict:
    return rows(name, FOUR, readings)


def test_four_healthy_nodes_pass_and_each_pings_every_other_on_every_rail():
    readings = four_readings()
    for node in FOUR.nodes:
        checks = four_rows(node.hostname, readings)
        assert {check.status for check in checks.values()} == {PASS}, node.hostname
        pings = [item for item in checks if "jumbo ping" in item]
        assert pings == [f"rail {i} jumbo ping to {other.hostname}" for i in (0, 1) for other in FOUR.others(node.hostname)]
    head = four_rows("spark-head", readings)
    assert [item for item in head if item.startswith("SSH to")] == [
        f"SSH to spark-worker{rank} at 10.0.{rail}.{rank + 1}" for rank in (1, 2, 3) for rail in (0, 1)]
    assert head["machine id"].detail == f"{'0' * 32}, distinct from spark-worker1, spark-worker2, spark-worker3"
    assert head["deploy user"].detail == "spark uid 1000 on every node"
    assert [item for item in four_rows("spark-worker1", readings) if item.startswith("SSH to")] == [
        "SSH to spark-worker2 at 10.0.0.3", "SSH to spark-worker2 at 10.0.1.3"]
    assert not [item for item in four_rows("spark-worker3", readings) if item.startswith("SSH to")]
    assert four_rows("spark-worker2", readings)[f"runtime image {TAG}"].detail == f"{IMAGE_ID[:19]}, the same as spark-head's, smoke-tested"


def test_a_rail_one_node_cannot_reach_fails_only_there_naming_the_other():
    pings = [ok(sent=3, received=3, error=None)] * 6
    pings[4] = ok(sent=3, received=0, error=None)  # rail 1, the second other node: spark-worker2
    readings = four_readings(spark_worker1={"pings": pings})
    checks = four_rows("spark-worker1", readings)
    failed = [check for check in checks.values() if check.status == FAIL]
    assert [check.item for check in failed] == ["rail 1 jumbo ping to spark-worker2"]
    assert failed[0].detail == "8972-byte DF ping to 10.0.1.3 fails (no reply)"
    assert "spark-worker1 and spark-worker2 and on the switch" in failed[0].fix
    assert {check.status for check in four_rows("spark-worker2", readings).values()} == {PASS}


def test_a_switch_port_left_at_100g_is_a_fail_whose_fix_is_on_the_switch():
    links = healthy(3)["links"]["links"]
    readings = four_readings(spark_worker3={"links": ok(links={**links, "enp1s0f0np0": {**links["enp1s0f0np0"], "speed_mbps": 100000}})})
    check = four_rows("spark-worker3", readings)["rail 0 enp1s0f0np0 link"]
    assert check.status == FAIL and check.detail.startswith("100000 Mb/s, expected 200000")
    assert check.fix == "force 200G, auto-negotiation off on the switch port (and MTU 9000 on the switch)"


def test_any_two_nodes_with_one_machine_id_fail_naming_each_other():
    same = ok(etc="c" * 32, dbus=None, dbus_is_link=False, hostname="x")
    readings = four_readings(spark_worker1={"identity": same}, spark_worker3={"identity": same})
    assert four_rows("spark-worker1", readings)["machine id"].detail == f"{'c' * 32} is also spark-worker3's"
    assert four_rows("spark-worker3", readings)["machine id"].detail == f"{'c' * 32} is also spark-worker1's"
    assert four_rows("spark-head", readings)["machine id"].status == PASS
    assert four_rows("spark-worker2", readings)["machine id"].status == PASS
    cloned = four_readings(spark_worker1={"host_keys": PEER["host_keys"]}, spark_worker3={"host_keys": PEER["host_keys"]})
    assert four_rows("spark-head", cloned)["SSH host keys"].detail == "ED25519 shared with spark-worker1, spark-worker3 (cloned image)"


def test_a_worker_reads_the_image_against_the_heads_and_the_uid_against_every_node():
    other = "sha256:" + "a1" * 32
    readings = four_readings(spark_worker2={"image": ok(id=other, smoke_tested=other), "user": ok(exists=True, uid=1001, groups=["docker"])})
    image = four_rows("spark-worker2", readings)[f"runtime image {TAG}"]
    assert image.status == FAIL and image.detail == f"{other[:19]} here, {IMAGE_ID[:19]} on spark-head"
    assert four_rows("spark-worker3", readings)[f"runtime image {TAG}"].status == PASS
    user = four_rows("spark-head", readings)["deploy user"]
    assert user.status == FAIL and user.detail == "spark: here 1000, spark-worker2 1001"
    unread = four_readings()
    unread["spark-head"] = None
    image = four_rows("spark-worker1", unread)[f"runtime image {TAG}"]
    assert image.status == PASS and image.detail.endswith("(spark-head not read)")
