"""The netplan template renders files that the real `netplan generate` accepts, and the
networkd configuration it generates carries exactly the rails' addresses and MTU."""

import hashlib
import ipaddress
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from operations.fabric import render_netplan
from site_config import Rail
from tests.fake_host import site, with_settings

NETPLAN = shutil.which("netplan") or "/usr/sbin/netplan"
PAIR_NETPLAN_SHA256 = "3b37fadd354fb0c762845b5312dd24cb2139f12c6462718175854e3e021503ff"  # the pair's file before the cluster


def rails(*specs):
    return [Rail(netdev, rdma, ipaddress.IPv4Interface(cidr)).as_data() for netdev, rdma, cidr in specs]


def generate(tmp_path: Path, yaml: str) -> subprocess.CompletedProcess:
    netplan_dir = tmp_path / "etc/netplan"
    netplan_dir.mkdir(parents=True)
    (netplan_dir / "40-dual-spark.yaml").write_text(yaml)
    (netplan_dir / "40-dual-spark.yaml").chmod(0o600)
    return subprocess.run([NETPLAN, "generate", "--root-dir", str(tmp_path)], capture_output=True, text=True)


def networkd(tmp_path: Path, netdev: str) -> str:
    return (tmp_path / f"run/systemd/network/10-netplan-{netdev}.network").read_text()


@pytest.mark.parametrize("mtu", [9000, 1500])
def test_two_rails_generate_for_networkd(tmp_path, mtu):
    yaml = render_netplan("spark-head", ["spark-worker"], rails(
        ("enp1s0f0np0", "rocep1s0f0", "10.0.0.1/24"), ("enP2p1s0f0np0", "roceP2p1s0f0", "10.0.1.1/24")), mtu)
    result = generate(tmp_path, yaml)
    assert result.returncode == 0, result.stderr
    for netdev, address in (("enp1s0f0np0", "10.0.0.1/24"), ("enP2p1s0f0np0", "10.0.1.1/24")):
        unit = networkd(tmp_path, netdev)
        assert f"Name={netdev}" in unit
        assert f"Address={address}" in unit
        assert f"MTUBytes={mtu}" in unit
        assert "DHCP" not in unit.replace("LinkLocal", "")
    assert sorted(p.name for p in (tmp_path / "run/systemd/network").glob("*.network")) == [
        "10-netplan-enP2p1s0f0np0.network", "10-netplan-enp1s0f0np0.network"]


def test_a_pair_file_is_what_it_was_before_the_cluster():
    """A two-node site converges to the same netplan file byte for byte (the one the pair's deploy
    wrote before the cluster model; its digest pinned)."""
    yaml = render_netplan("spark-head", ["spark-worker"], rails(
        ("enp1s0f0np0", "rocep1s0f0", "10.0.0.1/24"), ("enP2p1s0f0np0", "roceP2p1s0f0", "10.0.1.1/24")), 9000)
    assert yaml.splitlines()[1] == "# The QSFP fabric of spark-head to spark-worker: one subnet per rail, no DHCP, jumbo frames."
    assert hashlib.sha256(yaml.encode()).hexdigest() == PAIR_NETPLAN_SHA256


def test_four_nodes_through_a_switch_generate_for_networkd(tmp_path):
    """Each of four nodes on the switch subnets (one per rail) gets a file netplan accepts, naming
    the other three; its networkd units carry its own addresses only."""
    names = ["spark-1", "spark-2", "spark-3", "spark-4"]
    for rank, name in enumerate(names):
        yaml = render_netplan(name, names[:rank] + names[rank + 1:], rails(
            ("enp1s0f1np1", "rocep1s0f1", f"192.168.100.{11 + rank}/24"), ("enP2p1s0f1np1", "roceP2p1s0f1", f"192.168.101.{11 + rank}/24")), 9000)
        others = ", ".join(n for n in names if n != name).rsplit(", ", 1)
        assert yaml.splitlines()[1] == f"# The QSFP fabric of {name} to {others[0]} and {others[1]}: one subnet per rail, no DHCP, jumbo frames."
        root = tmp_path / name
        result = generate(root, yaml)
        assert result.returncode == 0, result.stderr
        assert f"Address=192.168.100.{11 + rank}/24" in networkd(root, "enp1s0f1np1")
        assert f"Address=192.168.101.{11 + rank}/24" in networkd(root, "enP2p1s0f1np1")
        assert "MTUBytes=9000" in networkd(root, "enP2p1s0f1np1")


def test_file_starts_with_the_managed_notice():
    yaml = render_netplan("a", ["b"], rails(("enp1s0f0np0", "rocep1s0f0", "10.0.0.1/24")), 9000)
    assert yaml.startswith("# Managed by the dual-spark deploy")
    assert "optional: true" in yaml and "dhcp4: false" in yaml and "dhcp6: false" in yaml


def test_netplan_generate_rejects_what_it_should(tmp_path):
    """The check can fail: a rail with a bad prefix is refused by the real netplan."""
    bad = [{"netdev": "enp1s0f0np0", "cidr": "10.0.0.1/99"}]
    result = generate(tmp_path, render_netplan("a", ["b"], bad, 9000))
    assert result.returncode != 0
    assert "prefix" in result.stderr.lower()


def head_stack():
    """The head's stack settings of the pair."""
    from operations.stack import stack_settings

    return stack_settings(site("pair"), "spark-head")


def test_compose_is_serialised_so_no_value_becomes_yaml():
    """Values a site hands over land as values: a newline and YAML in an env value or a mount
    add no service key, no volume, and read back exactly as written."""
    from operations.stack import compose_file, environment

    hostile = "1\n    pid: host\n    cap_add: [ALL]\n#"
    settings = with_settings(head_stack(), container_env={"X": hostile}, container_mounts=["/opt/a b\n      - /:/host"])
    text = compose_file(settings, environment(settings, 3), "abc", "def")
    service = yaml.safe_load(text)["services"]["vllm"]
    assert "pid" not in service and "cap_add" not in service
    assert service["environment"]["X"] == hostile
    assert service["volumes"][-1] == "/opt/a b\n      - /:/host:/opt/a b\n      - /:/host:ro"
    assert len(service["volumes"]) == 7


def test_a_dollar_in_an_environment_value_reaches_the_container_as_written():
    """compose interpolates $NAME and ${NAME} in its file: each $ is written $$ (compose's escape),
    so the container sees the value the site gave."""
    from operations.stack import compose_file, environment

    settings = with_settings(head_stack(), container_env={"X": "a$HOME${PATH}$$"})
    service = yaml.safe_load(compose_file(settings, environment(settings, 3), "abc", "def"))["services"]["vllm"]
    assert service["environment"]["X"] == "a$$HOME$${PATH}$$$$"
    assert all("$" not in value for name, value in service["environment"].items() if name != "X")


def test_a_secret_is_mounted_read_only_by_its_path_and_nothing_else_names_it():
    """container_secrets, through the real parse: each file mounted read-only at /run/secrets/NAME
    on every node; in no environment value, argument or label."""
    from operations.stack import desired, stack_settings

    secrets = {"wandb": "/etc/dual-spark/secrets/wandb", "s3": "/etc/dual-spark-keys/s3"}
    cluster = site("pair", {"container_secrets": secrets})
    for name in ("spark-head", "spark-worker"):
        stack = desired(stack_settings(cluster, name), 3, "d" * 64)
        service = yaml.safe_load(stack.compose)["services"]["vllm"]
        assert service["volumes"][-2:] == ["/etc/dual-spark-keys/s3:/run/secrets/s3:ro", "/etc/dual-spark/secrets/wandb:/run/secrets/wandb:ro"]
        assert stack.compose.count("/etc/dual-spark/secrets/wandb") == 1 and "secrets/wandb" not in stack.launch
        assert not any("secret" in str(value) for value in [*service["environment"].values(), *service["labels"].values()])


def test_a_secrets_content_is_in_no_rendered_file(tmp_path):
    """The deploy names a secret's file and never reads it: its content is in neither file."""
    from operations.stack import desired

    secret = tmp_path / "wandb"
    secret.write_text("s3cret-4f1c9b\n")
    stack = desired(with_settings(head_stack(), container_secrets={"wandb": str(secret)}), 3, "d" * 64)
    assert f"{secret}:/run/secrets/wandb:ro" in yaml.safe_load(stack.compose)["services"]["vllm"]["volumes"]
    assert "s3cret-4f1c9b" not in stack.compose + stack.launch
