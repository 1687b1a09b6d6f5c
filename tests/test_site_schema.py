"""The site file's schema (site_schema.py) through the loader: each class of broken input a user
writes is refused naming the field, and generated wrong shapes and values for every declared key
are taken exactly when the key's declaration takes them (its kind, its rule, its items' and
names'), and refused naming it otherwise: never a traceback.

The documents are TOML text that load_site reads as it reads a file (SiteText: the disk left
out); tests/test_site_config.py and the unreadable and deep files below read real files."""

import dataclasses
import json
import pickle
import tomllib
from pathlib import Path, PosixPath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import serving_data
import site_config
import site_schema as schema
from cluster import Settings
from site_config import SiteError, default_settings, load_site
from tests.test_site_config import GOOD_SITE

REPO = Path(__file__).resolve().parents[1]

GOOD = tomllib.loads(GOOD_SITE.format(port=22))
THIRD = {"hostname": "spark-c", "ssh_host": "127.0.0.3",
         "rail": [{**rail, "address": rail["address"].replace(".2/", ".3/")} for rail in GOOD["node"][1]["rail"]]}


ESCAPES = {**{c: f"\\u{c:04x}" for c in (*range(0x20), 0x7f)}, ord('"'): '\\"', ord("\\"): "\\\\"}


def toml_string(text: str) -> str:
    return f'"{text.translate(ESCAPES)}"'


def toml_value(value) -> str:
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{toml_string(str(key))} = {toml_value(item)}" for key, item in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return json.dumps(value)


def toml_text(document: dict) -> str:
    """A TOML document: scalars first, then tables, then arrays of tables (one level of nesting
    inside them, as [[node.rail]])."""
    lines = [f"{toml_string(key)} = {toml_value(value)}" for key, value in document.items()
             if not isinstance(value, dict) and not (isinstance(value, list) and value and all(isinstance(v, dict) for v in value))]
    for key, value in document.items():
        if isinstance(value, dict):
            lines += [f"[{toml_string(key)}]", *[f"{toml_string(k)} = {toml_value(v)}" for k, v in value.items()]]
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for entry in value:
                lines.append(f"[[{toml_string(key)}]]")
                lines += [f"{toml_string(k)} = {toml_value(v)}" for k, v in entry.items()
                          if not (isinstance(v, list) and v and all(isinstance(i, dict) for i in v))]
                for k, v in entry.items():
                    if isinstance(v, list) and v and all(isinstance(i, dict) for i in v):
                        for item in v:
                            lines.append(f"[[{toml_string(key)}.{toml_string(k)}]]")
                            lines += [f"{toml_string(a)} = {toml_value(b)}" for a, b in item.items()]
    return "\n".join(lines) + "\n"


class SiteText(PosixPath):
    """A site file held in memory: load_site checks, reads, decodes and parses it as it does a
    file on disk, which costs an example of the properties below more than the check itself."""

    def __new__(cls, text: str):
        site = super().__new__(cls, "site.toml")
        site.data = text.encode()
        return site

    def exists(self, **_) -> bool:
        return True

    def is_file(self) -> bool:
        return True

    def read_bytes(self) -> bytes:
        return self.data


def load(document: dict, overrides: dict | None = None):
    return load_site(SiteText(toml_text(document)), overrides)


def refused(document: dict, overrides: dict | None = None) -> str:
    with pytest.raises(SiteError) as error:
        load(document, overrides)
    return str(error.value)


def with_(path: str, value, base: dict | None = None) -> dict:
    """GOOD with one key set: ``settings.model_dir``, ``node.0.rail.1.address``, ``profile.fast.env``."""
    document = pickle.loads(pickle.dumps(base or GOOD))  # a deep copy, in a fifth of deepcopy's time
    *parents, last = path.split(".")
    table = document
    for part in parents:
        table = table[int(part)] if isinstance(table, list) else table.setdefault(part, {})
    if isinstance(table, list):
        table[int(last):int(last) + 1] = [value]  # one past the end appends
    else:
        table[last] = value
    return document


def test_the_good_site_and_the_toml_writer_agree():
    assert tomllib.loads(toml_text(GOOD)) == GOOD
    cluster = load(GOOD)
    assert [(node.rank, node.hostname) for node in cluster.nodes] == [(0, "spark-a"), (1, "spark-b")]


def test_a_third_node_is_taken_through_a_switch():
    """The control case of the three-node mistake below: the same nodes with topology = "switch"."""
    cluster = load(with_("settings.topology", "switch", with_("node.2", THIRD)))
    assert [node.hostname for node in cluster.nodes] == ["spark-a", "spark-b", "spark-c"] and cluster.tensor_parallel == 3


def test_every_default_setting_is_declared_and_valid():
    defaults = default_settings()
    assert set(defaults) == set(schema.SETTINGS) == {field.name for field in dataclasses.fields(Settings)}
    load(with_("settings", defaults))
    assert all(key.doc for key in schema.SETTINGS.values()), "a setting says what it is"


def test_the_settings_page_is_written_from_the_declarations():
    """docs/settings.md is the schema's own page: a setting added, changed or documented there
    and not written out fails here (the page names the command that writes it)."""
    assert (REPO / "docs/settings.md").read_text() == schema.settings_page()
    assert schema.settings_page().count("\n| `") == len(schema.SETTINGS)


# (what a user wrote, the field the message must name)
USER_MISTAKES = [
    (with_("settings.model_dir", "/."), "settings.model_dir"),
    (with_("model", {"path": "/srv/weights", "served_name": "x", "tokenizer_mode": "auto"}, with_("settings.model_dir", "/usr")), "settings.model_dir"),
    (with_("settings.model_dir", "/var/lib/dual-spark"), "settings.model_dir"),
    (with_("settings.model_dir", "/var/lib/dual-spark/bin"), "settings.model_dir"),
    (with_("settings.stack_dir", "/etc"), "settings.stack_dir"),
    (with_("settings.stack_dir", "/var/lib/dual-spark/model/stack"), "settings.model_dir"),
    (with_("settings.model_dir", "/var/lib/dual-spark/../../home"), "settings.model_dir"),
    (with_("settings.state_dir", "/home/spark"), "settings.state_dir"),
    (with_("settings.memlock_limits_path", "/etc/passwd"), "settings.memlock_limits_path"),
    (with_("settings.netplan_path", "/etc/netplan/50-cloud-init.yaml"), "settings.netplan_path"),
    (with_("model", {"path": "/var/lib/dual-spark/model", "served_name": "x", "tokenizer_mode": "auto"}), "model.path"),
    (with_("model", "x"), "model"),
    (with_("settings", "x"), "settings"),
    (with_("ssh", "x"), "ssh"),
    (with_("profile", "fast"), "profile"),
    (with_("node", GOOD["node"][0]), "node"),
    (with_("node.0.rail", GOOD["node"][0]["rail"][0]), "node[0].rail"),
    (with_("node.0.role", "worker"), "node[0].role"),
    (with_("node.1.role", "head"), "node[1].role"),
    (with_("node.0.rank", 0), "node[].rank"),
    (with_("node.1.rank", 1, with_("node.0.rank", 1)), "node[].rank"),
    (with_("node", [GOOD["node"][0]]), "node"),
    (with_("node.2", THIRD), "settings.topology"),
    (with_("profile.fast.tensor_parallel", 4), "profile.fast.tensor_parallel"),
    (with_("node.0.rail.0.gid_index", True), "node[0].rail[0].gid_index"),
    (with_("settings.serving_ready_timeout", 0), "settings.serving_ready_timeout"),
    (with_("settings.replication_streams", -1), "settings.replication_streams"),
    (with_("settings.block_size", 0), "settings.block_size"),
    (with_("settings.expected_link_speed_mbps", 0), "settings.expected_link_speed_mbps"),
    (with_("settings.fabric_mtu", True), "settings.fabric_mtu"),
    (with_("profile.fast", {"speculative_tokens": 1000}), "profile.fast.speculative_tokens"),
    (with_("profile.fast", {"max_model_len": 10**12}), "profile.fast.max_model_len"),
    (with_("settings.master_port", 8888), "settings.master_port"),
    (with_("node.0.rail.0.address", "127.0.0.1/8"), "node[0].rail[0].address"),
    (with_("node.0.rail.0.address", "224.0.0.9/24"), "node[0].rail[0].address"),
    (with_("node.1.rail.1.address", "10.0.1.2/16", with_("node.0.rail.1.address", "10.0.1.1/16")), "rail[1].address"),
    (with_("node.1.hostname", "SPARK-A"), "node[1].hostname"),
    (with_("profile.adaptive", {"env": {"X: 1\n    pid: host\n    cap_add: [ALL]\n#": "1"}}), "profile.adaptive.env"),
    (with_("profile.adaptive", {"env": {"NCCL_DEBUG": 1}}), "profile.adaptive.env.NCCL_DEBUG"),
    (with_("settings.serving_env", {"A": "1\n    pid: host"}), "settings.serving_env.A"),
    (with_("settings.container_env", {"1X": "a"}), "settings.container_env"),
    (with_("image.tony-overlay", {"env": {"A B": "x"}}), "image.tony-overlay.env"),
    (with_("settings.container_devices", ["dev/infiniband"]), "settings.container_devices[0]"),
    (with_("settings.container_mounts", ["/opt/x\n      - /:/host"]), "settings.container_mounts[0]"),
    (with_("settings.container_mounts", ["relative/path"]), "settings.container_mounts[0]"),
    (with_("node.0.ssh_host", "-oProxyCommand=touch /tmp/x"), "node[0].ssh_host"),
    (with_("node.0.ssh_host", " "), "node[0].ssh_host"),
    (with_("node.0.ssh_host", "host; reboot"), "node[0].ssh_host"),
    (with_("model.repo", "owner/name; rm -rf /"), "model.repo"),
    (with_("image.tony-overlay.python", "python3; id"), "image.tony-overlay.python"),
    (with_("settings.hf_endpoint", "https://hub.example $(id)"), "settings.hf_endpoint"),
    (with_("settings.speculative_method", "ngram --foo"), "settings.speculative_method"),
    (with_("settings.host_packages", ["rsync; rm -rf /"]), "settings.host_packages[0]"),
    (with_("settings.api_host", "::1"), "settings.api_host"),
    (with_("settings.container_ulimits", {"memlock": "unlimited"}), "settings.container_ulimits.memlock"),
    (with_("settings.vllm_extra_args", ["--x\n"]), "settings.vllm_extra_args[0]"),
    # speculative_schedule of profile adaptive (max_num_seqs 4, speculative_tokens 5)
    (with_("profile.adaptive.speculative_schedule", [[2, 4, 3], [1, 1, 5]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[1, 2, 5], [2, 4, 3]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[1, 1, 5], [3, 4, 3]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[2, 4, 3]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[0, 4, 3]]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive.speculative_schedule", [[1, 1, 5], [2, 4, 3], [5, 8, 2]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[1, 1, 5], [2, 3, 3]]), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [[1, 1, 7], [2, 4, 3]]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive.speculative_schedule", [[1, 4, -1]]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive.speculative_schedule", [[3, 1, 2]]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive", {"speculative_tokens": 0, "speculative_schedule": [[1, 4, 0]]}), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", []), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.speculative_schedule", [1, 4, 3]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive.speculative_schedule", [[1, 4]]), "profile.adaptive.speculative_schedule[0]"),
    (with_("profile.adaptive.speculative_schedule", [[1, 4, 3.0]]), "profile.adaptive.speculative_schedule[0][2]"),
    (with_("profile.adaptive.speculative_schedule", [[1, 4, True]]), "profile.adaptive.speculative_schedule[0][2]"),
    (with_("profile.adaptive.speculative_schedule", {"1-4": 3}), "profile.adaptive.speculative_schedule"),
    (with_("profile.adaptive.adaptive_verification", "yes"), "profile.adaptive.adaptive_verification"),
    (with_("profile.adaptive", {"speculative_tokens": 0, "adaptive_verification": False}), "profile.adaptive.adaptive_verification"),
    (with_("settings.speculative_options", {"num_speculative_tokens_per_batch_size": [[1, 4, 3]]}), "settings.speculative_options"),
    # observability
    (with_("settings.prometheus_port", 8888), "settings.prometheus_port"),
    (with_("settings.node_exporter_port", 25001), "settings.node_exporter_port"),
    (with_("settings.prometheus_retention_gib", 0), "settings.prometheus_retention_gib"),
    (with_("settings.prometheus_retention_days", "15d"), "settings.prometheus_retention_days"),
    (with_("settings.metrics_interval_seconds", 1), "settings.metrics_interval_seconds"),
    (with_("settings.observability", "yes"), "settings.observability"),
    (with_("canary.mine", {"max_tokens": 8}), "canary.mine.prompt"),
    (with_("canary.mine", {"prompt": "p"}), "canary.mine"),
    (with_("canary.mine", {"prompt": "p", "max_tokens": 8, "long": True}), "canary.mine"),
    (with_("canary.mine", {"prompt": "p", "max_tokens": 0}), "canary.mine.max_tokens"),
    (with_("canary.mine", {"prompt": "  ", "max_tokens": 8}), "canary.mine.prompt"),
    (with_("canary.mine", {"prompt": "p", "max_tokens": 8, "checks": ["grammar"]}), "canary.mine.checks[0]"),
    (with_("canary.mine", {"prompt": "p", "max_tokens": 8, "checks": []}), "canary.mine.checks"),
    (with_("canary.Mine", {"prompt": "p", "max_tokens": 8}), "canary.Mine"),
    (with_("canary.long.max_tokens", "4k"), "canary.long.max_tokens"),
    (with_("canary", "p"), "canary"),
    (with_("settings.canary_long_tokens", 0), "settings.canary_long_tokens"),
    (with_("canary.perplexity.max_tokens", 8), "canary.perplexity"),
    (with_("canary.perplexity.perplexity", "yes"), "canary.perplexity.perplexity"),
    (with_("settings.canary_perplexity_ratio", 1.0), "settings.canary_perplexity_ratio"),
    (with_("settings.canary_agree_tokens", -1), "settings.canary_agree_tokens"),
    (with_("canary.perplexity.watch", True), "canary.perplexity"),
    (with_("canary.mine", {"prompt": "p", "max_tokens": 8, "checks": ["answer"], "watch": True}), "canary.mine.watch"),
    (with_("canary.code.watch", "yes"), "canary.code.watch"),
    (with_("settings.canary_watch_seconds", 0), "settings.canary_watch_seconds"),
    (with_("canary.tool.tool", "get_weather"), "canary.tool.tool"),
    (with_("canary.tool.tool", {"name": "get weather"}), "canary.tool.tool"),
    (with_("canary.tool.tool", {"name": "f", "parameters": {"type": "array"}}), "canary.tool.tool"),
    (with_("canary.tool.tool", {"name": "f", "parameters": {"type": "object", "properties": {}, "required": ["city"]}}), "canary.tool.tool"),
    (with_("canary.tool.tool", {"name": "f", "arguments": {}}), "canary.tool.tool"),
    (with_("canary.tool.extra_body", {"temperature": 1.0}), "canary.tool.extra_body"),
    (with_("canary.perplexity.tool", {"name": "f"}), "canary.perplexity"),
    (with_("canary.perplexity.extra_body", {"top_k": 1}), "canary.perplexity"),
]


@pytest.mark.parametrize("document, field", USER_MISTAKES, ids=[m[1] + f"#{i}" for i, m in enumerate(USER_MISTAKES)])
def test_a_user_mistake_is_refused_naming_the_field(document, field):
    assert f"- {field} = " in refused(document)


def test_a_sites_canary_is_added_and_one_of_the_sets_changed_in_its_length():
    """The control case of the canaries' mistakes: a canary added, the long one given a length,
    and code no longer watched while it serves."""
    site = load(with_("canary.mine", {"prompt": "p", "max_tokens": 8, "checks": ["answer"]},
                      with_("canary.long", {"max_tokens": 100}, with_("canary.code.watch", False))))
    assert [name for name, canary in sorted(site.canaries.items()) if canary.watch] == ["fabric"]
    assert site.canaries["mine"].max_tokens == 8 and site.canaries["mine"].checks == ("answer",)
    assert (site.canaries["long"].max_tokens, site.canaries["long"].long) == (100, False)
    assert sorted(site.canaries) == ["code", "fabric", "long", "mine", "perplexity", "tool"]
    assert (site.canaries["perplexity"].perplexity, site.canaries["perplexity"].checks) == (True, ())


def test_a_sites_tool_canary_offers_its_own_function_with_fields_of_its_own():
    """The control case of the tool canary's mistakes."""
    tool = {"name": "find-file", "description": "d", "parameters": {"type": "object", "properties": {"path": {"type": "string"}},
                                                                    "required": ["path"]}}
    site = load(with_("canary.tool.tool", tool, with_("canary.tool.extra_body", {"top_k": 1})))
    assert (site.canaries["tool"].tool, site.canaries["tool"].extra_body) == (tool, {"top_k": 1})


def test_a_schedule_to_max_num_seqs_within_speculative_tokens_is_taken():
    """The control case of the schedule's mistakes: the recipe's 7 at one request and 3 at two to four."""
    site = load(with_("profile.adaptive", {"speculative_tokens": 7, "speculative_schedule": [[1, 1, 7], [2, 4, 3]],
                                           "adaptive_verification": False}))
    profile = site.profiles["adaptive"]
    assert (profile.speculative_schedule, profile.adaptive_verification) == ([[1, 1, 7], [2, 4, 3]], False)
    assert load(with_("profile.adaptive.speculative_schedule", [[1, 4, 0]])).profiles["adaptive"].speculative_schedule == [[1, 4, 0]]


@pytest.mark.parametrize("overrides, field", [
    ({"model_dir": "/home"}, "--data model_dir"),
    ({"state_dir": "/."}, "--data state_dir"),
    ({"ssh_hostname": "10.9.9.9"}, "--data ssh_hostname"),
    ({"ssh_user": "root"}, "--data ssh_user"),
    ({"serving_ready_timeout": -1}, "--data serving_ready_timeout"),
    ({"profile": ["fast"]}, "--data profile"),
    ({"model_dir": "/var/lib/dual-spark", "state_dir": "/var/lib/dual-spark"}, "--data model_dir"),
])
def test_a_bad_override_is_refused_naming_it(overrides, field):
    assert f"- {field} = " in refused(GOOD, overrides)


def test_unreadable_site_files_are_refused_plainly(tmp_path):
    (tmp_path / "latin1.toml").write_bytes(b'[ssh]\nuser = "sp\xe4rk"\n')
    with pytest.raises(SiteError, match="not UTF-8"):
        load_site(tmp_path / "latin1.toml")
    with pytest.raises(SiteError, match="not a file"):
        load_site(tmp_path)


def test_what_a_site_may_mean_is_accepted():
    site = load(with_("settings", {
        "model_dir": "/data/models/deepseek", "stack_dir": "/etc/dual-spark-b", "api_host": "192.168.1.5", "api_public": True,
        "container_env": {"NCCL_DEBUG": "INFO"}, "host_packages": ["g++", "libnuma1"], "hf_token_file": "~/tokens/hub-token",
    }, with_("node.0.ssh_host", "spark-a.lan")))
    assert site.settings.model_dir == "/data/models/deepseek"


# Generated: every declared key of every table gets values of every shape.
VALUES = st.recursive(
    st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=20)
    | st.sampled_from(["/", "/.", "/etc", "/usr/lib", "..", "-o", "a\nb", "auto", "10.0.0.1/24", "::1", "CHANGE_ME"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=6,
)
PLACES = (
    [(f"ssh.{key}", f"ssh.{key}", declared) for key, declared in schema.SSH.items()]
    + [(f"node.0.{key}", f"node[0].{key}", declared) for key, declared in schema.NODE.items()]
    + [(f"node.1.rail.0.{key}", f"node[1].rail[0].{key}", declared) for key, declared in schema.RAIL.items()]
    + [(f"settings.{key}", f"settings.{key}", declared) for key, declared in schema.SETTINGS.items()]
    + [(f"model.{key}", f"model.{key}", declared) for key, declared in schema.MODEL.items()]
    + [(f"image.tony-overlay.{key}", f"image.tony-overlay.{key}", declared) for key, declared in schema.IMAGE.items()]
    + [(f"profile.fast.{key}", f"profile.fast.{key}", declared) for key, declared in schema.PROFILE.items()]
)
# Keys a value's declaration alone does not decide, and that no generated value meets: a node's rails
# (a table of tables, each checked as [[node.rail]] above) and a build context (a directory on disk
# holding a Dockerfile).
UNDECLARED = (schema.NODE["rail"], schema.IMAGE["build"])


def declared(value, key: schema.Key) -> bool:
    """Whether ``value`` is what ``key`` declares: of its kind (a bool is no number; an int is a
    float), its rule taking it, and so every item and name it declares for a list or table."""
    kinds = key.kind if isinstance(key.kind, tuple) else (key.kind,)
    if not (bool in kinds if isinstance(value, bool) else isinstance(value, kinds) or (float in kinds and isinstance(value, int))):
        return False
    if key.rule is not None and key.rule(value) is not None:
        return False
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
    return (key.item is None or all(declared(item, key.item) for item in items)) and (
        key.names is None or not isinstance(value, dict) or all(declared(name, key.names) for name in value))


def taken(key: schema.Key, value) -> bool:
    return not any(key is undeclared for undeclared in UNDECLARED) and declared(value, key)


SETTING_NAMES = set(schema.SETTINGS)


def taken_or_related(message: str | None, name: str) -> bool:
    """A value its declaration takes is taken, unless a relation with another setting refuses it
    (two ports alike, an http flag for an https hub): each problem then names both."""
    problems = [line for line in (message or "").splitlines()[1:] if line.startswith("  - ")]
    return message is None or all(name in line and any(other in line for other in SETTING_NAMES - {name}) for line in problems)


@pytest.fixture
def defaults_read_once(monkeypatch):
    """The loader's defaults (site_schema.SETTINGS and serving.toml), read once for the
    thousands of examples below, each load getting its own copy as from a fresh read: what an
    example varies is the site, and every other test reads the defaults from disk."""
    settings_read, serving_read = pickle.dumps(default_settings()), pickle.dumps(serving_data.defaults())
    monkeypatch.setattr(site_config, "default_settings", lambda: pickle.loads(settings_read))
    monkeypatch.setattr(serving_data, "defaults", lambda: pickle.loads(serving_read))


def outcome(document: dict, overrides: dict | None = None, setting: str | None = None, value=None) -> str | None:
    """None when valid, else the message; anything but SiteError fails the test. A ``setting``
    taken must reach the typed site as given: a value is refused naming it, or it is what runs."""
    try:
        site = load(document, overrides)
    except SiteError as error:
        return str(error)
    if setting is not None:
        assert getattr(site.settings, setting) == value, (setting, value, getattr(site.settings, setting))
    return None


@pytest.mark.parametrize("place, field, key", PLACES, ids=[p[1] for p in PLACES])
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_any_value_of_any_key_is_taken_exactly_when_its_declaration_takes_it(defaults_read_once, place, field, key, value):
    """Taken (for a setting, as what runs), or refused by a relation naming it and the other
    setting; a value its declaration refuses is refused naming the key."""
    message = outcome(with_(place, value), None, *((place.removeprefix("settings."), value) if place.startswith("settings.") else ()))
    name = field.rsplit(".", 1)[-1]
    if taken(key, value):
        assert taken_or_related(message, name), (value, message)
    else:
        assert message is not None and any(line.startswith("  - ") and name in line for line in message.splitlines()[1:]), (value, message)


@pytest.mark.parametrize("name", sorted(schema.SETTINGS))
@settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=VALUES)
def test_any_override_is_taken_exactly_when_its_declaration_takes_it(defaults_read_once, name, value):
    message = outcome(GOOD, {name: value}, name, value)
    if taken(schema.SETTINGS[name], value):
        assert taken_or_related(message, name), (value, message)
    else:
        assert message is not None and f"- --data {name}" in message, (value, message)


@pytest.mark.parametrize("document, field", [
    (with_("model", {"path": "/srv/w", "repo": "a/b", "revision": "0" * 40}), "model"),
    (with_("profile.mine", {"base": "turbo"}), "profile.mine.base"),
    (with_("ssh.key", "/nonexistent/id_ed25519"), "ssh.key"),
    (with_("settings.api_port", 22), "settings.api_port"),
    (with_("settings.speculative_options", {"num_speculative_tokens": 9}), "settings.speculative_options"),
    (with_("settings.speculative_options", {"use_local_argmax_reduction": True}, with_("profile.adaptive.adaptive_verification", True,
                                                                                     with_("settings.speculative_method", "ngram"))),
     "settings.speculative_options"),
    (with_("settings.generation_config", {"temperature": -1}), "settings.generation_config"),
])
def test_what_only_shows_at_start_or_connection_is_refused_before(document, field):
    """Mistakes that would otherwise surface only at the first connection or at vLLM's start
    (after the running pair was stopped)."""
    assert f"- {field} = " in refused(document)


# The grammar: what a value may be, matched whole and bounded, and hosts in one spelling.
GRAMMAR_MISTAKES = [
    (with_("node.0.ssh_host", "127.0.0.021"), "node[0].ssh_host", "127.0.0.17"),
    (with_("node.0.ssh_host", "192.168.001.021"), "node[0].ssh_host", "192.168.1.17"),
    (with_("node.0.ssh_host", "2130706453"), "node[0].ssh_host", "127.0.0.21"),
    (with_("node.0.ssh_host", "0x7f.0.0.1"), "node[0].ssh_host", "127.0.0.1"),
    (with_("node.0.ssh_host", "::ffff:127.0.0.21"), "node[0].ssh_host", "127.0.0.21"),
    (with_("node.0.ssh_host", "FE80::1"), "node[0].ssh_host", "fe80::1"),
    (with_("node.0.ssh_host", "10.0.0.256"), "node[0].ssh_host", "DNS name"),
    (with_("node.1.ssh_host", "localhost", with_("node.0.ssh_host", "127.0.0.1")), "node[1].ssh_host", "node[0] has it already"),
    (with_("node.1.hostname", "spark-2\n"), "node[1].hostname", "hostname"),
    (with_("node.1.rail.0.netdev", "enp1s0f0np0\n"), "node[1].rail[0].netdev", "interface"),
    (with_("node.1.rail.0.rdma", "..."), "node[1].rail[0].rdma", "RDMA"),
    (with_("settings.state_dir", "/var/lib/dual-spark\n"), "settings.state_dir", "absolute path"),
    (with_("settings.profile", "fast\n"), "settings.profile", "profile"),
    (with_("settings.stack_dir", "/etc/profile.d"), "settings.stack_dir", "/var/lib/dual-spark"),
    (with_("settings.model_dir", "/root/.ssh"), "settings.model_dir", "/var/lib/dual-spark"),
    (with_("settings.model_dir", "/var/lib/dpkg"), "settings.model_dir", "/var/lib/dual-spark"),
    (with_("settings.model_dir", "/var/lock"), "settings.model_dir", "/var/lib/dual-spark"),
    (with_("settings.model_dir", "/var/lib/dual-spark/" + "m" * 100), "settings.model_dir", "64"),
    (with_("settings.model_dir", "/var/lib/dual-spark/" + "m/" * 150 + "m"), "settings.model_dir", "255"),
    (with_("settings.hf_token_file", "/etc/passwd"), "settings.hf_token_file", "~/"),
    (with_("settings.hf_token_file", "~/../../etc/shadow"), "settings.hf_token_file", "~/"),
    (with_("model", {"path": "/etc", "served_name": "x", "tokenizer_mode": "auto"}), "model.path", "/srv"),
    (with_("model", {"path": "/proc/self/root", "served_name": "x", "tokenizer_mode": "auto"}), "model.path", "/srv"),
    (with_("profile.adaptive.speculative_schedule", [[1, 2**63 - 1, 3]]), "profile.adaptive.speculative_schedule[0]", "1024"),
    (with_("settings.vllm_extra_args", ["--x=" + "a" * (1 << 20)]), "settings.vllm_extra_args[0]", "4096 characters"),
    (with_("settings.speculative_options", {"prompt_lookup_max": 2**62}), "settings.speculative_options.prompt_lookup_max", "2,147"),
    (with_("settings.speculative_options", {"x": float("inf")}), "settings.speculative_options.x", "finite"),
    (with_("settings.container_devices", ["/dev/sda"]), "settings.container_devices[0]", "RDMA or GPU device"),
    (with_("settings.container_devices", ["/dev/mem"]), "settings.container_devices[0]", "RDMA or GPU device"),
    (with_("settings.container_mounts", ["/etc"]), "settings.container_mounts[0]", "programs or data"),
    (with_("settings.container_mounts", ["/root"]), "settings.container_mounts[0]", "programs or data"),
    (with_("settings.container_mounts", ["/home/spark/.ssh"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/root/.cache/huggingface/hub"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/proc/self/root"]), "settings.container_mounts[0]", "programs or data"),
    (with_("settings.container_mounts", ["/opt/dual-spark"], with_("settings.state_dir", "/opt/dual-spark/state")),
     "settings.container_mounts[0]", "API key"),
    (with_("node.0.rail", [{**GOOD["node"][0]["rail"][0], "netdev": f"n{i}", "rdma": f"r{i}"} for i in range(5)]), "node[0].rail", "1 to 4"),
    (with_("settings.grafana_image", "grafana/grafana-oss:latest"), "settings.grafana_image", "pin Grafana by digest"),
    (with_("settings.prometheus_port", 8888), "settings.prometheus_port", "api_port uses that port already"),
    (with_("settings.vllm_port", 8888), "settings.vllm_port", "api_port uses that port already"),
    (with_("settings.door_metrics_port", 8889), "settings.door_metrics_port", "vllm_port uses that port already"),
    (with_("settings.door_drain_seconds", 0), "settings.door_drain_seconds", "1 to 86400 seconds"),
    (with_("settings.door_request_kib", 8), "settings.door_request_kib", "use 16 to 65536 KiB"),
    (with_("settings.prometheus_retention_gib", 4096), "settings.prometheus_retention_gib", "1 to 1024 GiB"),
    (with_("settings.slo_ttft_seconds", 3), "settings.slo_ttft_seconds", "a bucket bound of vLLM's time to first token histogram"),
    (with_("settings.slo_itl_seconds", 0.12), "settings.slo_itl_seconds", "inter-token latency histogram: 0.01, 0.025"),
    (with_("settings.slo_error_ratio", 0.1), "settings.slo_error_ratio", "0.0001 to 0.05 of requests"),
    (with_("settings.slo_ttft_target", 0.9), "settings.slo_ttft_target", "0.95 to 0.9999"),
    (with_("settings.alert_webhooks", "https://hooks.example.com/alerts"), "settings.alert_webhooks", "list webhook URLs as strings"),
    (with_("settings.alert_webhooks", ["ftp://hooks.example.com/alerts"]), "settings.alert_webhooks[0]", "use an http(s) URL"),
    (with_("settings.alert_webhooks", ["hooks.example.com/alerts"]), "settings.alert_webhooks[0]", "use an http(s) URL"),
    (with_("settings.alert_webhooks", ["https://"]), "settings.alert_webhooks[0]", "use an http(s) URL"),
    (with_("settings.alert_webhooks", ["https://hooks.example.com:99999/x"]), "settings.alert_webhooks[0]", "use an http(s) URL"),
    (with_("settings.alert_webhooks", ["https://alerts:pw@hooks.example.com/x"]), "settings.alert_webhooks[0]", "user:password@"),
    (with_("settings.alert_webhooks", ["https://hooks.example.com/x#top"]), "settings.alert_webhooks[0]", "#fragment"),
    (with_("settings.alert_webhooks", ["https://hooks.example.com/a b"]), "settings.alert_webhooks[0]", "without spaces"),
    (with_("settings.alert_webhooks", ["https://hooks.example.com/x\n"]), "settings.alert_webhooks[0]", "use an http(s) URL"),
    (with_("settings.alert_webhooks", [7]), "settings.alert_webhooks[0]", "write each webhook URL as a string"),
    (with_("settings.alert_webhooks", ["https://h.example.com/a", "https://h.example.com/a"]), "settings.alert_webhooks", "each webhook once"),
    (with_("settings.alert_webhooks", [f"https://h.example.com/{i}" for i in range(17)]), "settings.alert_webhooks", "at most 16 webhooks"),
    (with_("settings.alertmanager_port", 80), "settings.alertmanager_port", "1024 or above"),
    (with_("settings.alertmanager_port", 9090), "settings.alertmanager_port", "prometheus_port uses that port already"),
]


@pytest.mark.parametrize("document, field, fix", GRAMMAR_MISTAKES, ids=[m[1] + f"#{i}" for i, m in enumerate(GRAMMAR_MISTAKES)])
def test_a_value_outside_the_grammar_is_refused_naming_the_field_and_the_fix(document, field, fix):
    line = next((line for line in refused(document).splitlines() if line.startswith(f"  - {field} = ")), "")
    assert fix in line and len(line) < 600, line


def string_places(value, path: str = ""):
    """Every string of a document with its with_() path."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from string_places(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from string_places(item, f"{path}.{index}")
    elif isinstance(value, str):
        yield path, value


NEWLINE_PLACES = sorted(dict(string_places(with_("settings", {k: v for k, v in default_settings().items()
                                                                  if isinstance(v, str) and v}))).items())


@pytest.mark.parametrize("place, value", NEWLINE_PLACES, ids=[p for p, _ in NEWLINE_PLACES])
def test_a_value_ending_in_a_newline_is_refused_everywhere(place, value):
    """Every pattern matches the whole value: `$` alone took "spark-2\\n"."""
    assert refused(with_(place, value + "\n")).count("\n  - ") == 1


@pytest.mark.parametrize("overrides, field, fix", [
    ({"_ignore_errors": True}, "--data _ignore_errors", "_sudo_password"),
    ({"_continue_on_error": True}, "--data _continue_on_error", "_sudo_password"),
    ({"_sudo": False}, "--data _sudo", "_sudo_password"),
    ({"tensor_parallel": 4}, "--data tensor_parallel", "[profile.NAME]"),
    ({"served_name": "x"}, "--data served_name", "[model]"),
    ({"profile": "x" * 5000}, "--data profile", "characters)"),
])
def test_an_override_outside_the_settings_says_where_it_belongs(overrides, field, fix):
    line = next((line for line in refused(GOOD, overrides).splitlines() if line.startswith(f"  - {field} = ")), "")
    assert fix in line and len(line) < 600, line


def test_the_sudo_password_may_be_given_for_a_run():
    assert load(GOOD, {"_sudo_password": "x"}).size == 2


def test_a_site_nested_deeper_than_any_key_is_refused_plainly(tmp_path):
    for depth in (12, 2000):
        site = tmp_path / f"deep{depth}.toml"
        site.write_text(GOOD_SITE.format(port=22) + "\n[settings]\nvllm_extra_args = " + "[" * depth + "]" * depth + "\n")
        with pytest.raises(SiteError, match="nested"):
            load_site(site)


@pytest.mark.parametrize("path", ["/var/lib/dual-spark", "/var/lib/dual-spark-b/model", "/etc/dual-spark", "/opt/dual-spark.v2",
                                  "/data/models/deepseek", "/mnt/nvme/dual-spark", "/srv/models"])
def test_the_path_rule_allows_the_deploys_own_places(path):
    """The control case of the path rule's refusals above."""
    assert schema.owned_directory(path) is None and schema.own_top(path) is not None


@pytest.mark.parametrize("mount", ["/usr", "/opt/cuda-extras", "/var/cache/sparklab/vllm-cpu", "/root/.pyenv/versions/3.11.7",
                                   "/home/spark/venvs/x", "/data/shared"])
def test_a_mount_of_programs_or_data_is_taken(mount):
    """The control case: what a site (and the lab: a virtualenv and the Python it was made from) mounts."""
    assert load(with_("settings.container_mounts", [mount])).settings.container_mounts == [mount]


# Secrets stay secret (issue 39): what would undo a setting of the deploy's, carry a credential into
# a container or contradict another setting is refused by rule; each has a neighbour that is taken.
TOKEN = "hf_" + "aB3" * 11
DIGEST = "grafana/grafana-oss@sha256:" + "0" * 64
SECRET_MISTAKES = [
    # vllm_extra_args: the deploy's own flags, in every spelling vLLM reads, and secrets
    (with_("settings.vllm_extra_args", ["--port", "9000"]), "settings.vllm_extra_args[0]", "from vllm_port"),
    (with_("settings.vllm_extra_args", ["--port=9000"]), "settings.vllm_extra_args[0]", "from vllm_port"),
    (with_("settings.vllm_extra_args", ["--host", "0.0.0.0"]), "settings.vllm_extra_args[0]", "from the front door"),
    (with_("settings.vllm_extra_args", ["--enforce-eager", "--api_key=abc"]), "settings.vllm_extra_args[1]", "the API key file"),
    (with_("settings.vllm_extra_args", ["--api-key", "abc"]), "settings.vllm_extra_args[0]", "the API key file"),
    (with_("settings.vllm_extra_args", ["--no-enable-prefix-caching"]), "settings.vllm_extra_args[0]", "prefix_caching"),
    (with_("settings.vllm_extra_args", ["--max_model_len", "4096"]), "settings.vllm_extra_args[0]", "max_model_len"),
    (with_("settings.vllm_extra_args", ["--speculative-config.method=ngram"]), "settings.vllm_extra_args[0]", "speculative_method"),
    (with_("settings.vllm_extra_args", ["-tp", "1"]), "settings.vllm_extra_args[0]", "tensor_parallel"),
    (with_("settings.vllm_extra_args", ["--config", "/srv/vllm.yaml"]), "settings.vllm_extra_args[0]", "the site file"),
    (with_("settings.vllm_extra_args", ["--hos", "0.0.0.0"]), "settings.vllm_extra_args[0]", "vLLM reads --host"),
    (with_("settings.vllm_extra_args", ["-n4"]), "settings.vllm_extra_args[0]", "the [[node]] tables"),
    (with_("settings.vllm_extra_args", ["--uds=/run/v.sock"]), "settings.vllm_extra_args[0]", "from vllm_port"),
    (with_("settings.vllm_extra_args", ["--hf_token", "x"]), "settings.vllm_extra_args[0]", "hf_token_file"),
    (with_("settings.vllm_extra_args", ["--hf-token", TOKEN]), "settings.vllm_extra_args[1]", "hf_token_file"),
    # environments: no variable that carries a secret, no value that is a hub token
    (with_("settings.container_env", {"HF_TOKEN": "x"}), "settings.container_env", "hf_token_file"),
    (with_("settings.container_env", {"HUGGING_FACE_HUB_TOKEN": "x"}), "settings.container_env", "hf_token_file"),
    (with_("settings.container_env", {"HUGGINGFACEHUB_API_TOKEN": "x"}), "settings.container_env", "hf_token_file"),
    (with_("settings.container_env", {"VLLM_API_KEY": "x"}), "settings.container_env", "state_dir/api-key"),
    (with_("settings.container_env", {"OPENAI_API_KEY": "x"}), "settings.container_env", "state_dir/api-key"),
    (with_("settings.container_env", {"WANDB_API_KEY": "x"}), "settings.container_env", "keep it out of the site file"),
    (with_("settings.container_env", {"GITHUB_TOKEN": "x"}), "settings.container_env", "keep it out of the site file"),
    (with_("settings.container_env", {"S3_SECRET": "x"}), "settings.container_env", "keep it out of the site file"),
    (with_("settings.container_env", {"DB_PASSWORD": "x"}), "settings.container_env", "keep it out of the site file"),
    (with_("settings.container_env", {"NCCL_DEBUG": f"Bearer {TOKEN}"}), "settings.container_env.NCCL_DEBUG", "hf_token_file"),
    (with_("settings.serving_env", {"HF_TOKEN": TOKEN}), "settings.serving_env", "hf_token_file"),
    (with_("profile.adaptive", {"env": {"HF_TOKEN": "x"}}), "profile.adaptive.env", "hf_token_file"),
    (with_("image.tony-overlay", {"env": {"OPENAI_API_KEY": "x"}}), "image.tony-overlay.env", "state_dir/api-key"),
    # mounts and model sources: no credentials, no whole home, not the token's nor the deploy's directory
    (with_("settings.container_mounts", ["/home/spark/.cache"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/home/spark/.cache/pip"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/home/spark/.huggingface"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/root/.aws"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/home/spark/.docker/config"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/home/spark/.netrc"]), "settings.container_mounts[0]", "credentials"),
    (with_("settings.container_mounts", ["/home/spark"]), "settings.container_mounts[0]", "programs or data"),
    (with_("settings.container_mounts", ["/home/spark/tokens"], with_("settings.hf_token_file", "~/tokens/hub")),
     "settings.container_mounts[0]", "hf_token_file ~/tokens/hub is in it"),
    (with_("settings.container_mounts", ["/home/spark/secrets"], with_("settings.hf_token_file", "~/secrets/hf/token")),
     "settings.container_mounts[0]", "hf_token_file ~/secrets/hf/token is in it"),
    (with_("settings.container_mounts", ["/srv/ds"], with_("settings.state_dir", "/srv/ds/state")), "settings.container_mounts[0]", "API key"),
    (with_("model", {"path": "/home/spark", "served_name": "x", "tokenizer_mode": "auto"}), "model.path", "a whole home"),
    (with_("model", {"path": "/home/spark/.cache/huggingface/hub/models--x", "served_name": "x", "tokenizer_mode": "auto"}),
     "model.path", "credentials"),
    (with_("model", {"path": "/home/spark/tokens/w", "served_name": "x", "tokenizer_mode": "auto"}, with_("settings.hf_token_file", "~/tokens/hub")),
     "model.path", "hf_token_file"),
    (with_("model", {"path": "/srv/ds/weights", "served_name": "x", "tokenizer_mode": "auto"},
           with_("settings.model_dir", "/srv/ds-model", with_("settings.state_dir", "/srv/ds"))), "model.path", "state_dir is /srv/ds"),
    # the hub over https, http only when the site says so
    (with_("settings.hf_endpoint", "http://mirror.lan:8080"), "settings.hf_endpoint", "hf_endpoint_insecure_http = true"),
    (with_("settings.hf_endpoint_insecure_http", True), "settings.hf_endpoint_insecure_http", "is not http"),
    # host keys checked
    (with_("ssh.known_hosts", "/dev/null"), "ssh.known_hosts", "a real known_hosts file"),
    (with_("ssh.known_hosts", "/dev/../dev/null"), "ssh.known_hosts", "a real known_hosts file"),
    (with_("ssh.known_hosts", "//dev/null"), "ssh.known_hosts", "a real known_hosts file"),
    # contradictions
    (with_("settings.speculative_options", {"prompt_lookup_max": 3}, with_("profile.adaptive.speculative_tokens", 0)),
     "settings.speculative_options", "drafts no tokens"),
    (with_("settings.grafana_image", DIGEST, with_("settings.observability", False)), "settings.grafana_image", "observability = true"),
    (with_("settings.alert_webhooks", ["https://hooks.example.com/t?token=s3cr3t"], with_("settings.observability", False)),
     "settings.alert_webhooks", "installs no Alertmanager"),
    # the ports of unprivileged daemons
    (with_("settings.prometheus_port", 80), "settings.prometheus_port", "1024 or above"),
    (with_("settings.node_exporter_port", 443), "settings.node_exporter_port", "1024 or above"),
    (with_("settings.grafana_port", 1023), "settings.grafana_port", "1024 or above"),
    (with_("settings.api_port", 3000, with_("settings.grafana_image", DIGEST)), "settings.grafana_port", "api_port uses that port already"),
    # a container's secret: a root-only file under /etc/dual-spark, named by its path, never the secret itself
    (with_("settings.container_secrets", {"wandb": "secrets/wandb"}), "settings.container_secrets.wandb", "an absolute path"),
    (with_("settings.container_secrets", {"wandb": "0123456789abcdef0123"}), "settings.container_secrets.wandb", "not the secret itself"),
    (with_("settings.container_secrets", {"hub": TOKEN}), "settings.container_secrets.hub", "not the secret itself"),
    (with_("settings.container_secrets", {"wandb": "/home/spark/.wandb-key"}), "settings.container_secrets.wandb", "a home is its user's"),
    (with_("settings.container_secrets", {"wandb": "/root/wandb"}), "settings.container_secrets.wandb", "a home is its user's"),
    (with_("settings.container_secrets", {"wandb": "/tmp/wandb"}), "settings.container_secrets.wandb", "/etc/dual-spark/secrets/NAME"),
    (with_("settings.container_secrets", {"shadow": "/etc/shadow"}), "settings.container_secrets.shadow", "/etc/dual-spark/secrets/NAME"),
    (with_("settings.container_secrets", {"wandb": "/etc/dual-spark"}), "settings.container_secrets.wandb", "/etc/dual-spark/secrets/NAME"),
    (with_("settings.container_secrets", {"wandb": "/var/lib/dual-spark/wandb"}), "settings.container_secrets.wandb", "/etc/dual-spark/secrets/NAME"),
    (with_("settings.container_secrets", {"wandb": "/etc/dual-spark/secrets/../../shadow"}), "settings.container_secrets.wandb", "normalised"),
    (with_("settings.container_secrets", {"../x": "/etc/dual-spark/secrets/x"}), "settings.container_secrets", "/run/secrets/NAME"),
    (with_("settings.container_secrets", {"a b": "/etc/dual-spark/secrets/x"}), "settings.container_secrets", "/run/secrets/NAME"),
    (with_("settings.container_secrets", {"dual-spark-api-key": "/etc/dual-spark/secrets/x"}), "settings.container_secrets", "the deploy's own"),
    (with_("settings.container_secrets", {"x": "/etc/dual-spark/compose.yaml"}), "settings.container_secrets.x", "is the deploy's own (stack_dir)"),
    (with_("settings.container_secrets", {"x": "/etc/dual-spark/served/x"}), "settings.container_secrets.x", "is the deploy's own (stack_dir)"),
    (with_("settings.container_secrets", {"x": "/etc/dual-spark-state/x"}, with_("settings.state_dir", "/etc/dual-spark-state")),
     "settings.container_secrets.x", "state_dir is /etc/dual-spark-state"),
    (with_("settings.container_secrets", ["/etc/dual-spark/secrets/x"]), "settings.container_secrets", "NAME = "),
    (with_("client.deploy", {}), "client.deploy", "the door calls the deploy's own key 'deploy'"),
    (with_("client.Laptop", {}), "client.Laptop", "lower-case letters"),
]


@pytest.mark.parametrize("document, field, fix", SECRET_MISTAKES, ids=[m[1] + f"#{i}" for i, m in enumerate(SECRET_MISTAKES)])
def test_a_secret_an_undoing_or_a_contradiction_is_refused_naming_the_field_and_the_fix(document, field, fix):
    line = next((line for line in refused(document).splitlines() if line.startswith(f"  - {field} = ")), "")
    assert fix in line and len(line) < 600, line


def test_an_override_that_undoes_a_setting_is_refused_as_in_the_site():
    line = next(line for line in refused(GOOD, {"vllm_extra_args": ["--port=1"]}).splitlines() if "--data vllm_extra_args[0] = " in line)
    assert "vllm_port" in line


# The neighbours: (document, what the cluster holds, the value it must hold)
SECRET_NEIGHBOURS = [
    (with_("settings.vllm_extra_args", ["--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes=1000", "--tokenizer", "/srv/t", "-O3"]),
     lambda c: c.settings.vllm_extra_args, ["--enforce-eager", "--dtype", "float32", "--kv-cache-memory-bytes=1000", "--tokenizer", "/srv/t", "-O3"]),
    (with_("settings.container_env", {"NCCL_DEBUG": "INFO", "VLLM_MAX_TOKENS": "8", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
                                      "NAME": "hf_short"}),
     lambda c: sorted(c.settings.container_env), ["HF_HUB_OFFLINE", "NAME", "NCCL_DEBUG", "TOKENIZERS_PARALLELISM", "VLLM_MAX_TOKENS"]),
    (with_("profile.adaptive", {"env": {"VLLM_USE_V1": "1"}}), lambda c: c.profiles["adaptive"].env, {"VLLM_USE_V1": "1"}),
    (with_("settings.container_mounts", ["/srv/data", "/home/spark/venvs/x", "/home/spark/.local/share/uv/python", "/home/spark/tokens-old"],
           with_("settings.hf_token_file", "~/tokens/hub")),
     lambda c: c.settings.container_mounts, ["/srv/data", "/home/spark/venvs/x", "/home/spark/.local/share/uv/python", "/home/spark/tokens-old"]),
    (with_("model", {"path": "/home/spark/models/dsv4", "served_name": "x", "tokenizer_mode": "auto"}), lambda c: c.model.path, "/home/spark/models/dsv4"),
    (with_("model", {"path": "/srv/ds-weights", "served_name": "x", "tokenizer_mode": "auto"},
           with_("settings.model_dir", "/srv/ds-model", with_("settings.state_dir", "/srv/ds"))), lambda c: c.model.path, "/srv/ds-weights"),
    (with_("settings.hf_endpoint", "http://mirror.lan:8080", with_("settings.hf_endpoint_insecure_http", True)),
     lambda c: (c.settings.hf_endpoint, c.settings.hf_endpoint_insecure_http), ("http://mirror.lan:8080", True)),
    (with_("settings.hf_endpoint", "https://mirror.lan"), lambda c: c.settings.hf_endpoint, "https://mirror.lan"),
    (with_("ssh.known_hosts", "~/.ssh/known_hosts"), lambda c: c.known_hosts, "~/.ssh/known_hosts"),
    (with_("settings.speculative_options", {"prompt_lookup_max": 3}), lambda c: c.settings.speculative_options, {"prompt_lookup_max": 3}),
    (with_("settings.grafana_image", DIGEST), lambda c: c.settings.grafana_image, DIGEST),
    (with_("settings.api_port", 3000), lambda c: c.settings.api_port, 3000),
    (with_("settings.api_port", 9090, with_("settings.observability", False)), lambda c: c.settings.api_port, 9090),
    (with_("settings.api_port", 80), lambda c: c.settings.api_port, 80),
    (with_("settings.prometheus_port", 1024), lambda c: c.settings.prometheus_port, 1024),
    (with_("settings.container_secrets", {"wandb": "/etc/dual-spark/secrets/wandb", "S3.key_2": "/etc/dual-spark-keys/s3/key",
                                          "x": "/etc/dual-spark/x"}),
     lambda c: c.settings.container_secrets, {"wandb": "/etc/dual-spark/secrets/wandb", "S3.key_2": "/etc/dual-spark-keys/s3/key",
                                              "x": "/etc/dual-spark/x"}),
    (with_("client.deployer", {}, with_("client.laptop", {})), lambda c: c.clients, ("deployer", "laptop")),
    (with_("settings.alert_webhooks", ["https://hooks.example.com/services/T0/B1?token=s3cr3t", "http://10.9.0.5:8080/alerts",
                                       "http://[fd00::5]:9000", "https://hooks.example.com/services/T0/B2"]),
     lambda c: c.settings.alert_webhooks, ["https://hooks.example.com/services/T0/B1?token=s3cr3t", "http://10.9.0.5:8080/alerts",
                                           "http://[fd00::5]:9000", "https://hooks.example.com/services/T0/B2"]),
    (with_("settings.alert_webhooks", []), lambda c: c.settings.alert_webhooks, []),
    (with_("settings.alertmanager_port", 9090, with_("settings.observability", False)), lambda c: c.settings.alertmanager_port, 9090),
    (with_("settings.alertmanager_port", 19093), lambda c: c.settings.alertmanager_port, 19093),
]


@pytest.mark.parametrize("webhooks", [["ftp://hooks.example.com/t/s3cr3t"], ["https://hooks.example.com/t?token=s3cr3t"] * 2,
                                      "https://hooks.example.com/t/s3cr3t", ["hooks.example.com/s3cr3t"], {"a": "https://h/s3cr3t"},
                                      ["https://user:s3cr3t@hooks.example.com/"]])
def test_a_refused_webhook_is_quoted_without_what_may_be_its_token(webhooks):
    """A webhook's URL may hold a token: a refusal names the field and the fix, and quotes the URL to
    its host at most, in the site file and as --data alike."""
    for message in (refused(with_("settings.alert_webhooks", webhooks)), refused(GOOD, {"alert_webhooks": webhooks})):
        assert "alert_webhooks" in message and "s3cr3t" not in message, message


def test_webhooks_with_observability_off_are_refused_quoted_to_their_host():
    message = refused(with_("settings.alert_webhooks", ["https://hooks.example.com/t?token=s3cr3t"], with_("settings.observability", False)))
    assert "['https://hooks.example.com/(not shown)']" in message and "s3cr3t" not in message, message


@pytest.mark.parametrize("document, held, value", SECRET_NEIGHBOURS, ids=[f"#{i}" for i in range(len(SECRET_NEIGHBOURS))])
def test_the_legitimate_neighbour_of_each_refusal_is_taken(document, held, value):
    assert held(load(document)) == value


@pytest.mark.parametrize("first_line", ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI spark@host\n", "", "-----BEGIN PUBLIC KEY-----\n"])
def test_an_ssh_key_that_is_not_a_private_key_is_refused(tmp_path, first_line):
    key = tmp_path / "id_ed25519.pub"
    key.write_text(first_line)
    line = next((line for line in refused(with_("ssh.key", str(key))).splitlines() if line.startswith("  - ssh.key = ")), "")
    assert "not a private key" in line, line


@pytest.mark.parametrize("header", ["OPENSSH PRIVATE KEY", "RSA PRIVATE KEY", "PRIVATE KEY"])
def test_a_private_key_is_taken(tmp_path, header):
    key = tmp_path / "id"
    key.write_text(f"-----BEGIN {header}-----\nAAAA\n-----END {header}-----\n")
    assert load(with_("ssh.key", str(key))).ssh_key == str(key)


def test_a_known_hosts_that_links_to_dev_null_is_refused_and_a_real_file_taken(tmp_path):
    (tmp_path / "nothing").symlink_to("/dev/null")
    (tmp_path / "known_hosts").write_text("")
    assert "a real known_hosts file" in refused(with_("ssh.known_hosts", str(tmp_path / "nothing")))
    assert load(with_("ssh.known_hosts", str(tmp_path / "known_hosts"))).known_hosts == str(tmp_path / "known_hosts")


@pytest.mark.parametrize("secret", ["id_ed25519", ".ssh/known_hosts", "hf/token", "certs/server.key", ".env", ".cache/huggingface/stored_tokens"])
def test_a_build_context_that_holds_credentials_is_refused(tmp_path, secret):
    """The context goes to every node and into the image: a credential in it would too."""
    (tmp_path / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / secret).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / secret).write_text("secret\n")
    message = refused(with_("image.tony-overlay", {"build": str(tmp_path)}))
    assert f"image.tony-overlay.build = '{tmp_path}': {secret.split('/')[0] if secret.startswith('.') else secret} in it holds " \
           "credentials" in message, message


def test_a_build_context_of_a_dockerfile_and_its_files_is_accepted(tmp_path):
    (tmp_path / "Dockerfile").write_text("FROM scratch\nCOPY overlay /overlay\n")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay/tokenizer.py").write_text("# not a token\n")
    (tmp_path / "overlay/keys.py").write_text("KEYS = []\n")
    assert load(with_("image.tony-overlay", {"build": str(tmp_path)})).images["tony-overlay"].build == str(tmp_path)
