"""Bad site files and overrides are rejected by the real pyinfra CLI before it connects to any
host, with a message that names the field; a good one does reach the hosts."""

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from site_config import SiteError, load_site

REPO = Path(__file__).resolve().parents[1]
PYINFRA = Path(sys.executable).parent / "pyinfra"

GOOD_SITE = """
[ssh]
user = "spark"
port = {port}

[[node]]
role = "head"
hostname = "spark-a"
ssh_host = "127.0.0.1"

[[node.rail]]
netdev = "enp1s0f0np0"
rdma = "rocep1s0f0"
address = "10.0.0.1/24"

[[node.rail]]
netdev = "enP2p1s0f0np0"
rdma = "roceP2p1s0f0"
address = "10.0.1.1/24"

[[node]]
role = "worker"
hostname = "spark-b"
ssh_host = "127.0.0.2"

[[node.rail]]
netdev = "enp1s0f0np0"
rdma = "rocep1s0f0"
address = "10.0.0.2/24"

[[node.rail]]
netdev = "enP2p1s0f0np0"
rdma = "roceP2p1s0f0"
address = "10.0.1.2/24"
"""

# (case, text to replace, replacement, extra CLI args, what the message must name)
BAD_CONFIGURATIONS = [
    ("placeholder left", 'user = "spark"', 'user = "CHANGE_ME"', [], "ssh.user"),
    ("two heads", 'role = "worker"', 'role = "head"', [], "node[1].role"),
    ("invalid address", 'address = "10.0.0.1/24"', 'address = "10.0.0.300/24"', [], "node[0].rail[0].address"),
    ("duplicated address", 'address = "10.0.0.2/24"', 'address = "10.0.0.1/24"', [], "worker rail[0].address"),
    ("rail ends in two subnets", 'address = "10.0.0.2/24"', 'address = "10.0.7.2/24"', [], "rail[0].address"),
    ("one subnet for two rails", '"10.0.1.', '"10.0.0.1', [], "rail[1].address"),
    ("netdev name too long", 'netdev = "enp1s0f0np0"', 'netdev = "enp1s0f0np0-rail0"', [], "node[0].rail[0].netdev"),
    ("netdev name with a slash", 'netdev = "enP2p1s0f0np0"', 'netdev = "enP2/p1"', [], "node[0].rail[1].netdev"),
    ("unknown profile", "", '\n[settings]\nprofile = "turbo"\n', [], "settings.profile"),
    ("MTU out of range", "", "\n[settings]\nfabric_mtu = 65000\n", [], "settings.fabric_mtu"),
    ("unknown profile override", "", "", ["--data", "profile=turbo"], "--data profile"),
    ("MTU override out of range", "", "", ["--data", "fabric_mtu=576"], "--data fabric_mtu"),
    ("same hostnames", 'hostname = "spark-b"', 'hostname = "spark-a"', [], "node[].hostname"),
    ("fabric overlaps the LAN", 'ssh_host = "127.0.0.2"', 'ssh_host = "10.0.1.9"', [], "rail[1].address"),
    ("unknown setting", "", "\n[settings]\ncolour = 3\n", [], "settings.colour"),
    ("rail counts differ", '\n[[node.rail]]\nnetdev = "enP2p1s0f0np0"\nrdma = "roceP2p1s0f0"\naddress = "10.0.1.2/24"\n', "\n", [], "node[].rail"),
    ("bad GID index", 'address = "10.0.1.1/24"', 'address = "10.0.1.1/24"\ngid_index = 300', [], "node[0].rail[1].gid_index"),
]


def bad_site(port: int, old: str, new: str) -> str:
    text = GOOD_SITE.format(port=port)
    if old:
        assert old in text, f"test case no longer matches the good site: {old!r}"
        return text.replace(old, new, 1)
    return text + new


class Listeners:
    """Plain TCP listeners where the site's SSH hosts are: they count connection attempts and
    hang up at once (the SSH client then fails fast instead of waiting for a banner)."""

    def __init__(self):
        first = socket.create_server(("127.0.0.1", 0))
        self.port = first.getsockname()[1]
        self.sockets = [first, socket.create_server(("127.0.0.2", self.port))]
        self.count = 0
        for sock in self.sockets:
            threading.Thread(target=self._accept, args=(sock,), daemon=True).start()

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                connection, _ = sock.accept()
            except OSError:
                return
            connection.close()
            self.count += 1

    def connections(self) -> int:
        return self.count

    def close(self):
        for sock in self.sockets:
            sock.close()


@pytest.fixture
def listeners():
    listening = Listeners()
    yield listening
    listening.close()


def run_pyinfra(site: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(PYINFRA), "--dry", *args, "inventory.py", "deploy.py"],
        cwd=REPO, env={"DUAL_SPARK_SITE": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("case, old, new, args, field", BAD_CONFIGURATIONS, ids=[c[0] for c in BAD_CONFIGURATIONS])
def test_bad_configuration_is_rejected_before_any_connection(tmp_path, listeners, case, old, new, args, field):
    site = tmp_path / "site.toml"
    site.write_text(bad_site(listeners.port, old, new))
    result = run_pyinfra(site, *args)
    assert result.returncode != 0
    assert f"- {field} = " in result.stderr, result.stderr
    assert "no host was contacted" in result.stderr
    assert listeners.connections() == 0


def test_good_configuration_reaches_the_hosts(tmp_path, listeners):
    """The control case: the same check sees the connections of a valid site file."""
    site = tmp_path / "site.toml"
    site.write_text(GOOD_SITE.format(port=listeners.port))
    result = run_pyinfra(site, "--data", "ssh_connect_timeout=2")
    assert "no host was contacted" not in result.stderr
    assert listeners.connections() >= 1


def test_every_problem_is_listed_at_once(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(bad_site(22, 'user = "spark"', 'user = "CHANGE_ME"').replace("10.0.0.300", "x") + "\n[settings]\nprofile = 1\nfabric_mtu = 1\n")
    with pytest.raises(SiteError) as error:
        load_site(site)
    message = str(error.value)
    assert "3 problem(s)" in message
    for field in ("ssh.user", "settings.profile", "settings.fabric_mtu"):
        assert f"- {field} = " in message


def test_missing_site_file_says_how_to_make_one(tmp_path):
    with pytest.raises(SiteError, match="copy site.example.toml to site.toml"):
        load_site(tmp_path / "site.toml")


def test_example_site_only_lacks_the_placeholders(tmp_path):
    text = (REPO / "site.example.toml").read_text()
    site_file = tmp_path / "site.toml"
    site_file.write_text(text)
    with pytest.raises(SiteError) as error:
        load_site(site_file)
    assert all("replace the placeholder" in line for line in str(error.value).splitlines()[1:])
    filled = text.replace('"CHANGE_ME"', '"spark"', 1)
    for value in ("spark-a", "192.168.1.10", "spark-b", "192.168.1.11"):
        filled = filled.replace('"CHANGE_ME"', f'"{value}"', 1)
    site_file.write_text(filled)
    site = load_site(site_file)
    assert [rail["cidr"] for rail in site.inventory_groups()["worker"][0][1]["rails"]] == ["10.0.0.2/24", "10.0.1.2/24"]

