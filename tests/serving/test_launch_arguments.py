"""Every profile's rendered `vllm serve` command, on every rank, for the Spark data, the lab's
pair and the lab's four nodes, is accepted by vLLM's own argument parser (the CPU vLLM
environment's); a bad value is not, so the check can fail."""

import json
import subprocess
from pathlib import Path

import pytest

from lab.config import LAB_DIR, lab_nodes
from lab.site import render
from operations.stack import stack_settings, vllm_args
from site_config import load_site
from tests.serving.conftest import VLLM_PYTHON

pytestmark = pytest.mark.end_to_end
REPO = Path(__file__).resolve().parents[2]
PARSE = """
import json, sys
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
verdicts = {}
for name, args in json.load(sys.stdin).items():
    try:
        parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(args)
        verdicts[name] = {"kv_cache_dtype": parsed.kv_cache_dtype, "max_num_seqs": parsed.max_num_seqs,
                          "headless": parsed.headless, "prefix_caching": parsed.enable_prefix_caching,
                          "node_rank": parsed.node_rank, "nnodes": parsed.nnodes,
                          "parallel": [parsed.tensor_parallel_size, parsed.pipeline_parallel_size]}
    except SystemExit:
        verdicts[name] = "rejected"
print(json.dumps(verdicts))
"""


def sites(tmp_path) -> dict[str, Path]:
    text = (REPO / "site.example.toml").read_text()
    for value in ("spark", "spark-a", "192.168.1.10", "spark-b", "192.168.1.11"):
        text = text.replace('"CHANGE_ME"', f'"{value}"', 1)
    (tmp_path / "spark.toml").write_text(text)
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM scratch\n")
    # The key the site names must be a private key here; the lab's own exists only while the shared lab is up.
    (tmp_path / "id_ed25519").write_text("-----BEGIN OPENSSH PRIVATE KEY-----\n")
    for name, text in (("lab", render(context, ["/opt/vllm"])), ("lab4", render(context, ["/opt/vllm"], lab_nodes(4), "switch"))):
        (tmp_path / f"{name}.toml").write_text(text.replace(str(LAB_DIR / "id_ed25519"), str(tmp_path / "id_ed25519")))
    return {name: tmp_path / f"{name}.toml" for name in ("spark", "lab", "lab4")}


def commands(tmp_path) -> dict[str, list[str]]:
    found = {}
    for name, path in sites(tmp_path).items():
        for profile in load_site(path).profiles:
            cluster = load_site(path, overrides={"profile": profile})
            for node in cluster.nodes[:3]:  # the head, a worker, and rank 2 where there is one
                role = node.role if node.rank < 2 else f"rank{node.rank}"
                found[f"{name}/{role}/{profile}"] = vllm_args(stack_settings(cluster, node.hostname))
    return found


def parse(cases: dict[str, list[str]]) -> dict:
    result = subprocess.run([VLLM_PYTHON, "-c", PARSE], input=json.dumps(cases), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.splitlines()[-1])


def test_every_profile_command_is_accepted_by_vllms_parser(tmp_path):
    cases = commands(tmp_path)
    assert len(cases) == 21  # the pairs: two sites, two ranks, three profiles; four lab nodes: three ranks, three profiles
    broken = dict(cases)
    broken["spark/head/adaptive"] = [*cases["spark/head/adaptive"], "--max-num-seqs", "four"]
    broken["lab/worker/fast"] = [arg.replace("auto", "fp9") if arg == "auto" else arg for arg in cases["lab/worker/fast"]]
    verdicts = parse({**cases, **{f"broken:{k}": v for k, v in broken.items() if v != cases[k]}})
    for name in cases:
        assert verdicts[name] != "rejected", f"vLLM refuses the {name} command: {cases[name]}"
    assert verdicts["broken:spark/head/adaptive"] == verdicts["broken:lab/worker/fast"] == "rejected"
    assert verdicts["spark/head/long-c4"] == {"kv_cache_dtype": "nvfp4_ds_mla", "max_num_seqs": 4, "headless": False,
                                              "prefix_caching": False, "node_rank": 0, "nnodes": 2, "parallel": [2, 1]}
    assert verdicts["spark/worker/fast"]["headless"] is True and verdicts["spark/worker/fast"]["max_num_seqs"] == 1
    assert verdicts["lab/head/adaptive"]["kv_cache_dtype"] == "auto"
    assert verdicts["spark/worker/fast"]["node_rank"] == 1 and verdicts["spark/worker/fast"]["parallel"] == [2, 1]
    assert verdicts["lab4/rank2/adaptive"]["headless"] is True
    assert (verdicts["lab4/rank2/adaptive"]["node_rank"], verdicts["lab4/rank2/adaptive"]["nnodes"]) == (2, 4)
    assert verdicts["lab4/head/adaptive"]["parallel"] == [4, 1]
