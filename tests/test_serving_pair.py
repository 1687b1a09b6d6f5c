"""A two-node site written before the cluster model (tests/pair/site.toml) renders every node's
netplan, compose.yaml and launch.sh byte for byte as pinned (tests/pair/expected/, GID 3 and a
fixed model digest): as the pair-only code did, but for the programs, mounted and run as one
archive. The watchdog's digest and the stack's hash are checked, then pinned by name. A four-node
site renders its own."""

import json
from pathlib import Path

import pytest

from operations.stack import desired, stack_settings, vllm_args
from programs import digest
from site_config import load_site
from tests.write_fixtures import PAIR, PAIR_DIGEST, PAIR_GID, readable, write_pair


def test_the_pair_renders_its_files_as_pinned(tmp_path):
    """Every file of tests/pair/expected/ is what the pair's site renders now (tests/write_fixtures.py
    writes them), and nothing more; the two digests no one can read are checked, then named."""
    assert len(write_pair(tmp_path)) == 14
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == {
        path.name: path.read_text() for path in (PAIR / "expected").iterdir()}


@pytest.mark.parametrize("spoiled", ["watchdog", "stack"])
def test_a_digest_that_is_not_of_what_it_names_is_refused(spoiled):
    """The check before the naming can fail: a launch.sh that names another watchdog, a label that
    is not the stack's hash."""
    stack = desired(stack_settings(load_site(PAIR / "site.toml"), "spark-a"), PAIR_GID, PAIR_DIGEST)
    compose, launch = stack.compose, stack.launch
    assert readable(compose, launch)
    if spoiled == "watchdog":
        launch = launch.replace(digest("watchdog.py")[:16], "0" * 16)
    else:
        compose = compose.replace(stack.hash, "0" * 16)
    with pytest.raises(AssertionError, match="watchdog" if spoiled == "watchdog" else "label"):
        readable(compose, launch)


def four_nodes(tmp_path, parallel: str) -> Path:
    """The pair's site with two more workers on its subnets, behind a switch."""
    text = (PAIR / "site.toml").read_text().replace("[settings]\n", '[settings]\ntopology = "switch"\n')
    for number in (3, 4):
        text += (f'\n[[node]]\nrole = "worker"\nhostname = "spark-{number}"\nssh_host = "192.168.1.{10 + number}"\n'
                 f'[[node.rail]]\nnetdev = "enp1s0f1np1"\nrdma = "rocep1s0f1"\naddress = "10.10.0.{number}/24"\n'
                 f'[[node.rail]]\nnetdev = "enP2p1s0f1np1"\nrdma = "roceP2p1s0f1"\naddress = "10.10.1.{number}/24"\n')
    text += f"\n[profile.adaptive]\n{parallel}\n"
    path = tmp_path / "site.toml"
    path.write_text(text)
    return path


def test_four_nodes_name_every_rank(tmp_path):
    cluster = load_site(four_nodes(tmp_path, "tensor_parallel = 2\npipeline_parallel = 2"))
    head, *workers = (desired(stack_settings(cluster, node.hostname), PAIR_GID, PAIR_DIGEST) for node in cluster.nodes)
    assert [node.hostname for node in cluster.nodes] == ["spark-a", "spark-b", "spark-3", "spark-4"]
    waits = [line for line in head.launch.splitlines() if "wait-for-worker" in line]
    assert waits == [f"watchdog wait-for-worker --worker-ip 10.10.0.{n} --port 25001 --timeout 600" for n in (2, 3, 4)]
    assert "# The head of the 4-node vLLM (tensor parallel 2 x pipeline parallel 2, rank 0), profile adaptive." in head.compose
    assert "# The worker of the 4-node vLLM (tensor parallel 2 x pipeline parallel 2, rank 2, headless)" in workers[1].compose
    assert "# Started workers first, then head; stopped head first." in workers[1].compose
    assert "--head-ip 10.10.0.1 " in workers[1].launch and "wait-for-worker" not in workers[1].launch
    args = vllm_args(stack_settings(cluster, "spark-3"))
    assert " ".join(args[args.index("--tensor-parallel-size"):][:4]) == "--tensor-parallel-size 2 --pipeline-parallel-size 2"
    assert " ".join(args[args.index("--nnodes"):][:9]) == "--nnodes 4 --node-rank 2 --master-addr 10.10.0.1 --master-port 25000 --headless"
    assert len({head.hash, *(worker.hash for worker in workers)}) == 4


def test_a_schedule_and_adaptive_verification_are_rendered_into_the_speculative_config(tmp_path):
    """Set in a profile, they join --speculative-config as vLLM's fields; the pinned stacks above
    show a profile without them renders as before."""
    path = tmp_path / "site.toml"
    path.write_text((PAIR / "site.toml").read_text() + "\n[profile.tuned]\nbase = \"adaptive\"\nspeculative_tokens = 7\n"
                    "speculative_schedule = [[1, 1, 7], [2, 4, 3]]\nadaptive_verification = true\n")
    args = vllm_args(stack_settings(load_site(path, overrides={"profile": "tuned"}), "spark-a"))
    config = json.loads(args[args.index("--speculative-config") + 1])
    assert config["num_speculative_tokens"] == 7
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, 7], [2, 4, 3]]
    assert config["enable_adaptive_verification"] is True


def test_weight_prefetch_is_off_unless_a_profile_sets_it(tmp_path):
    """Off in every published profile (the pinned stacks above have no load strategy); a profile
    that sets it has vLLM prefetch the weights' files; anything but true or false is refused."""
    from site_config import SiteError

    for profile in ("adaptive", "fast", "long-c4"):
        cluster = load_site(PAIR / "site.toml", overrides={"profile": profile})
        assert "--safetensors-load-strategy" not in vllm_args(stack_settings(cluster, "spark-a"))
    path = tmp_path / "site.toml"
    path.write_text((PAIR / "site.toml").read_text() + "\n[profile.prefetched]\nbase = \"adaptive\"\nweight_prefetch = true\n")
    args = vllm_args(stack_settings(load_site(path, overrides={"profile": "prefetched"}), "spark-b"))
    assert args[args.index("--safetensors-load-strategy") + 1] == "prefetch"
    path.write_text((PAIR / "site.toml").read_text() + "\n[profile.prefetched]\nbase = \"adaptive\"\nweight_prefetch = \"yes\"\n")
    with pytest.raises(SiteError, match="profile.prefetched.weight_prefetch"):
        load_site(path, overrides={"profile": "prefetched"})
