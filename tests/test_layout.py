"""layout.py is the one home of the deploy's paths, names and SSH options; what cannot import it
(the programs that run on the nodes, the serving templates and what they render) says the same."""

import ast
import re
from pathlib import Path

import pytest
import yaml

import layout
from site_config import default_settings

REPO = Path(__file__).resolve().parents[1]
PAIR = REPO / "tests/pair/expected"


def constants(program: Path) -> dict:
    """A program's module-level constants, read without running it (model_sync.py imports what
    sits beside it on the node)."""
    found = {}
    for statement in ast.parse(program.read_text()).body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
            try:
                found[statement.targets[0].id] = ast.literal_eval(statement.value)
            except ValueError:
                continue
    return found


def default_paths() -> dict:
    settings = default_settings()
    return layout.paths(settings["state_dir"], settings["model_dir"])


def test_model_sync_uses_the_marker_the_ssh_options_and_the_place_of_the_deploy():
    program = REPO / "files/runtime/model_sync.py"
    found = constants(program)
    assert found["MARKER"] == layout.MANAGED_MARKER
    assert found["SSH"] == ["ssh", *layout.SSH_OPTIONS, "-c", layout.FABRIC_CIPHER]
    assert found["REMOTE_SCRIPT"] == default_paths()["model_sync"]
    assert layout.MANAGED_MARKER.startswith(layout.OWN_FILES) and layout.VERIFIED.startswith(layout.OWN_FILES)
    assert f'"{layout.OWN_FILES}"' in program.read_text()  # the deploy's own files, never taken for foreign ones


@pytest.mark.parametrize("name", ["model_sync", "fetch_model", "progress", "health", "watchdog"])
def test_each_shipped_program_has_its_place(name):
    """The deploy copies files/*/NAME.py to the path layout.paths gives it, under the same name."""
    shipped = list((REPO / "files").glob(f"*/{name}.py"))
    assert len(shipped) == 1
    assert Path(default_paths()[name]).name == shipped[0].name
    assert Path(default_paths()[name]).parent.as_posix() == default_paths()["bin"]


def test_launch_script_calls_what_the_container_holds():
    """Every path inside the container that launch.sh names is one compose mounts there, and the
    watchdog and the key are where layout says."""
    template = (REPO / "templates/serving/launch.sh.j2").read_text()
    named = set(re.findall(r"(?:/dual-spark|/run/secrets)[\w./-]*", template))
    inside = layout.IN_CONTAINER
    assert {inside["watchdog"], inside["api_key"]} <= named
    for path in named:
        assert path in inside.values() or path.startswith(inside["state"] + "/"), path
    assert "dual-spark watchdog" in (REPO / "files/serving/watchdog.py").read_text()  # its own messages say whose


@pytest.mark.parametrize("rendered", sorted(PAIR.glob("*.compose.yaml")), ids=lambda path: path.name)
def test_rendered_stacks_use_the_names_and_mounts_of_layout(rendered):
    stack = yaml.safe_load(rendered.read_text())
    service = stack["services"]["vllm"]
    where = default_paths()
    assert stack["name"] == layout.COMPOSE_PROJECT
    assert service["container_name"] == layout.CONTAINER
    assert set(service["labels"]) == set(layout.LABELS.values())
    assert service["labels"][layout.LABELS["role"]] == rendered.name.split(".")[0]
    mounts = dict(volume.split(":")[:2] for volume in service["volumes"])
    inside = layout.IN_CONTAINER
    assert mounts[where["health"]] == inside["health"] and mounts[where["watchdog"]] == inside["watchdog"]
    assert mounts[where["serving"]] == inside["state"] and mounts["./launch.sh"] == inside["launch"]
    assert mounts[default_settings()["model_dir"]] == inside["model"]
    assert service["entrypoint"] == [inside["launch"]]
    assert inside["watchdog"] in service["healthcheck"]["test"]
    if service["labels"][layout.LABELS["role"]] == "head":
        assert mounts[where["api_key"]] == inside["api_key"]
    else:
        assert where["api_key"] not in mounts  # the key stays on the head


@pytest.mark.parametrize("rendered", sorted(PAIR.glob("*.launch.sh")), ids=lambda path: path.name)
def test_rendered_launch_scripts_name_the_container_paths(rendered):
    text = rendered.read_text()
    role = rendered.name.split(".")[0]
    assert f"{layout.IN_CONTAINER['watchdog']} " in text
    assert f"--state {layout.IN_CONTAINER['state']}/{role}-starts" in text
    assert (layout.IN_CONTAINER["api_key"] in text) == (role == "head")
