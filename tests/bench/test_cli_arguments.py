"""Every command-line tool (bench.* and clients) refuses a bad argument while click parses it,
through the shared layer (bench.cli): exit code 2, click's "Invalid value for '--option'" naming
the option, no traceback, and nothing contacted. Every contact point (sockets, SSH, HTTP,
subprocesses, the lab, the SSH tunnel to the head, the local stub server) raises Contacted, so a
refusal that came too late fails the test; good arguments are shown to reach one of them."""

import json
import math
import os
import socket
import string
import subprocess
from pathlib import Path

import click
import paramiko
import pytest
import requests
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import bench.remote
from bench import ask, cli, client_overhead, deploy_bench, fabric, longctx, replicate, report, serving, tune
from clients import __main__ as clients_main

REPO = Path(__file__).resolve().parents[2]
PAIR_SITE = REPO / "tests" / "pair" / "site.toml"  # valid: adaptive, fast, long-c4 drafting 5 tokens, 4 or 8 sequences
PLACEHOLDER_SITE = REPO / "site.example.toml"  # refused by the site validation: CHANGE_ME placeholders
RAW = REPO / "bench" / "examples" / "cpu-tiny" / "raw"


class Contacted(Exception):
    """A tool reached something outside this process."""


CONTACT_POINTS = [
    (socket.socket, "connect"), (socket, "create_connection"), (subprocess, "Popen"), (requests.Session, "request"),
    (paramiko.SSHClient, "connect"), (bench.remote, "connect"), (bench.remote, "head_of"), (bench.remote, "forward"),
    (serving, "through_site"), (serving, "connect"), (tune, "through_site"), (ask, "through_site"),
    (clients_main, "through_site"), (fabric, "connect"), (replicate, "head_of"),
    (deploy_bench, "LabLock"), (deploy_bench, "Lab"), (client_overhead, "Server"),
]


def contact_point(where: str):
    def contact(*args, **kwargs):
        raise Contacted(where)
    return contact


@pytest.fixture(autouse=True)
def nothing_contacted(monkeypatch, tmp_path):
    """Every contact point raises Contacted; a default --out lands under tmp_path, the default
    site is the pair's."""
    for owner, name in CONTACT_POINTS:
        monkeypatch.setattr(owner, name, contact_point(f"{getattr(owner, '__name__', owner)}.{name}"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("DUAL_SPARK_SITE", str(PAIR_SITE))


TOOLS = {
    "tune": (tune.main, []), "serving": (serving.main, []), "fabric": (fabric.main, []), "replicate": (replicate.main, []),
    "report": (report.main, [str(RAW)]), "longctx": (longctx.main, ["--model", "tiny"]), "ask": (ask.main, ["Say OK."]),
    "client_overhead": (client_overhead.main, []), "deploy_bench": (deploy_bench.main, []), "clients": (clients_main.main, []),
}


def run(tool: str, *args: str):
    command, base = TOOLS[tool]
    return CliRunner().invoke(command, [*base, *args])


def refused(result, option: str) -> str:
    """The output of a run click refused as a usage error naming ``option``."""
    assert isinstance(result.exception, SystemExit), f"not a usage error: {result.exc_info!r}\n{result.output}"
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{option}'" in result.output, result.output
    assert "Traceback" not in result.output
    return " ".join(result.output.split())


# (tool, arguments, the option named, what the message says)
BAD = [
    ("tune", ["--schedule", "[[2, 4, 3], [1, 1, 5]]"], "--schedule", "start the first range at batch size 1"),
    ("tune", ["--schedule", "[[1, 1, 5], [3, 4, 3]]"], "--schedule", "start the range after batch size 1 at 2"),
    ("tune", ["--schedule", "[[1, 2, 5], [2, 4, 3]]"], "--schedule", "without gaps or overlaps"),
    ("tune", ["--schedule", "[[1, 1, 99]]"], "--schedule", "draft 0 (no drafting at these batch sizes) to 16 tokens"),
    ("tune", ["--schedule", "[[1, 1, 9], [2, 4, 3]]"], "--schedule", "fits no profile of"),
    ("tune", ["--schedule", "[[1, 1, 5], [2, 3, 3]]"], "--schedule", "end the last range at its max_num_seqs"),
    ("tune", ["--schedule", "[[3, 1, 5]]"], "--schedule", "end it at or after its start"),
    ("tune", ["--schedule", "[[1, 4]]"], "--schedule", "is not three whole numbers"),
    ("tune", ["--schedule", "[[1, 4, 2.5]]"], "--schedule", "is not three whole numbers"),
    ("tune", ["--schedule", "1-4:3"], "--schedule", "is not JSON"),
    ("tune", ["--schedule", "[]"], "--schedule", "is not a list of ranges"),
    ("tune", ["--prompt-tokens", "0"], "--prompt-tokens", "0 is out of range"),
    ("tune", ["--prompt-tokens", "-9028"], "--prompt-tokens", "'-9028' is not a whole number"),
    ("tune", ["--prompt-tokens", "9k"], "--prompt-tokens", "'9k' is not a whole number"),
    ("tune", ["--requests", "0"], "--requests", "0 is not in the range 1<=x<=1000"),
    ("tune", ["--max-tokens", "-1"], "--max-tokens", "-1 is not in the range"),
    ("serving", ["--prompt-tokens", "100,0"], "--prompt-tokens", "0 in '100,0' is out of range"),
    ("serving", ["--prompt-tokens", "99999999"], "--prompt-tokens", "99999999 is out of range"),
    ("serving", ["--concurrency", "1,x"], "--concurrency", "'x' in '1,x' is not a whole number"),
    ("serving", ["--concurrency", "0"], "--concurrency", "0 is out of range"),
    ("serving", ["--concurrency", "1,,4"], "--concurrency", "'' in '1,,4' is not a whole number"),
    ("serving", ["--concurrency", "5000"], "--concurrency", "from 1 to 1,024"),
    ("serving", ["--requests", "-3"], "--requests", "-3 is not in the range"),
    ("serving", ["--max-tokens", "0"], "--max-tokens", "0 is not in the range"),
    ("serving", ["--url", "http://127.0.0.1:70000"], "--url", "its port is not one from 1 to 65535"),
    ("serving", ["--url", "127.0.0.1:8888"], "--url", "is not an http:// or https:// URL"),
    ("serving", ["--via-ssh", "spark@head:0"], "--via-ssh", "is not user@host"),
    ("serving", ["--telemetry", "spark@head:x"], "--telemetry", "is not user@host"),
    ("serving", ["--profile", "../../etc/x"], "--profile", "is not a profile name"),
    ("serving", ["--site", str(PLACEHOLDER_SITE)], "--site", "replace the placeholder"),
    ("serving", ["--api-key-file", "/nonexistent/key"], "--api-key-file", "no such file"),
    ("serving", ["--api-key-file", "/"], "--api-key-file", "a directory where a file belongs"),
    ("serving", ["--ssh-key", "/no\x00key"], "--ssh-key", "no such file"),
    ("fabric", ["--seconds", "0"], "--seconds", "0 is not in the range 1<=x<=3600"),
    ("fabric", ["--seconds", "-10"], "--seconds", "-10 is not in the range"),
    ("fabric", ["--mtu", "9000000"], "--mtu", "is not in the range 1280<=x<=9216"),
    ("fabric", ["--nccl-command", "mpirun -H {first},{third} all_reduce_perf"], "--nccl-command", "unknown placeholder {third}"),
    ("fabric", ["--nccl-command", "mpirun {} all_reduce_perf"], "--nccl-command", "unknown placeholder {}"),
    ("fabric", ["--nccl-command", "mpirun {first"], "--nccl-command", "write a literal brace as {{ or }}"),
    ("fabric", ["--nccl-command", "mpirun {gid:d}"], "--nccl-command", "write the placeholder plainly, {gid}"),
    ("fabric", ["--pair", "spark-a,spark-z"], "--pair", "name two different nodes of the site"),
    ("fabric", ["--site", str(PLACEHOLDER_SITE)], "--site", "replace the placeholder"),
    ("replicate", ["--gib", "0"], "--gib", "is not in the range 0<x<=1024"),
    ("replicate", ["--gib", "-2"], "--gib", "is not in the range"),
    ("replicate", ["--gib", "nan"], "--gib", "'nan' is not a number"),
    ("replicate", ["--shard-mib", "0"], "--shard-mib", "0 is not in the range"),
    ("replicate", ["--streams", "33"], "--streams", "33 is not in the range 1<=x<=32"),
    ("replicate", ["--site", str(PLACEHOLDER_SITE)], "--site", "replace the placeholder"),
    ("longctx", ["--sizes", "0"], "--sizes", "0 is out of range"),
    ("longctx", ["--sizes", "74000,110k"], "--sizes", "'110k' in '74000,110k' is not a whole number"),
    ("longctx", ["--trials", "0"], "--trials", "0 is not in the range"),
    ("longctx", ["--needles", "0"], "--needles", "0 is not in the range"),
    ("longctx", ["--max-tokens", "0"], "--max-tokens", "0 is not in the range"),
    ("longctx", ["--url", "http://[::1"], "--url", "is not an http:// or https:// URL"),
    ("longctx", ["--profile", "a/b"], "--profile", "is not a profile name"),
    ("ask", ["--max-tokens", "0"], "--max-tokens", "0 is not in the range"),
    ("report", ["--reference", "/nonexistent"], "--reference", "does not exist"),
    ("report", ["--reference", str(RAW / "serving-cpu-ngram3-20261130T020955Z.json")], "--reference", "is not a directory"),
    ("ask", ["--site", str(PLACEHOLDER_SITE)], "--site", "replace the placeholder"),
    ("client_overhead", ["--streams", "0"], "--streams", "0 is not in the range"),
    ("client_overhead", ["--groups", "-1"], "--groups", "-1 is not in the range"),
    ("client_overhead", ["--tokens", "0"], "--tokens", "0 is not in the range"),
    ("deploy_bench", ["--runs", "0"], "--runs", "0 is not in the range 1<=x<=100"),
    ("clients", ["--port", "70000"], "--port", "'70000' is not a TCP port"),
    ("clients", ["--port", "0"], "--port", "is not a TCP port"),
    ("clients", ["--port", "http"], "--port", "is not a TCP port"),
    ("clients", ["--site", str(PLACEHOLDER_SITE)], "--site", "replace the placeholder"),
    ("clients", ["--client", "laptop"], "--client", "the site names no [client.laptop]: add the table, deploy, then run this"),
]


@pytest.mark.parametrize("tool, arguments, option, says", BAD, ids=[f"{t}{' '.join(a)}" for t, a, _, _ in BAD])
def test_a_bad_argument_is_refused_naming_the_option_before_any_contact(tool, arguments, option, says):
    assert says in refused(run(tool, *arguments), option)


def test_a_site_file_that_is_missing_or_not_a_file_is_a_usage_error_with_its_fix(tmp_path, monkeypatch):
    for tool in ("tune", "fabric", "replicate", "ask", "clients"):
        assert "no site file" in refused(run(tool, "--site", str(tmp_path / "none.toml")), "--site")
        assert "not a file" in refused(run(tool, "--site", "/dev/null"), "--site")
    monkeypatch.setenv("DUAL_SPARK_SITE", str(tmp_path / "none.toml"))  # the default, as inventory.py finds it
    assert f"{tmp_path / 'none.toml'}: no site file. Fix: " in refused(run("tune"), "--site")


OUTPUT_TOOLS = ["tune", "serving", "fabric", "replicate", "report", "longctx", "deploy_bench", "clients"]
BAD_OUTPUTS = {  # where --out points -> what the refusal says
    "/proc/self/results": "is under /proc",
    "/sys/kernel/results": "is under /sys",
    "/dev/null": "is under /dev",
    "{tmp}/a-file": "exists and is not a directory",
    "{tmp}/a-file/results": "cannot be made: {tmp}/a-file is a file, not a directory",
    "{tmp}/a-file/deeper/results": "cannot be made: {tmp}/a-file is a file, not a directory",
    "{tmp}/nul\x00": "holds a NUL byte",
    "{tmp}/loop-a/results": "cannot be followed (Symlink loop",
}


@pytest.mark.parametrize("tool", OUTPUT_TOOLS)
@pytest.mark.parametrize("out, says", BAD_OUTPUTS.items(), ids=[out.replace("\x00", "NUL") for out in BAD_OUTPUTS])
def test_an_output_that_cannot_be_written_is_refused_before_the_run(tmp_path, tool, out, says):
    (tmp_path / "a-file").write_text("results\n")
    (tmp_path / "loop-a").symlink_to(tmp_path / "loop-b")
    (tmp_path / "loop-b").symlink_to(tmp_path / "loop-a")
    error = refused(run(tool, "--out", out.format(tmp=tmp_path)), "--out")
    assert says.format(tmp=tmp_path) in error and "Fix: give --out a directory you can write" in error
    assert (tmp_path / "a-file").read_text() == "results\n"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_a_directory_without_write_permission_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert "cannot write in it (Permission denied)" in refused(run("serving", "--out", str(locked)), "--out")
    assert "cannot be made (Permission denied)" in refused(run("serving", "--out", str(locked / "results")), "--out")


def test_a_directory_the_system_will_not_let_us_make_or_write_is_refused(tmp_path, monkeypatch):
    """As root too: the errors a read-only or full file system gives, raised where the layer makes and probes."""
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cli.tempfile, "mkstemp", read_only)
    assert f"{tmp_path}: cannot write in it (Read-only file system)" in refused(run("fabric", "--out", str(tmp_path)), "--out")
    monkeypatch.setattr(Path, "mkdir", read_only)
    assert "cannot be made (Read-only file system)" in refused(run("fabric", "--out", str(tmp_path / "new")), "--out")


@pytest.mark.parametrize("folder", ["/nonexistent", "nul\x00", str(RAW / "serving-cpu-ngram3-20261130T020955Z.json")])
def test_the_report_s_folder_is_a_directory_that_exists(folder):
    assert "Fix: give the directory holding the results" in refused(CliRunner().invoke(report.main, [folder]), "FOLDER")


def test_the_report_s_default_output_is_proved_as_a_given_one(tmp_path):
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "report").symlink_to("/proc/self")
    assert "is under /proc" in refused(CliRunner().invoke(report.main, [str(folder)]), "--out")


# Good arguments get as far as the first contact, with the output directory made and proved first.
GOOD = {
    "tune": ["--schedule", "[[1, 1, 5], [2, 4, 3]]", "--prompt-tokens", "9028,512", "--requests", "1", "--max-tokens", "16"],
    "serving": ["--concurrency", " 1, 4", "--url", "http://127.0.0.1:8888/", "--via-ssh", "spark@head:2222", "--profile", "long-c4"],
    "fabric": ["--seconds", "1", "--mtu", "9000", "--nccl-command", "mpirun -H {first},{second} {{literal}} {hcas} {gid} {ifname}"],
    "replicate": ["--gib", "0.25", "--shard-mib", "64", "--streams", "32"],
    "longctx": ["--sizes", "300,600", "--trials", "1", "--profile", "cpu-tiny"],
    "ask": ["--max-tokens", "8"],
    "client_overhead": ["--streams", "2", "--groups", "1", "--tokens", "4"],
    "deploy_bench": ["--runs", "1"],
    "clients": ["--port", "65535"],
}


@pytest.mark.parametrize("tool", GOOD)
def test_good_arguments_reach_the_first_contact(tmp_path, tool):
    out = tmp_path / "new" / "results"
    result = run(tool, *GOOD[tool], *(["--out", str(out)] if tool in OUTPUT_TOOLS else []))
    assert isinstance(result.exception, Contacted), (result.exc_info, result.output)
    if tool in OUTPUT_TOOLS:
        assert out.is_dir() and not any(path.name.startswith(".writable-") for path in out.iterdir())


def test_the_report_writes_where_it_was_told(tmp_path):
    result = run("report", "--out", str(tmp_path / "report"))
    assert result.exit_code == 0, result.output
    assert (tmp_path / "report" / "report.md").is_file()


def test_the_clients_output_directory_is_made_for_the_owner_alone(tmp_path):
    result = run("clients")
    assert isinstance(result.exception, Contacted)
    assert (tmp_path / ".dual-spark" / "clients").stat().st_mode & 0o777 == 0o700


# The file output of the layer (no tool writes a single file yet): checked through a command of its own.
@click.command()
@click.option("--out", type=cli.OutputFile())
@click.option("--log", type=cli.OutputFile(overwrite=True))
def writes_a_file(out, log):
    click.echo(f"ok {out} {log}")


@pytest.mark.parametrize("option, value, says", [
    ("--out", "{tmp}/exists.json", "exists and would be overwritten"),
    ("--out", "{tmp}", "is a directory"),
    ("--out", "/dev/null", "is under /dev"),
    ("--out", "/proc/self/status", "is under /proc"),
    ("--out", "{tmp}/exists.json/x.json", "{tmp}/exists.json is a file, not a directory"),
    ("--log", "/dev/stdout", "is under /"),
    ("--log", "{tmp}", "is a directory"),
])
def test_a_file_output_is_refused_where_it_cannot_or_should_not_be_written(tmp_path, option, value, says):
    (tmp_path / "exists.json").write_text("{}")
    error = refused(CliRunner().invoke(writes_a_file, [option, value.format(tmp=tmp_path)]), option)
    assert says.format(tmp=tmp_path) in error


def test_a_file_output_is_taken_in_a_directory_made_for_it_or_over_a_file_meant_to_be_overwritten(tmp_path):
    (tmp_path / "exists.json").write_text("{}")
    result = CliRunner().invoke(writes_a_file, ["--out", str(tmp_path / "new" / "x.json"), "--log", str(tmp_path / "exists.json")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "new").is_dir() and not (tmp_path / "new" / "x.json").exists()


# Property tests: any text given to a list, schedule, port or template option is accepted (and the
# run reaches its first contact) or refused as a usage error naming the option; never a traceback.
PROPERTY = settings(derandomize=True, max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
NOISE = st.text(alphabet=string.printable + "٤²\x00é", max_size=24)


def accepted_or_refused(result, option: str) -> bool:
    """True when the run got as far as contact, False for a usage error naming ``option``."""
    if isinstance(result.exception, Contacted):
        return True
    refused(result, option)
    return False


def whole_numbers(text: str, most: int) -> bool:
    parts = [part.strip() for part in text.split(",")]
    return len(parts) <= cli.MAX_ITEMS and all(part.isascii() and part.isdigit() and 1 <= int(part) <= most for part in parts)


@PROPERTY
@given(st.one_of(NOISE, st.lists(st.integers(-5, 1100).map(str), min_size=1, max_size=4).map(",".join)))
def test_any_concurrency_list_is_taken_or_refused_naming_the_option(text):
    assert accepted_or_refused(run("serving", f"--concurrency={text}"), "--concurrency") == whole_numbers(text, cli.MAX_CONCURRENCY)


RANGES = st.lists(st.lists(st.integers(-1, 18), min_size=3, max_size=3), min_size=1, max_size=4)


@st.composite
def contiguous(draw) -> list[list[int]]:
    """Ranges in order from batch size 1, most of them a schedule some profile takes."""
    schedule, start = [], 1
    for length, k in draw(st.lists(st.tuples(st.integers(1, 5), st.integers(0, 7)), min_size=1, max_size=4)):
        schedule.append([start, start + length - 1, k])
        start += length
    return schedule


def takes(schedule) -> bool:
    """The pair site's profiles (k at most 5; 4 or 8 sequences) and the rules of a schedule."""
    following = 1
    for start, end, k in schedule:
        if start != following or end < start or not 0 <= k <= 16:
            return False
        following = end + 1
    return max(k for _, _, k in schedule) <= 5 and any(schedule[-1][0] <= seqs <= schedule[-1][1] for seqs in (4, 8))


@PROPERTY
@given(st.one_of(NOISE, RANGES.map(json.dumps), contiguous().map(json.dumps)))
def test_any_schedule_is_taken_or_refused_naming_the_option(text):
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    well_formed = (isinstance(value, list) and bool(value)
                   and all(isinstance(r, list) and len(r) == 3 and all(type(n) is int for n in r) for r in value))
    assert accepted_or_refused(run("tune", f"--schedule={text}"), "--schedule") == (well_formed and takes(value))


@PROPERTY
@given(st.one_of(NOISE, st.integers(-10, 70000).map(str)))
def test_any_port_is_taken_or_refused_naming_the_option(text):
    try:
        port = int(text)
    except ValueError:
        port = None
    assert accepted_or_refused(run("clients", f"--port={text}"), "--port") == (port is not None and 1 <= port <= 65535)


TEMPLATE = st.lists(st.sampled_from(["{first}", "{second}", "{hcas}", "{gid}", "{ifname}", "{third}", "{}", "{0}", "{first!r}",
                                     "{gid:>4}", "{", "}", "{{", "}}", "mpirun ", "-x A=", ",", "{first.x}", "{hcas[0]}"]),
                    max_size=6).map("".join)


@PROPERTY
@given(st.one_of(NOISE, TEMPLATE))
def test_any_nccl_command_is_taken_or_refused_naming_the_option(text):
    filled = {"first": "10.0.0.1", "second": "10.0.0.2", "hcas": "rocep1s0f0", "gid": 3, "ifname": "enp1s0f0np0"}
    if accepted_or_refused(run("fabric", f"--nccl-command={text}"), "--nccl-command"):
        assert isinstance(text.format(**filled), str)  # every placeholder taken is one the tool fills in
        assert not any(field and not field.isidentifier() for _, field, _, _ in string.Formatter().parse(text))
    else:
        try:
            ok = all(field in filled and not spec and not conversion for _, field, spec, conversion in string.Formatter().parse(text)
                     if field is not None)
        except ValueError:
            ok = False
        assert not ok, text


def test_the_bounds_hold_at_their_edges():
    convert = cli.PositiveIntList(max=4).convert
    assert convert("1, 4", None, None) == [1, 4]
    assert convert([2, 3], None, None) == [2, 3]
    with pytest.raises(click.BadParameter, match="out of range"):
        convert("5", None, None)
    with pytest.raises(click.BadParameter, match="more than 64"):
        convert(",".join(["1"] * 65), None, None)
    with pytest.raises(click.BadParameter, match="not a number"):
        cli.Bounded(0, 1).convert(str(math.nan), None, None)
    assert cli.Port().convert("65535", None, None) == 65535
