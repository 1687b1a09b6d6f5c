"""layout.py is the one home of the deploy's paths, names and SSH options; what cannot import it
(the serving templates and what they render) says the same. The programs that run on the nodes
get its values written into their archive (tests/programs/test_archive.py)."""

import re
from pathlib import Path

import pytest
import yaml

import layout
from site_config import default_settings, load_site

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "tests/pair/expected"


def default_paths() -> dict:
    settings = default_settings()
    return layout.paths(settings["state_dir"], settings["model_dir"])


def test_the_deploys_own_files_share_a_prefix():
    """The model directory's own files all start with OWN_FILES: replication and claiming (sync)
    leave every file with that prefix alone."""
    assert all(name.startswith(layout.OWN_FILES) for name in (layout.MANAGED_MARKER, layout.MANIFEST, layout.VERIFIED))


@pytest.mark.parametrize("source", [
    {"repo": "lab/tiny-llama", "revision": "9c1e0f2a7b3d" + "0" * 28}, {"repo": "lab/tiny-llama", "revision": "9c1e0f2a7b3d" + "1" * 28},
    {"repo": "../../etc", "revision": "$(reboot); `x`"}, {"repo": "-rf /", "revision": "main\nmain"}, {"path": "/srv/models/dsv4"},
    {"path": "/srv/models/dsv4/"}, {"path": "/srv/..."}, {"path": "/srv/model with spaces & 'quotes'"}, {"path": "/"},
    {"repo": "o/" + "n" * 200, "revision": "r" * 40},
])
def test_a_store_entry_is_one_safe_name_per_source(source):
    """One directory of the store per source, directly in it: a name of shell- and path-safe
    characters, never hidden (the deploy's own files are) nor `..`, readable, and as the store
    reads its entries (STORE_ENTRY); two sources that differ by a character never share it."""
    entry = layout.store_entry("/var/lib/dual-spark/model", source)
    directory, _, name = entry.rpartition("/")
    assert directory == "/var/lib/dual-spark/model" and layout.STORE_ENTRY.fullmatch(name), entry
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name) and ".." not in name
    assert layout.store_entry("/var/lib/dual-spark/model/", source) == entry
    other = {key: value + "x" for key, value in source.items()}
    assert layout.store_entry("/var/lib/dual-spark/model", other) != entry


def test_a_store_entry_reads_as_its_source():
    assert layout.store_entry("/m", {"repo": "lab/tiny-llama", "revision": "9c1e0f2a7b3d" + "0" * 28}).startswith(
        "/m/lab-tiny-llama-9c1e0f2a7b3d-")
    assert layout.store_entry("/m", {"path": "/srv/lab-models/big"}).startswith("/m/big-")


def test_launch_script_calls_what_the_container_holds():
    """Every path inside the container that launch.sh names is one compose mounts there, and the
    programs' archive (whose watchdog it runs) and the key are where layout says."""
    template = (REPO / "templates/serving/launch.sh.j2").read_text()
    named = set(re.findall(r"(?:/dual-spark|/run/secrets|/var/tmp)[\w./-]*", template))
    inside = layout.IN_CONTAINER
    assert {inside["programs"], inside["api_key"], inside["container_starts"]} <= named
    for path in named:
        assert path in inside.values() or path.startswith(inside["state"] + "/"), path
    assert "dual-spark watchdog" in (REPO / "files/dual_spark/watchdog.py").read_text()  # its own messages say whose


@pytest.mark.parametrize("rendered", sorted(PAIR.glob("*.compose.yaml")), ids=lambda path: path.name)
def test_rendered_stacks_use_the_names_and_mounts_of_layout(rendered):
    stack = yaml.safe_load(rendered.read_text())
    service = stack["services"]["vllm"]
    where = default_paths()
    assert stack["name"] == layout.COMPOSE_PROJECT
    assert service["container_name"] == layout.CONTAINER
    assert set(service["labels"]) == set(layout.LABELS.values())
    assert service["labels"][layout.LABELS["role"]] == rendered.name.split(".")[0]
    mounts = dict(volume.split(":")[:2] if isinstance(volume, str) else (volume["source"], volume["target"])
                  for volume in service["volumes"])
    inside = layout.IN_CONTAINER
    assert mounts[where["programs"]] == inside["programs"]
    assert mounts[where["serving"]] == inside["state"] and mounts["./launch.sh"] == inside["launch"]
    model = load_site(REPO / "tests/pair/site.toml").model
    assert mounts[layout.store_entry(default_settings()["model_dir"], model.source)] == inside["model"]  # its directory of the store
    image = service["image"]
    assert mounts[f"{where['cache']}/{layout.cache_key(image)}"] == inside["cache"]  # this image's caches, made by the deploy alone
    assert [volume["bind"] for volume in service["volumes"] if isinstance(volume, dict)] == [{"create_host_path": False}]
    assert service["entrypoint"] == [inside["launch"]]
    assert not [target for target in mounts.values() if (inside["container_starts"] + "/").startswith(target.rstrip("/") + "/")]
    test = service["healthcheck"]["test"]
    assert test[test.index(inside["programs"]) + 1] == "watchdog"
    if service["labels"][layout.LABELS["role"]] == "head":
        assert mounts[where["api_key"]] == inside["api_key"]
    else:
        assert where["api_key"] not in mounts  # the key stays on the head


@pytest.mark.parametrize("rendered", sorted(PAIR.glob("*.launch.sh")), ids=lambda path: path.name)
def test_rendered_launch_scripts_name_the_container_paths(rendered):
    text = rendered.read_text()
    role = rendered.name.split(".")[0]
    assert f"{layout.IN_CONTAINER['programs']} watchdog " in text
    assert f"--state {layout.IN_CONTAINER['state']}/{role}-starts" in text
    assert (layout.IN_CONTAINER["api_key"] in text) == (role == "head")


def test_every_configuration_file_the_deploy_writes_carries_its_header():
    """refuse_theirs knows the deploy's files by layout.MANAGED_HEADER in their first two lines: a
    template without it would be refused at its second write (a _fragment is included by others,
    never written alone)."""
    shipped = [*(path for path in (REPO / "templates").rglob("*.j2") if not path.name.startswith("_")), *(REPO / "files/host_prep").iterdir()]
    assert len(shipped) >= 10
    for path in shipped:
        assert any(line.startswith(layout.MANAGED_HEADER) for line in path.read_text().splitlines()[:2]), path


def test_the_deploys_own_vllm_flags_are_what_vllm_args_writes():
    """VLLM_FLAGS (what a site's vllm_extra_args may not set again) is every flag vllm_args puts on
    the head's and a worker's command line, for profiles with and without prefix caching, and with
    weight_prefetch on."""
    from dataclasses import replace

    from operations.stack import stack_settings, vllm_args
    from site_schema import vllm_flag

    written = set()
    for profile in ("adaptive", "long-c4"):
        cluster = load_site(REPO / "tests/pair/site.toml", overrides={"profile": profile})
        prefetching = replace(cluster.profile, weight_prefetch=profile == "long-c4")
        cluster = replace(cluster, profiles={**cluster.profiles, profile: prefetching})
        for node in cluster.nodes:
            args = vllm_args(stack_settings(cluster, node.hostname))
            written |= {vllm_flag(arg) for arg in args[:len(args) - len(cluster.settings.vllm_extra_args)] if arg.startswith("--")}
    assert written == set(layout.VLLM_FLAGS)
