"""A profile key the image's vLLM lacks is refused on the lab, against a real image, before the
running stack is touched. The lab's image lab-cpu-older reads as a vLLM without dynamic
speculation (lab/older_vllm.py; the lab's one CPU vLLM has it): the profile switch builds it,
sends it down the ranks and smoke-tests it on each node (the reading comes from the image), then
refuses, so both vLLM containers are the ones that ran before, still serving adaptive. A profile
on that image that asks nothing it lacks is served, and the switch to it and back is held at the
front door: no client request fails."""

import json
import re

import pytest

from lab.config import HEAD, WORKER
from lab.processes import in_node
from layout import smoke_marker
from site_config import load_site
from tests.e2e.conftest import SITE, generates, pyinfra
from tests.e2e.test_40_serving import change_through_the_door, held_not_failed

pytestmark = pytest.mark.end_to_end
# profile -> its key (as the site file sets it), the SpeculativeConfig field it needs, the fix the refusal names
LACKING = {
    "older-schedule": ("speculative_schedule = [[1, 1, 3], [2, 4, 1]]", "num_speculative_tokens_per_batch_size",
                       "a second profile with another fixed speculative_tokens"),
    "older-verification": ("adaptive_verification = true", "enable_adaptive_verification",
                           "drop adaptive_verification from the profile"),
}


def container(node) -> dict:
    fields = in_node(node.dir, "docker", "inspect", "-f", '{{.Id}} {{.State.StartedAt}} {{index .Config.Labels "dual-spark.profile"}}',
                     "dual-spark-vllm", capture_output=True).stdout.split()
    return {"id": fields[0], "started": fields[1], "profile": fields[2]}


def image_of(node) -> str:
    return in_node(node.dir, "docker", "inspect", "-f", "{{.Config.Image}}", "dual-spark-vllm", capture_output=True).stdout.strip()


def speculative_fields(node, site, image: str) -> list[str]:
    """The SpeculativeConfig fields the node's smoke test read in ``image`` (its marker's second line)."""
    cluster = load_site(site)
    marker = smoke_marker(cluster.settings.state_dir, cluster.images[image].tag)  # a shell word: the image ID's file
    return json.loads(in_node(node.dir, "sh", "-c", f"cat {marker}", capture_output=True).stdout.splitlines()[1])


@pytest.mark.parametrize("profile", LACKING)
def test_a_key_the_image_lacks_is_refused_before_the_running_stack_is_touched(converged, tmp_path, profile):
    setting, field, fix = LACKING[profile]
    key = setting.split()[0]
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + f'\n[profile.{profile}]\nbase = "adaptive"\nimage = "lab-cpu-older"\n{setting}\n')
    before = {node.role: container(node) for node in (HEAD, WORKER)}
    assert before["head"]["profile"] == before["worker"]["profile"] == "adaptive"
    result = pyinfra("-y", "--data", f"profile={profile}", task="tasks/profile.py", site=site)
    assert result.returncode != 0, result.stdout
    for said in (f"profile {profile} sets {key}, but the vLLM of image lab-cpu-older", f"has no {field} in its SpeculativeConfig",
                 "nothing was stopped", fix):
        assert said in result.stdout, result.stdout
    assert {node.role: container(node) for node in (HEAD, WORKER)} == before
    assert generates()
    for node in (HEAD, WORKER):  # read from each node's copy of the image, where the running one has it
        older, running = speculative_fields(node, site, "lab-cpu-older"), speculative_fields(node, site, "lab-cpu")
        assert "num_speculative_tokens" in older and field not in older and field in running


def test_an_image_switch_and_back_fails_no_request_at_the_door(api, tmp_path):
    """A profile on lab-cpu-older (built, sent and smoke-tested by the refusals above) that sets
    nothing the image lacks: switched to and back to adaptive on lab-cpu, each a change of image on
    both nodes, with a probe every half second and a long stream through the front door."""
    url, key = api
    site = tmp_path / "site.toml"
    site.write_text(SITE.read_text() + '\n[profile.older]\nbase = "adaptive"\nimage = "lab-cpu-older"\n')
    for profile, image in (("older", "lab-cpu-older"), ("adaptive", "lab-cpu")):
        result, probe, stream = change_through_the_door(url, key, "-y", "--data", f"profile={profile}", task="tasks/profile.py", site=site)
        assert result.returncode == 0, result.stdout[-6000:]
        assert {container(node)["profile"] for node in (HEAD, WORKER)} == {profile}
        assert {image_of(node) for node in (HEAD, WORKER)} == {load_site(site).images[image].tag}
        held_not_failed(f"an image switch to {image}", result, probe, stream)
        # the same weights on another image: every canary answers as the state before did, token for token
        assert re.search(r"canary long: 48 tokens in [\d.]+ s, compared with the recorded answers: passed", result.stdout), result.stdout
        assert "canary: all 5 passed" in result.stdout
