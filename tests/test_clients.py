"""The client configurations as pure functions: they parse as their clients read them, name the
served model and window, compact below the profile's fence, and never hold the key. Written
whole, never through a link, never into a directory another may write."""

import json
import os
import shlex
import stat
import tomllib

import click
import pytest

from clients import Served, claude_settings, codex_catalog, codex_config, compact_limit, tunnel_command
from clients.__main__ import write

SERVED = Served("deepseek-v4-flash", 1048576, 110000, "long-c4", "spark-a", 2)
KEY_PATH = "/home/me/.dual-spark/clients/api-key"
# The ModelInfo fields Codex requires in a catalog entry (codex-rs/protocol/src/openai_models.rs).
REQUIRED = {"slug", "display_name", "supported_reasoning_levels", "shell_type", "visibility", "supported_in_api", "priority",
            "base_instructions", "supports_reasoning_summaries", "support_verbosity", "truncation_policy",
            "supports_parallel_tool_calls", "experimental_supported_tools"}


def test_codex_config_points_at_the_tunnel_with_the_responses_api():
    text = codex_config(SERVED, "http://127.0.0.1:8888", "/home/me/catalog.json", KEY_PATH, "ssh -N -L ...")
    config = tomllib.loads(text)
    assert config["model"] == "deepseek-v4-flash" and config["model_provider"] == "dual-spark"
    assert config["model_context_window"] == 1048576 and config["model_auto_compact_token_limit"] == 110000
    assert config["model_catalog_json"] == "/home/me/catalog.json"
    assert config["model_providers"]["dual-spark"] == {
        "name": "deepseek-v4-flash on two DGX Sparks (spark-a)", "base_url": "http://127.0.0.1:8888/v1",
        "wire_api": "responses", "env_key": "DUAL_SPARK_API_KEY"}


def test_a_larger_cluster_is_named_with_its_size():
    served = Served("deepseek-v4-flash", 1048576, 110000, "long-c4", "spark-1", 4)
    config = tomllib.loads(codex_config(served, "http://127.0.0.1:8888", "/home/me/catalog.json", KEY_PATH, "ssh"))
    assert config["model_providers"]["dual-spark"]["name"] == "deepseek-v4-flash on 4 DGX Sparks (spark-1)"
    assert codex_catalog(served)["models"][0]["description"] == "Served by 4 DGX Sparks (profile long-c4)"


def test_a_path_with_quotes_stays_one_toml_string():
    text = codex_config(SERVED, "http://127.0.0.1:8888", '/home/o"brien/catalog.json', KEY_PATH, "ssh")
    assert tomllib.loads(text)["model_catalog_json"] == '/home/o"brien/catalog.json'


def test_codex_catalog_entry_carries_the_window_and_every_required_field():
    catalog = json.loads(json.dumps(codex_catalog(SERVED)))
    [entry] = catalog["models"]
    assert REQUIRED <= set(entry)
    assert entry["slug"] == "deepseek-v4-flash" and entry["context_window"] == 1048576
    assert entry["auto_compact_token_limit"] == 110000 and entry["base_instructions"]


def test_compaction_stays_below_the_profile_fence_and_the_window():
    assert compact_limit(150000, 1048576) == 150000
    assert compact_limit(150000, 4096) == 3686


def test_claude_settings_read_the_key_from_its_file():
    settings = claude_settings(SERVED, "http://127.0.0.1:8888", KEY_PATH)
    assert shlex.split(settings["apiKeyHelper"]) == ["cat", KEY_PATH]
    assert settings["env"]["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:8888"
    assert {settings["env"][k] for k in ("ANTHROPIC_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL")} == {"deepseek-v4-flash"}


def test_the_tunnel_command_carries_the_local_port_to_the_heads_loopback():
    command = tunnel_command(8888, "127.0.0.1", 8888, "spark", "192.168.1.10", 22, None, None)
    assert command == "ssh -N -L 127.0.0.1:8888:127.0.0.1:8888 spark@192.168.1.10"
    odd = tunnel_command(18888, "127.0.0.1", 8888, "spark", "spark-a.lan", 2222, "/home/me/my key", "/home/me/kh")
    assert shlex.split(odd) == ["ssh", "-N", "-L", "127.0.0.1:18888:127.0.0.1:8888", "-p", "2222", "-i", "/home/me/my key",
                                "-o", "UserKnownHostsFile=/home/me/kh", "spark@spark-a.lan"]


def test_the_key_is_written_mode_600_in_a_private_directory_with_nothing_beside_it(tmp_path):
    out = tmp_path / "clients"
    write(out / "api-key", "the-key\n", 0o600)
    assert (out / "api-key").read_text() == "the-key\n" and stat.S_IMODE((out / "api-key").stat().st_mode) == 0o600
    assert stat.S_IMODE(out.stat().st_mode) == 0o700 and os.listdir(out) == ["api-key"]  # no temporary file left


def test_an_existing_file_of_the_users_is_replaced_whole(tmp_path):
    (tmp_path / "config.toml").write_text("old and longer than the new text\n")
    os.chmod(tmp_path, 0o700)
    before = (tmp_path / "config.toml").stat().st_ino
    write(tmp_path / "config.toml", "new\n")
    assert (tmp_path / "config.toml").stat().st_ino != before  # a new file renamed over it: never half written
    assert (tmp_path / "config.toml").read_text() == "new\n" and stat.S_IMODE((tmp_path / "config.toml").stat().st_mode) == 0o644


def test_a_link_planted_at_the_destination_is_refused_and_its_target_untouched(tmp_path):
    os.chmod(tmp_path, 0o700)
    (tmp_path / "elsewhere").write_text("theirs\n")
    (tmp_path / "api-key").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(click.ClickException) as refused:
        write(tmp_path / "api-key", "the-key\n", 0o600)
    assert refused.value.message == f"{tmp_path / 'api-key'} is a symbolic link: nothing written through it. Fix: remove it, and run again"
    assert (tmp_path / "elsewhere").read_text() == "theirs\n" and (tmp_path / "api-key").is_symlink()
    assert sorted(os.listdir(tmp_path)) == ["api-key", "elsewhere"]


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_a_directory_others_may_write_is_refused(tmp_path, mode):
    out = tmp_path / "shared"
    out.mkdir()
    os.chmod(out, mode)
    with pytest.raises(click.ClickException) as refused:
        write(out / "api-key", "the-key\n", 0o600)
    assert refused.value.message == (f"{out} is writable by others: the API key and its configurations are not written there. "
                                     f"Fix: chmod go-w {out} if it is yours, or give --out a directory of your own")
    assert os.listdir(out) == []


def test_a_directory_reached_through_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(click.ClickException, match="is not a directory this user can open"):
        write(tmp_path / "link" / "api-key", "the-key\n", 0o600)
    assert os.listdir(tmp_path / "real") == []


@pytest.mark.as_root
def test_a_directory_of_another_user_is_refused(tmp_path):
    out = tmp_path / "theirs"
    out.mkdir(mode=0o755)
    os.chown(out, 65534, 65534)
    with pytest.raises(click.ClickException, match=f"{out} is owned by user 65534: "):
        write(out / "api-key", "the-key\n", 0o600)
    assert os.listdir(out) == []
