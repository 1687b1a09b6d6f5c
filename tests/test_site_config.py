"""Bad site files and overrides are rejected by the real pyinfra CLI before it connects to any
host, with a message that names the field; a good one does reach the hosts."""

import json
import os
import select
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from site_config import MAX_NODES, SiteError, inventory_groups, load_site

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
    ("duplicated address", 'address = "10.0.0.2/24"', 'address = "10.0.0.1/24"', [], "spark-b rail[0].address"),
    ("rail ends in two subnets", 'address = "10.0.0.2/24"', 'address = "10.0.7.2/24"', [], "rail[0].address"),
    ("one subnet for two rails", '"10.0.1.', '"10.0.0.1', [], "rail[1].address"),
    ("netdev name too long", 'netdev = "enp1s0f0np0"', 'netdev = "enp1s0f0np0-rail0"', [], "node[0].rail[0].netdev"),
    ("netdev name with a slash", 'netdev = "enP2p1s0f0np0"', 'netdev = "enP2/p1"', [], "node[0].rail[1].netdev"),
    ("unknown profile", "", '\n[settings]\nprofile = "turbo"\n', [], "settings.profile"),
    ("MTU out of range", "", "\n[settings]\nfabric_mtu = 65000\n", [], "settings.fabric_mtu"),
    ("unknown profile override", "", "", ["--data", "profile=turbo"], "--data profile"),
    ("MTU override out of range", "", "", ["--data", "fabric_mtu=576"], "--data fabric_mtu"),
    ("same hostnames", 'hostname = "spark-b"', 'hostname = "spark-a"', [], "node[1].hostname"),
    ("fabric overlaps the LAN", 'ssh_host = "127.0.0.2"', 'ssh_host = "10.0.1.9"', [], "rail[1].address"),
    ("unknown setting", "", "\n[settings]\ncolour = 3\n", [], "settings.colour"),
    ("rail counts differ", '\n[[node.rail]]\nnetdev = "enP2p1s0f0np0"\nrdma = "roceP2p1s0f0"\naddress = "10.0.1.2/24"\n', "\n", [], "spark-b rail"),
    ("bad GID index", 'address = "10.0.1.1/24"', 'address = "10.0.1.1/24"\ngid_index = 300', [], "node[0].rail[1].gid_index"),
    ("octal SSH host", 'ssh_host = "127.0.0.2"', 'ssh_host = "127.0.0.002"', [], "node[1].ssh_host"),
    ("stack_dir in /etc/profile.d", "", '\n[settings]\nstack_dir = "/etc/profile.d"\n', [], "settings.stack_dir"),
    ("pyinfra's _ignore_errors", "", "", ["--data", "_ignore_errors=true"], "--data _ignore_errors"),
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


# The pyinfra command, each run its own process: a fork of one that has done what the command
# does first, importing pyinfra_cli.main as its console script does (with gevent's patching),
# and nothing else. A run then costs what pyinfra does with the site, not Python's start and
# pyinfra's imports (half a second a run); the rest is the command's own: its arguments and
# environment, stdin, stdout and stderr, its exit (SystemExit, a traceback or atexit as Python
# ends any program). What was imported before the fork is frozen out of the garbage collector,
# as in any forking server: a child's collections (the last one as it exits) then leave those
# pages shared instead of copying each page they walk, a third of a run.
FORKS = r"""
import gc, json, os, sys
from gevent.monkey import get_original

script = sys.argv[1]
sys.argv = [script]
sys.path[0] = os.path.dirname(script)  # where a console script's own directory stands
from pyinfra_cli.main import main  # noqa: E402 - what the console script runs

fork, waitpid = get_original("os", ["fork", "waitpid"])
gc.freeze()
requests = os.fdopen(os.dup(0), "r")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
answers = os.dup(1)
for line in requests:
    run = json.loads(line)
    pid = fork()
    if pid == 0:
        requests.close(), os.close(answers)
        for fd, path in ((1, run["stdout"]), (2, run["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
        os.chdir(run["cwd"])
        os.environ.update(run["env"])  # the rest is as Python set it up at the start
        sys.argv = [script, *run["args"]]
        sys.exit(main())  # the child ends here, as the command does
    os.write(answers, json.dumps({"pid": pid}).encode() + b"\n")
    os.write(answers, json.dumps({"status": os.waitstatus_to_exitcode(waitpid(pid, 0)[1])}).encode() + b"\n")
"""


class Pyinfra:
    """Runs `pyinfra --dry ARGS inventory.py deploy.py` in the repository, as a process of its own
    whose environment is PATH and the site's DUAL_SPARK_SITE."""

    def __init__(self):
        self.forks = subprocess.Popen([sys.executable, "-c", FORKS, str(PYINFRA)], cwd=REPO, env={"PATH": "/usr/bin:/bin"},
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)  # no read-ahead past select

    def answer(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.forks.stdout], [], [], timeout)
        line = self.forks.stdout.readline() if ready else b""
        assert line, f"no answer from pyinfra within {timeout} s (exit {self.forks.poll()})"
        return json.loads(line)

    def run(self, tmp_path: Path, site: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        out, err = tmp_path / "pyinfra.stdout", tmp_path / "pyinfra.stderr"
        argv = ["--dry", *args, "inventory.py", "deploy.py"]
        self.forks.stdin.write(json.dumps({"args": argv, "cwd": str(REPO), "stdout": str(out), "stderr": str(err),
                                           "env": {"DUAL_SPARK_SITE": str(site)}}).encode() + b"\n")
        self.forks.stdin.flush()
        pid = self.answer(10)["pid"]
        try:
            status = self.answer(timeout)["status"]
        except AssertionError:
            os.kill(pid, 9)
            self.answer(10)  # its exit, so that the next run reads its own
            raise
        return subprocess.CompletedProcess([str(PYINFRA), *argv], status, out.read_text(), err.read_text())

    def close(self):
        self.forks.stdin.close()
        self.forks.wait(timeout=10)


@pytest.fixture(scope="module")
def pyinfra():
    command = Pyinfra()
    yield command
    command.close()


@pytest.fixture
def run_pyinfra(pyinfra, tmp_path):
    return lambda site, *args: pyinfra.run(tmp_path, site, *args)


@pytest.mark.parametrize("case, old, new, args, field", BAD_CONFIGURATIONS, ids=[c[0] for c in BAD_CONFIGURATIONS])
def test_bad_configuration_is_rejected_before_any_connection(tmp_path, listeners, run_pyinfra, case, old, new, args, field):
    site = tmp_path / "site.toml"
    site.write_text(bad_site(listeners.port, old, new))
    result = run_pyinfra(site, *args)
    assert result.returncode != 0
    assert f"- {field} = " in result.stderr, result.stderr
    assert "no host was contacted" in result.stderr
    assert listeners.connections() == 0


def test_a_malformed_override_is_refused_before_any_connection(tmp_path, listeners, run_pyinfra):
    """pyinfra's own reading of --data recursed until Python gave up, or found no '=': a traceback, before."""
    site = tmp_path / "site.toml"
    site.write_text(GOOD_SITE.format(port=listeners.port))
    result = run_pyinfra(site, "--data", "vllm_extra_args=" + "[" * 3000 + "]" * 3000)
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "--data vllm_extra_args: nested more than 8 levels deep" in result.stderr, result.stderr
    result = run_pyinfra(site, "--data", "profile")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert "--data profile: no value" in result.stderr, result.stderr
    assert listeners.connections() == 0


def test_good_configuration_reaches_the_hosts(tmp_path, listeners, run_pyinfra):
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
    cluster = load_site(site_file)
    [(worker, data)] = inventory_groups(cluster)["worker"]
    assert [rail["cidr"] for rail in data["cluster"].node(worker).rail_data] == ["10.0.0.2/24", "10.0.1.2/24"]



# -- N nodes -----------------------------------------------------------------------------------

def node_text(index: int, fields: str = "", rails: tuple[int, ...] = (100, 101), host: int | None = None) -> str:
    """Spark number ``index + 1``: spark-1 at 192.168.1.21, 192.168.<rail>.11 on each rail."""
    host = 11 + index if host is None else host
    text = f'\n[[node]]\nhostname = "spark-{index + 1}"\nssh_host = "192.168.1.{21 + index}"\n{fields}'
    for rail, subnet in enumerate(rails):
        text += (f'\n[[node.rail]]\nnetdev = "{("enp1s0f1np1", "enP2p1s0f1np1")[rail]}"\n'
                 f'rdma = "{("rocep1s0f1", "roceP2p1s0f1")[rail]}"\naddress = "192.168.{subnet}.{host}/24"\n')
    return text


def cluster_site(tmp_path: Path, *nodes: str, topology: str = "switch", extra: str = "") -> Path:
    site = tmp_path / "site.toml"
    site.write_text(f'[ssh]\nuser = "spark"\n\n[settings]\ntopology = "{topology}"\n{extra}' + "".join(nodes))
    return site


def problems(site: Path) -> str:
    with pytest.raises(SiteError) as error:
        load_site(site)
    return str(error.value)


def test_four_sparks_through_a_switch_load_in_rank_order(tmp_path):
    cluster = load_site(cluster_site(tmp_path, *(node_text(i) for i in range(4))))
    assert [(node.rank, node.hostname, node.role) for node in cluster.nodes] == [
        (0, "spark-1", "head"), (1, "spark-2", "worker"), (2, "spark-3", "worker"), (3, "spark-4", "worker")]
    assert cluster.head.hostname == "spark-1" and [node.hostname for node in cluster.workers] == ["spark-2", "spark-3", "spark-4"]
    assert cluster.size == 4 and cluster.topology == "switch" and cluster.master_addr == "192.168.100.11"
    # The model and the image travel down a chain: each node has one sender, the one before it.
    assert [getattr(cluster.upstream(node), "hostname", None) for node in cluster.nodes] == [None, "spark-1", "spark-2", "spark-3"]
    assert [getattr(cluster.downstream(node), "hostname", None) for node in cluster.nodes] == ["spark-2", "spark-3", "spark-4", None]
    assert (cluster.tensor_parallel, cluster.pipeline_parallel) == (4, 1)
    groups = inventory_groups(cluster)
    assert [name for name, _ in groups["head"]] == ["spark-1"]
    assert [(name, data["rank"], data["role"]) for name, data in groups["worker"]] == [
        ("spark-2", 1, "worker"), ("spark-3", 2, "worker"), ("spark-4", 3, "worker")]
    assert [rail["cidr"] for rail in cluster.node(groups["worker"][2][0]).rail_data] == ["192.168.100.14/24", "192.168.101.14/24"]
    assert all(data["cluster"] is cluster for _, data in groups["head"] + groups["worker"])


def test_explicit_ranks_order_the_nodes_whatever_the_file_order(tmp_path):
    nodes = [node_text(i, f"rank = {i}\n") for i in range(4)]
    cluster = load_site(cluster_site(tmp_path, nodes[2], nodes[0], nodes[3], nodes[1]))
    assert [node.hostname for node in cluster.nodes] == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert [node.rank for node in cluster.nodes] == [0, 1, 2, 3]


def pair_data(site: Path) -> dict:
    """A pair's inventory as pyinfra receives it, the Cluster object left aside but each node's rails."""
    groups = inventory_groups(load_site(site))
    return {group: [(name, {**{k: v for k, v in data.items() if k != "cluster"}, "rails": data["cluster"].node(name).rail_data})
                    for name, data in hosts] for group, hosts in groups.items()}


def test_a_pair_site_of_before_loads_as_before_whatever_order_its_roles_come_in(tmp_path):
    site = tmp_path / "site.toml"
    site.write_text(GOOD_SITE.format(port=22))
    data = pair_data(site)
    [(head, head_data)], [(worker, worker_data)] = data["head"], data["worker"]
    assert (head, head_data["rank"], head_data["role"], head_data["ssh_hostname"]) == ("spark-a", 0, "head", "127.0.0.1")
    assert (worker, worker_data["rank"], worker_data["role"], worker_data["ssh_hostname"]) == ("spark-b", 1, "worker", "127.0.0.2")
    assert worker_data["rails"] == [
        {"netdev": "enp1s0f0np0", "rdma": "rocep1s0f0", "address": "10.0.0.2", "cidr": "10.0.0.2/24", "gid_index": "auto"},
        {"netdev": "enP2p1s0f0np0", "rdma": "roceP2p1s0f0", "address": "10.0.1.2", "cidr": "10.0.1.2/24", "gid_index": "auto"}]
    assert load_site(site).topology == "direct" and load_site(site).tensor_parallel == 2
    head_first, worker_first = GOOD_SITE.format(port=22).split("\n[[node]]\n")[1:]
    site.write_text(GOOD_SITE.format(port=22).split("\n[[node]]\n")[0] + "\n[[node]]\n" + worker_first + "\n[[node]]\n" + head_first)
    assert pair_data(site) == data


# (case, the nodes, topology, more of the site file, what the message must name)
CLUSTER_MISTAKES = [
    ("three nodes on one cable", [node_text(i) for i in range(3)], "direct", "", "settings.topology"),
    ("a node missing a rail", [node_text(0), node_text(1), node_text(2, rails=(100,)), node_text(3)], "switch", "", "spark-3 rail"),
    ("rail subnets differ", [node_text(0), node_text(1), node_text(2, rails=(100, 102)), node_text(3)], "switch", "", "rail[1].address"),
    ("both rails in one subnet", [node_text(i, rails=(100, 100), host=11 + 2 * i) for i in range(4)], "switch", "", "rail[1].address"),
    ("an address twice", [node_text(0), node_text(1), node_text(2, host=12), node_text(3)], "switch", "", "spark-3 rail[0].address"),
    ("ranks not 0..N-1", [node_text(i, f"rank = {i + 1}\n") for i in range(4)], "switch", "", "node[].rank"),
    ("a rank missing", [node_text(i, f"rank = {i}\n" if i else "") for i in range(4)], "switch", "", "node[].rank"),
    ("two heads", [node_text(i, 'role = "head"\n' if i in (0, 2) else "") for i in range(4)], "switch", "", "node[2].role"),
    ("the head's rank not 0", [node_text(i, f'rank = {i}\nrole = "{"worker" if i == 0 else "head" if i == 1 else "worker"}"\n')
                               for i in range(4)], "switch", "", "node[0].role"),
    ("TP x PP not the nodes", [node_text(i) for i in range(4)], "switch", "\n[profile.fast]\ntensor_parallel = 2\n",
     "profile.fast.tensor_parallel"),
    ("PP that leaves a node out", [node_text(i) for i in range(4)], "switch", "\n[profile.adaptive]\npipeline_parallel = 3\n",
     "profile.adaptive.pipeline_parallel"),
    (f"{MAX_NODES + 1} nodes", [node_text(i) for i in range(MAX_NODES + 1)], "switch", "", "node"),
]


@pytest.mark.parametrize("case, nodes, topology, extra, field", CLUSTER_MISTAKES, ids=[c[0] for c in CLUSTER_MISTAKES])
def test_a_cluster_mistake_is_refused_naming_the_field(tmp_path, case, nodes, topology, extra, field):
    assert f"- {field} = " in problems(cluster_site(tmp_path, *nodes, topology=topology, extra=extra))


def test_three_sparks_split_a_model_into_three_pipeline_stages(tmp_path):
    site = cluster_site(tmp_path, *(node_text(i) for i in range(3)),
                        extra="\n[profile.adaptive]\ntensor_parallel = 1\npipeline_parallel = 3\n")
    cluster = load_site(site)
    assert (cluster.size, cluster.tensor_parallel, cluster.pipeline_parallel) == (3, 1, 3)
    site.write_text(site.read_text().replace("tensor_parallel = 1\n", ""))
    assert (load_site(site).tensor_parallel, load_site(site).pipeline_parallel) == (1, 3)  # TP follows: nodes / PP


def test_the_four_node_example_is_valid_and_the_readme_links_it():
    example = REPO / "site.example-4.toml"
    cluster = load_site(example)
    assert [node.hostname for node in cluster.nodes] == ["spark-1", "spark-2", "spark-3", "spark-4"]
    assert cluster.topology == "switch" and (cluster.tensor_parallel, cluster.pipeline_parallel) == (4, 1)
    assert {str(rail.address.network) for node in cluster.nodes for rail in node.rails} == {"192.168.100.0/24", "192.168.101.0/24"}
    assert "](site.example-4.toml)" in (REPO / "README.md").read_text()
