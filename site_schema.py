"""The site file's schema as data: every key of every table with its type, its bounds or grammar,
and the fix a person reads when a value is wrong. One engine (`Checker`) reads these tables; the
relations between keys (distinct ports, nested directories, rails) are checked in site_config.py.

A `Key` checks one value: its kind first (booleans are never numbers), then its own rule, which
returns None or the fix. Lists check each item, tables each name and value."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import posixpath
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from layout import ITL_BUCKETS, TTFT_BUCKETS, VLLM_FLAG_ALIASES, VLLM_FLAG_PREFIXES, VLLM_FLAGS

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,63}")
NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
CLIENT_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
COMMIT = re.compile(r"[0-9a-f]{40}")
DIGEST_REF = re.compile(r"[a-z0-9][a-z0-9._/:-]*@sha256:([0-9a-f]{64})")
HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
SERVED_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
COMMAND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}")
NETDEV = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,14}")
RDMA = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
USER = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
DNS_NAME = re.compile(r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
DEBIAN_PACKAGE = re.compile(r"[a-z0-9][a-z0-9+.-]+")
PATH_TEXT = re.compile(r"/[A-Za-z0-9_.+@/-]*")
HUB_TOKEN = re.compile(r"hf_[A-Za-z0-9]{30,}")
TOKEN_FIX = ("the hub token belongs in hf_token_file (a file of the deploy user's, read only by the hub fetch): "
             "take it out of the site file, and revoke it on the hub if the file was shared")
ULIMITS = ("core", "cpu", "data", "fsize", "locks", "memlock", "msgqueue", "nice", "nofile", "nproc", "rss",
           "rtprio", "rttime", "sigpending", "stack")
# The path rule: where the deploy's own directories (state_dir, model_dir, stack_dir) may live.
# System locations take one directory named for the deploy (dual-spark or dual-spark-*) and what
# is inside it; a data disk's mount (/data, /mnt, /media, /srv) takes any directory below it.
# Everything else is refused. On the node the marker is the second line: an
# existing directory without it is never changed (operations/own.py).
SYSTEM_HOMES = ("/etc", "/var/lib", "/opt")
DATA_ROOTS = ("/data", "/mnt", "/media", "/srv")
OWN_NAME = re.compile(r"dual-spark([-.][A-Za-z0-9_+@-][A-Za-z0-9_.+@-]*)?")
PATH_RULE = ("use /var/lib/dual-spark[/...], /etc/dual-spark[/...], /opt/dual-spark[/...] (or a dual-spark-* "
             "directory there), or a directory of its own on a data disk, under /data, /mnt, /media or /srv")
COMPONENT = re.compile(r"[A-Za-z0-9_.+@-]{1,64}")
MAX_PATH = 255
NETPLAN_OF_THE_SYSTEM = re.compile(r"(00-installer-config|01-netcfg|01-network-manager-all|50-cloud-init|90-NM-.*)\.yaml")

MAX_TEXT = 4096  # characters of any one string
MAX_ITEMS = 1024  # entries of any one list or table
Rule = Callable[[object], "str | None"]


@dataclass(frozen=True)
class Key:
    """One key: its kind, the fix for a value of another kind, and a rule for the value itself.
    ``item`` checks list items and table values; ``names`` checks a table's own key names."""

    kind: type | tuple[type, ...]
    fix: str
    rule: Rule | None = None
    item: Key | None = None
    names: Key | None = None
    required: bool = False
    default: object = None  # a setting's default (SETTINGS)
    doc: str = ""  # what a setting is, in a line (SETTINGS)
    shown: Callable[[object], object] | None = None  # how a refusal quotes a value that may hold a secret


def kind_ok(value, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if float in kinds and isinstance(value, int):
        return True
    return isinstance(value, kinds)


# Rules: each returns None for a good value, else the fix.

def between(low, high, fix: str) -> Rule:
    return lambda value: None if low <= value <= high else fix


def above(low, high, fix: str) -> Rule:
    return lambda value: None if low < value <= high else fix


def matching(pattern: re.Pattern, fix: str) -> Rule:
    return lambda value: None if pattern.fullmatch(value) else fix


def one_of(*choices) -> Rule:
    return lambda value: None if value in choices else f"use one of {', '.join(map(repr, choices))}"


def single_line(value: str) -> str | None:
    return "write it on one line, without control characters" if CONTROL.search(value) else None


def absolute_path(value: str) -> str | None:
    """An absolute, normalised path of at most 255 characters, each component a name of 1 to 64
    letters, digits and '_.+@-' (not '.' or '..')."""
    if len(value) > MAX_PATH:
        return f"use a path of at most {MAX_PATH} characters"
    if not PATH_TEXT.fullmatch(value):
        return "use an absolute path of letters, digits and '_.+@-/' (no spaces, quotes or ':')"
    if posixpath.normpath(value) != value or value.startswith("//"):
        return f"write the path normalised: {posixpath.normpath(value)!r}"
    if any(not COMPONENT.fullmatch(part) for part in value.strip("/").split("/") if value != "/"):
        return "name each directory with 1 to 64 letters, digits and '_.+@-'"
    return None


def own_top(path: str) -> str | None:
    """The topmost directory of ``path`` that is the deploy's own (the deploy makes it and what is
    below it; its parent must exist): the dual-spark directory in a system location, the path
    itself on a data disk. None where the path rule does not allow ``path``."""
    parts = path.strip("/").split("/")
    for home in SYSTEM_HOMES:
        depth = home.count("/")
        if path.startswith(home + "/") and OWN_NAME.fullmatch(parts[depth]):
            return "/" + "/".join(parts[:depth + 1])
    if any(path.startswith(root + "/") for root in DATA_ROOTS):
        return path
    return None


def owned_directory(value: str) -> str | None:
    """A directory the deploy creates, fills and may clean: only where the path rule allows."""
    return absolute_path(value) or (None if own_top(value) else PATH_RULE)


def file_under(directory: str, suffix: str, example: str) -> Rule:
    pattern = re.compile(rf"{re.escape(directory)}/[A-Za-z0-9_][A-Za-z0-9_.-]{{0,63}}{re.escape(suffix)}")
    return lambda value: None if pattern.fullmatch(value) else f"use a file directly under {directory}/ ending in {suffix}, e.g. {example}"


def netplan_file(value: str) -> str | None:
    problem = file_under("/etc/netplan", ".yaml", "/etc/netplan/40-dual-spark.yaml")(value)
    if problem:
        return problem
    if NETPLAN_OF_THE_SYSTEM.fullmatch(posixpath.basename(value)):
        return "that file configures the management LAN (the installer's, cloud-init's or NetworkManager's): keep 40-dual-spark.yaml"
    return None


def token_file(value: str) -> str | None:
    """The hub token: a file of the deploy user's, in its home on the head."""
    fix = "use a path under ~/ (the deploy user's home on the head), e.g. ~/.cache/huggingface/token"
    if not value.startswith("~/") or len(value) < 3:
        return fix
    return absolute_path(value[1:]) and fix


def api_address(value: str) -> str | None:
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return "use an IPv4 address (127.0.0.1 keeps the API on loopback)"
    if address.version != 4:
        return "use an IPv4 address: the API, its tunnel and the clients speak IPv4 (127.0.0.1 keeps it on loopback)"
    if address.is_multicast or address.is_reserved or address == ipaddress.IPv4Address("255.255.255.255"):
        return "use an address of this machine (127.0.0.1 keeps the API on loopback)"
    return None


def hub_url(value: str) -> str | None:
    fix = "use the hub's URL, http(s)://host[:port][/path], e.g. https://huggingface.co"
    if CONTROL.search(value) or re.search(r"[\s\"'`$\\;|&<>]", value):
        return fix
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return fix
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or parts.username:
        return fix
    return None


WEBHOOK_FIX = ("use an http(s) URL, http(s)://host[:port][/path][?query], without spaces, quotes, a #fragment or "
               "user:password@ (a token goes in the path or query)")


def webhook_url(value: str) -> str | None:
    """A receiver's webhook: http(s), a host, and a token (if any) in the path or query, where the
    deploy's diff cuts it off (facts/alerting.py); never a user:password@, which it would show."""
    if CONTROL.search(value) or re.search(r"[\s\"'`\\<>{}|^]", value):
        return WEBHOOK_FIX
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        return WEBHOOK_FIX
    if parts.scheme not in ("http", "https") or not parts.hostname or "@" in parts.netloc or "#" in value:
        return WEBHOOK_FIX
    return None


def url_shown(value):
    """A value as a refusal quotes it where it may hold webhook URLs: each string cut after its
    scheme and host (the rest may be a token), in lists and tables too."""
    if isinstance(value, str):
        match = re.match(r"[a-z][a-z0-9+.-]*://[^/?#@\s]*(?=[/?#]|\Z)", value)
        if match is None:
            return "(not shown: it may hold a token)"
        return match.group(0) + ("/(not shown)" if len(value) > match.end() else "")
    if isinstance(value, list):
        return [url_shown(item) for item in value]
    if isinstance(value, dict):
        return {url_shown(name): url_shown(item) for name, item in value.items()}
    return value


def webhooks(value: list) -> str | None:
    if len(value) > 16:
        return "name at most 16 webhooks"
    named = [url for url in value if isinstance(url, str)]  # the others are refused as items
    return "name each webhook once" if len(set(named)) != len(named) else None


def ssh_address(value: str) -> str | None:
    """An IP address in its one canonical spelling, or a DNS name that no resolver reads as an
    address (127.0.0.021 is 127.0.0.17 to ssh, 2130706453 is 127.0.0.21)."""
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        address = None
    if address is not None:
        if address.version == 6 and address.ipv4_mapped:
            return f"write the IPv4 address as such: {address.ipv4_mapped}"
        return None if str(address) == value else f"write the address canonically: {address}"
    try:
        read_as = socket.inet_ntoa(socket.inet_aton(value))
    except OSError:
        read_as = None
    if read_as is not None:
        return f"ssh reads {value!r} as the address {read_as} (octal, hex or a bare number): write {read_as}"
    if not DNS_NAME.fullmatch(value) or value.rstrip(".").rsplit(".", 1)[-1].isdecimal():
        return "use the node's management IP address (dotted, e.g. 192.168.1.21) or DNS name (letters, digits, '-', '.')"
    return None


def host_key(value: str) -> str:
    """What a canonical SSH host is compared by: one machine, one key (localhost is 127.0.0.1)."""
    name = value.lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return "127.0.0.1"
    if name in ("ip6-localhost", "ip6-loopback"):
        return "::1"
    return name


PRIVATE_KEY = re.compile(r"-----BEGIN (OPENSSH |RSA |EC |DSA |ENCRYPTED )?PRIVATE KEY-----")


def private_key(value: str) -> str | None:
    """The key pyinfra logs in with is on this machine: check it here, not at the first connection.
    Its first line is a private key's (OpenSSH or PEM), not a public key's."""
    if not value.startswith(("/", "~/")) or CONTROL.search(value):
        return "use the private key's absolute path or ~/..."
    path = os.path.expanduser(value)
    if not os.path.isfile(path):
        return "no such file on this machine: name the private key pyinfra logs in with (ssh-keygen makes one)"
    try:
        with open(path, "rb") as key:
            first = key.readline(100).decode("ascii", "replace").strip()
    except OSError as error:
        return f"cannot be read here ({error.strerror}): name a private key this user can read"
    if not PRIVATE_KEY.fullmatch(first):
        return "not a private key (a .pub is the public half): name the file without .pub, whose first line is -----BEGIN ... PRIVATE KEY-----"
    return None


def known_hosts_file(value: str) -> str | None:
    """Where pyinfra checks the nodes' host keys: a real file, never a device that reads as empty
    and takes any key."""
    if not value.startswith(("/", "~/")) or CONTROL.search(value):
        return "use an absolute path or ~/..."
    resolved = os.path.realpath(posixpath.normpath(os.path.expanduser(value)))
    if resolved == "/dev" or resolved.startswith(("/dev/", "/proc/")):
        return "that turns host-key checking off: point to a real known_hosts file, or drop the key for ~/.ssh/known_hosts"
    return None


def gpus(value: str) -> str | None:
    return None if re.fullmatch(r"|all|[1-9][0-9]?", value) else "use \"all\", a GPU count, or \"\" for none"


def gid_index(value) -> str | None:
    if isinstance(value, str):
        return None if value == "auto" else "use \"auto\" (found per node) or a GID table index 0-255"
    return None if 0 <= value <= 255 else "use \"auto\" (found per node) or a GID table index 0-255"


def rail_address(value: str) -> str | None:
    fix = "use a unicast IPv4 host address with its prefix, in a subnet with room for both ends, e.g. 10.0.0.1/24"
    try:
        interface = ipaddress.IPv4Interface(value)
    except (ipaddress.AddressValueError, ipaddress.NetmaskValueError, ValueError):
        return fix
    ip, network = interface.ip, interface.network
    if network.prefixlen > 30 or ip in (network.network_address, network.broadcast_address):
        return fix
    if ip.is_loopback or ip.is_multicast or ip.is_unspecified or ip.is_reserved:
        return fix
    return None


def command_or_path(value: str) -> str | None:
    if COMMAND.fullmatch(value):
        return None
    return absolute_path(value) and "use a command name (python3) or an absolute path inside the image (/opt/env/bin/python)"


# What a container may be given read-only: programs and data, never credentials or state. A
# mount is one of these places or lies in one, or lies inside a home (below the home itself),
# with no directory on its way where credentials live.
MOUNT_PLACES = ("/usr", "/opt", "/srv", "/data", "/mnt", "/media", "/var/cache", "/var/opt")
CREDENTIALS = (".ssh", ".gnupg", ".aws", ".docker", ".kube", ".netrc", ".password-store", ".config", ".cache", ".huggingface")
CREDENTIALS_FIX = "that directory holds credentials (keys, tokens, the hub's login): name programs or data only"


def in_home(value: str) -> str | None:
    """What ``value`` names inside a home (/home/USER or /root): "" for the home itself, None
    outside every home."""
    parts = value.strip("/").split("/")
    home = 2 if parts[0] == "home" else 1 if parts[0] == "root" else 0  # the components naming the home
    return "/".join(parts[home:]) if home and len(parts) >= home else None


def holds_credentials(inside: str) -> bool:
    return any(inside == name or inside.startswith(name + "/") for name in CREDENTIALS)


# What names credentials among a build context's files: a private key, a login's file or a token.
CREDENTIAL_FILE = re.compile(r"(id_(rsa|ecdsa|ed25519|dsa)|\.netrc|\.git-credentials|\.pypirc|\.env|token|credentials"
                             r"|.*\.(pem|key|p12|pfx))", re.IGNORECASE)


def build_secret(context: Path) -> str | None:
    """The first file or directory of a Docker build context that holds credentials (it is sent
    to every node and baked into the image), or None."""
    for path in sorted(context.rglob("*")):
        relative = path.relative_to(context).as_posix()
        if holds_credentials(relative) or CREDENTIAL_FILE.fullmatch(path.name):
            return relative
    return None


def container_mount(value: str) -> str | None:
    """A host path every runtime container gets read-only (a container runs the model's code)."""
    problem = absolute_path(value)
    if problem:
        return problem
    inside = in_home(value)
    if inside:
        return CREDENTIALS_FIX if holds_credentials(inside) else None
    if any(value == place or value.startswith(place + "/") for place in MOUNT_PLACES):
        return None
    return (f"mount programs or data: {', '.join(MOUNT_PLACES)}, what is in them, or a directory inside a home, "
            "e.g. /opt/cuda-extras (a container runs the model's code)")


# The devices a runtime container may be given: the fabric's and the GPU's, never a disk or memory.
DEVICES = re.compile(r"/dev/(infiniband(/[A-Za-z0-9_.-]+)?|nvidia[A-Za-z0-9_-]*|dri(/[A-Za-z0-9_.-]+)?)")


def container_device(value: str) -> str | None:
    """A host device every runtime container gets (a container runs the model's code)."""
    if absolute_path(value) or not DEVICES.fullmatch(value):
        return "use an RDMA or GPU device: /dev/infiniband (or a device in it), /dev/nvidia*, /dev/dri"
    return None


# A secret a site gives its vLLM containers: a file of root's on every node, in a directory of the
# deploy's name under /etc, mounted read-only at /run/secrets/NAME (operations/own.py checks it there).
SECRET_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
SECRETS_HOME = "/etc/dual-spark/secrets"
SECRET_RULE = (f"keep it in a root-only file under {SECRETS_HOME}/ (or another directory under /etc/dual-spark or "
               f"/etc/dual-spark-*), e.g. {SECRETS_HOME}/NAME, made with: sudo install -d -m 700 {SECRETS_HOME} && "
               f"sudo sh -c 'umask 077 && cat > {SECRETS_HOME}/NAME'")


def secret_name(value: str) -> str | None:
    """The file name a secret has in the container, /run/secrets/NAME: never the deploy's own."""
    if not SECRET_FILE_NAME.fullmatch(value):
        return "name the secret with 1 to 64 letters, digits and '_.-', starting with a letter or digit (it is /run/secrets/NAME in the container)"
    if value.lower().startswith("dual-spark"):
        return "names starting with dual-spark are the deploy's own (/run/secrets/dual-spark-api-key): choose another"
    return None


def secret_file(value: str) -> str | None:
    """Where a secret lives on every node: a file in a directory of the deploy's name under /etc,
    never a home, a shared directory or the secret itself."""
    if not value.startswith("/"):
        return f"name the file that holds the secret on every node (an absolute path), not the secret itself: {SECRET_RULE}"
    problem = absolute_path(value)
    if problem:
        return problem
    if in_home(value) is not None:
        return f"a home is its user's to change, and the deploy reads no secret from one: {SECRET_RULE}"
    top = own_top(value)
    if not (value.startswith("/etc/") and top and top != value):
        return SECRET_RULE
    return None


MODEL_SOURCES = ("/home", "/srv", "/data", "/mnt", "/media", "/opt")


def model_path(value: str) -> str | None:
    """A local model source: a directory of weights under a place that holds data, never a
    system tree (the copy runs as the deploy user, who must be able to read it)."""
    problem = absolute_path(value)
    if problem:
        return problem
    if not any(value.startswith(root + "/") for root in MODEL_SOURCES):
        return f"name the weights' own directory under {', '.join(MODEL_SOURCES)}, readable by the deploy user"
    inside = in_home(value)
    if inside == "":
        return "name the weights' own directory inside the home, e.g. /home/spark/models/NAME: a whole home holds its credentials"
    return CREDENTIALS_FIX if inside and holds_credentials(inside) else None


def vllm_flag(argument: str) -> str:
    """The flag an argument of `vllm serve` names, as vLLM reads it: without its value (=...) or
    a JSON field (.name), with '_' as '-', and --no-X as --X."""
    dashes = len(argument) - len(argument.lstrip("-"))
    name = argument[:dashes] + re.split(r"[=.]", argument[dashes:], maxsplit=1)[0].replace("_", "-")
    return "--" + name[5:] if name.startswith("--no-") else name


OWN_FLAGS = {**VLLM_FLAGS, **VLLM_FLAG_ALIASES}


def own_flag(argument: str) -> str | None:
    """The deploy's flag an argument sets: itself, the one it abbreviates (--hos), or a short one
    with its value written on (-n4)."""
    flag = vllm_flag(argument)
    if flag in OWN_FLAGS:
        return flag
    if flag.startswith("--"):
        begun = len(flag) > 2 and flag not in VLLM_FLAG_PREFIXES
        return next((own for own in OWN_FLAGS if begun and own.startswith(flag)), None)
    short = [own for own in OWN_FLAGS if not own.startswith("--")]
    return next((own for own in short if len(flag) > 1 and (own.startswith(flag) or flag.startswith(own))), None)


def vllm_argument(value: str) -> str | None:
    """One of vllm_extra_args: never a flag the deploy sets itself, never a secret."""
    if not value:
        return "drop empty arguments"
    if HUB_TOKEN.search(value):
        return TOKEN_FIX
    flag = own_flag(value)
    if flag:
        written = value.split("=", 1)[0]
        named = flag if written == flag else f"{written} (vLLM reads {flag})"
        return f"{named} is set by the deploy, from {OWN_FLAGS[flag]}: drop it from vllm_extra_args"
    return single_line(value)


# What names a secret in an environment: the hub's token, an API key, or any token, key, secret or password.
HUB_TOKEN_NAMES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HUGGINGFACEHUB_API_TOKEN")
SECRET_NAME = re.compile(r"(.*_)?(TOKEN|API_KEY|SECRET|PASSWORD)", re.IGNORECASE)


def env_name(value: str) -> str | None:
    """A variable every runtime container gets: never one that carries a secret (compose.yaml and
    `docker inspect` show the environment to whoever reads them)."""
    if not ENV_NAME.fullmatch(value):
        return "name environment variables with letters, digits and '_', not starting with a digit"
    if value.upper() in HUB_TOKEN_NAMES:
        return TOKEN_FIX
    if value.upper() in ("VLLM_API_KEY", "OPENAI_API_KEY"):
        return "the API key is the deploy's: it makes state_dir/api-key and hands it to vLLM itself; drop this variable"
    if SECRET_NAME.fullmatch(value):
        return "the deploy gives a container no secret of the site's (the environment is readable in compose.yaml): keep it out of the site file"
    return None


def env_value(value: str) -> str | None:
    return TOKEN_FIX if HUB_TOKEN.search(value) else single_line(value)


# Shapes reused across tables.

def env_table(fix_where: str) -> Key:
    return Key(dict, f"write {fix_where} as a table of NAME = \"value\"", names=Key(str, "use a name", env_name),
               item=Key(str, "write environment values as strings (quote numbers: \"1\")", env_value))


def scalar(value) -> str | None:
    """An option's value vLLM takes on its command line: bounded, finite, one short line."""
    if isinstance(value, str):
        return single_line(value) or (None if len(value) <= 256 else "use at most 256 characters")
    if isinstance(value, float) and not math.isfinite(value):
        return "use a finite number"
    return None if isinstance(value, bool) or abs(value) <= 2**31 else "use a number within ±2,147,483,648"


SCALAR_TABLE = Key(dict, "write a table", names=Key(str, "use a name", matching(IDENTIFIER, "use lower-case option names (letters, digits, '_')")),
                   item=Key((str, int, float, bool), "use a string, number or true/false", scalar))


def speculative_options(value: dict) -> str | None:
    taken = sorted(set(value) & {"method", "num_speculative_tokens", "model", "num_speculative_tokens_per_batch_size",
                                 "enable_adaptive_verification"})
    return (f"{', '.join(taken)} come from speculative_method and the profile's speculative_tokens, speculative_schedule and "
            "adaptive_verification: set those instead") if taken else None


def generation_config(value: dict) -> str | None:
    """The request defaults vLLM would refuse only once it starts (after the pair was stopped)."""
    def number(key: str) -> bool:
        return isinstance(value.get(key), (int, float)) and not isinstance(value.get(key), bool)
    if "temperature" in value and not (number("temperature") and 0 <= value["temperature"] <= 2):
        return "use a temperature from 0 to 2 (0.0: greedy)"
    if "top_p" in value and not (number("top_p") and 0 < value["top_p"] <= 1):
        return "use a top_p above 0 and at most 1"
    for key in ("max_new_tokens", "max_tokens"):
        if key in value and not (number(key) and isinstance(value[key], int) and value[key] >= 1):
            return f"use a whole number of 1 or more for {key}"
    return None


MAX_SEQS = 1024
SCHEDULE_EXAMPLE = "e.g. [[1, 1, 7], [2, 4, 3]]: 7 draft tokens for one sequence, 3 for two to four"


def schedule_range(value: list) -> str | None:
    """One [batch_start, batch_end, k] of a speculative schedule: inclusive batch sizes from 1 (k
    is checked against speculative_tokens with the profile)."""
    if len(value) != 3:
        return f"write each range as [batch_start, batch_end, k], {SCHEDULE_EXAMPLE}"
    if not all(kind_ok(number, int) for number in value):
        return None  # each number names its own mistake
    start, end, k = value
    if not 1 <= start <= end <= MAX_SEQS:
        return f"start each range at batch size 1 or more and end it at or after its start, at most {MAX_SEQS}, {SCHEDULE_EXAMPLE}"
    if not 0 <= k <= 16:
        return "draft 0 (no drafting at these batch sizes) to 16 tokens"
    return None


def speculative_schedule(value: list) -> str | None:
    """The ranges in order from batch size 1, each starting where the one before ended (vLLM
    refuses overlaps and a first range not from 1 only once it starts)."""
    if not value:
        return f"list at least one [batch_start, batch_end, k] range, or drop the key for one fixed speculative_tokens ({SCHEDULE_EXAMPLE})"
    if not all(isinstance(entry, list) and len(entry) == 3 and all(kind_ok(n, int) for n in entry) and schedule_range(entry) is None
               for entry in value):
        return None  # each range names its own mistake
    following = 1
    for start, end, _ in value:
        if start != following:
            where = "start the first range at batch size 1" if following == 1 else f"start the range after batch size {following - 1} at {following}"
            return f"{where}: the ranges go in order, without gaps or overlaps, {SCHEDULE_EXAMPLE}"
        following = end + 1
    return None


def positive(high: int, fix: str) -> Key:
    return Key(int, "use a whole number", between(1, high, fix))


def bucket_bound(bounds: tuple[float, ...], histogram: str) -> Rule:
    """An objective's bound: one of the bucket bounds of vLLM's histogram of ``histogram``."""
    return lambda value: None if value in bounds else f"use a bucket bound of vLLM's {histogram} histogram: {', '.join(map(str, bounds))} (seconds)"


def port() -> Key:
    return Key(int, "use a whole number", between(1, 65535, "use a TCP port between 1 and 65535"))


def daemon_port(daemon: str) -> Key:
    """The port of a daemon that runs as its own unprivileged user: it cannot bind below 1024."""
    return Key(int, "use a whole number", between(1024, 65535, f"use a port of 1024 or above (to 65535): {daemon} runs unprivileged"))


def text(rule: Rule, fix: str = "use a string", required: bool = False) -> Key:
    return Key(str, fix, rule, required=required)


def flag() -> Key:
    return Key(bool, "use true or false")


def setting(default, key: Key, doc: str) -> Key:
    """A site setting: its default, its rule and what it is, declared together."""
    return dataclasses.replace(key, default=default, doc=doc)


SSH = {
    "user": text(matching(USER, "set the deploy user, a Linux user name present on both Sparks"), required=True),
    "key": text(private_key),
    "port": port(),
    "known_hosts": text(known_hosts_file),
}

RAIL = {
    "netdev": text(matching(NETDEV, "use the CX-7 interface name (at most 15 letters, digits, '_.-'), e.g. enp1s0f0np0"), required=True),
    "rdma": text(matching(RDMA, "use the RDMA device of that interface (ls /sys/class/infiniband), e.g. rocep1s0f0"), required=True),
    "address": text(rail_address, required=True),
    "gid_index": Key((str, int), "use \"auto\" (found per node) or a GID table index 0-255", gid_index),
}

NODE = {
    "role": text(one_of("head", "worker")),
    "rank": Key(int, "use a whole number", between(0, 63, "use the node's rank: 0 for the head, then 1, 2, ... (at most 63)")),
    "hostname": text(matching(HOSTNAME, "set the node's hostname (letters, digits, '-')"), required=True),
    "ssh_host": text(ssh_address, required=True),
    "rail": Key(list, "declare each rail as [[node.rail]] under its [[node]]", required=True),
}

MODEL = {
    "repo": text(matching(HF_REPO, "name the hub repository as owner/name")),
    "revision": text(matching(COMMIT, "pin the revision: the 40-hex commit id of the repository (a branch moves)")),
    "path": text(model_path),
    "served_name": text(matching(SERVED_NAME, "use letters, digits and '._:/-' (the name clients ask for)"), required=True),
    "tokenizer_mode": text(matching(IDENTIFIER, "use vLLM's tokenizer mode name, e.g. auto or deepseek_v4"), required=True),
    "tool_call_parser": text(lambda v: None if v == "" or IDENTIFIER.fullmatch(v) else "use vLLM's parser name (e.g. deepseek_v4), or \"\" for none"),
    "reasoning_parser": text(lambda v: None if v == "" or IDENTIFIER.fullmatch(v) else "use vLLM's parser name (e.g. deepseek_v4), or \"\" for none"),
}

IMAGE = {
    "ref": text(matching(DIGEST_REF, "pin the image by digest: registry/name@sha256:<64 hex>")),
    "build": text(lambda v: None if not CONTROL.search(v) and ":" not in v else "use a directory path (relative to the repository, or absolute)"),
    "kv_cache_dtypes": Key(list, "list the KV cache dtypes the image is built for", lambda v: None if v else "list at least one", required=True,
                           item=text(matching(IDENTIFIER, "use vLLM's dtype names, e.g. fp8"))),
    "python": text(command_or_path, required=True),
    "vllm": text(command_or_path, required=True),
    "env": env_table("the image's env"),
}

PROFILE = {
    "base": text(matching(NAME, "name the profile this one starts from, e.g. \"adaptive\"")),
    "image": text(matching(NAME, "name one of the images"), required=True),
    "kv_cache_dtype": text(matching(IDENTIFIER, "use vLLM's KV cache dtype name, e.g. fp8"), required=True),
    "max_model_len": Key(int, "use a whole number", between(256, 16_777_216, "use a window of 256 to 16,777,216 tokens (900000 published)"), required=True),
    "max_num_seqs": Key(int, "use a whole number", between(1, MAX_SEQS, f"use 1 to {MAX_SEQS} sequences (4 published)"), required=True),
    "max_num_batched_tokens": Key(int, "use a whole number", between(16, 1_048_576, "use 16 to 1,048,576 tokens (8192 published)"), required=True),
    "gpu_memory_utilization": Key(float, "use a number", above(0, 1, "use a fraction above 0 and at most 1 (0.80 published)"), required=True),
    "speculative_tokens": Key(int, "use a whole number", between(0, 16, "use 0 (no speculation) to 16 draft tokens (5 or 7 published)"), required=True),
    "speculative_schedule": Key(list, f"write the draft length per batch size as a list of [batch_start, batch_end, k], {SCHEDULE_EXAMPLE}",
                                speculative_schedule,
                                item=Key(list, f"write each range as [batch_start, batch_end, k], {SCHEDULE_EXAMPLE}", schedule_range,
                                         item=Key(int, "use whole numbers: [batch_start, batch_end, k]"))),
    "adaptive_verification": flag(),
    "thinking": Key(bool, "use true or false", required=True),
    "prefix_caching": Key(bool, "use true or false", required=True),
    "flashinfer_autotune": Key(bool, "use true or false", required=True),
    "weight_prefetch": flag(),
    "privileged": Key(bool, "use true or false", required=True),
    "agent_compact_tokens": Key(int, "use a whole number", between(1024, 16_777_216, "use 1,024 tokens or more (150000 published)"), required=True),
    "tensor_parallel": Key(int, "use a whole number", between(1, 64, "use 1 to 64 (default: every node; 2, 4 or 8 work best)")),
    "pipeline_parallel": Key(int, "use a whole number", between(1, 64, "use 1 to 64 (default 1; 3 nodes of a model whose heads 3 does not divide need 3)")),
    "env": env_table("a profile's env"),
}

CANARY_CHECKS = ("answer", "text", "loop", "greedy")  # files/dual_spark/canary.py's CHECKS
FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function's name
# What a canary's request sets itself: extra_body may not change it.
CANARY_REQUEST = ("model", "prompt", "messages", "max_tokens", "temperature", "ignore_eos", "return_token_ids", "tools",
                  "tool_choice", "stream", "n")


def canary_tool(value: dict) -> str | None:
    """The tool a canary offers: a function's name, description and parameters (a JSON schema of
    an object, whose required names are among its properties)."""
    fix = "write it as { name = \"get_weather\", description = \"...\", parameters = { type = \"object\", properties = {...}, required = [...] } }"
    if not set(value) <= {"name", "description", "parameters"} or not isinstance(value.get("name"), str) \
            or not isinstance(value.get("description", ""), str) or not isinstance(value.get("parameters", {}), dict):
        return fix
    if not FUNCTION_NAME.fullmatch(value["name"]):
        return "name the function with 1 to 64 letters, digits, '_' and '-'"
    parameters = value.get("parameters", {})
    properties, required = parameters.get("properties", {}), parameters.get("required", [])
    if parameters and (parameters.get("type") != "object" or not isinstance(properties, dict) or not isinstance(required, list)):
        return "give parameters as a JSON schema of an object: type = \"object\", properties = {...}, required = [...]"
    missing = [name for name in required if name not in properties]
    return f"list only properties in required ({', '.join(map(str, missing))} is not one)" if missing else None


CANARY = {
    "prompt": text(lambda v: None if v.strip() else "write the prompt the canary completes", required=True),
    "max_tokens": Key(int, "use a whole number", between(1, 1_048_576, "use 1 to 1048576 tokens")),
    "long": Key(bool, "use true (its length is canary_long_tokens) or leave it out"),
    "ignore_eos": Key(bool, "use true (generate max_tokens whatever the model says) or false"),
    "checks": Key(list, "list what its answer is checked for", lambda v: None if v else "list at least one check",
                  item=text(one_of(*CANARY_CHECKS))),
    "perplexity": Key(bool, "use true (the prompt is a text the model's perplexity is measured over) or leave it out"),
    "watch": Key(bool, "use true (asked again every canary_watch_seconds while it serves) or false"),
    "tool": Key(dict, "write the tool offered as a table: name, description, parameters", canary_tool),
    "extra_body": Key(dict, "write extra_body as a table of the request's fields", lambda v: next(
        (f"leave {name} out: the canary sets it itself" for name in CANARY_REQUEST if name in v), None)),
}

# Every site setting, declared once: its default, its rule (a Key: kind, bounds, the fix) and what
# it is. A site overrides a default under [settings], one run with `pyinfra ... --data key=value`;
# cluster.Settings and the table in docs/settings.md are built from this. What is served (model,
# images, profiles) is data of its own: group_data/serving.toml.
SETTINGS = {
    # The fabric and serving
    "topology": setting("direct", text(one_of("direct", "switch")),
                        "the fabric: \"direct\" (two Sparks, one QSFP cable) or \"switch\" (2 to 64, one cable each into a switch, "
                        "ports forced to 200G with auto-negotiation off)"),
    "profile": setting("adaptive", text(matching(NAME, "name a profile (adaptive, fast, long-c4)")), "the profile served"),
    "api_host": setting("127.0.0.1", text(api_address), "where the front door answers clients (loopback: through the SSH tunnel)"),
    "api_port": setting(8888, port(), "the front door's port"),
    "api_public": setting(False, flag(), "true: a non-loopback api_host is meant (refused otherwise)"),
    "vllm_port": setting(8889, port(), "vLLM's own port, behind the door, on the head's loopback only (docs/front-door.md)"),
    "door_drain_seconds": setting(600, positive(86_400, "wait 1 to 86400 seconds for the requests in flight before a planned stop"),
                                  "how long a planned stop waits for the requests in flight to finish"),
    "door_metrics_port": setting(8405, port(), "the door's Prometheus metrics, on the head's loopback"),
    "door_request_kib": setting(1024, Key(int, "use a whole number", between(16, 65_536, "use 16 to 65536 KiB (a request in flight holds up to three such buffers)")),
                                "a request up to this size is held whole, so it can be sent again to the next vLLM"),
    "master_port": setting(25000, port(), "vLLM's multi-node rendezvous (--master-port), on the head's rail 0 address"),
    "watchdog_port": setting(25001, port(), "each side's watchdog status, on its own fabric address"),
    "block_size": setting(256, Key(int, "use a whole number", lambda v: None if v in (16, 32, 64, 128, 256) else "use 16, 32, 64, 128 or 256 (256 published)"),
                          "vLLM's KV cache block size (--block-size)"),
    "speculative_method": setting("dspark", text(matching(IDENTIFIER, "use vLLM's speculative method name, e.g. dspark or ngram")),
                                  "the --speculative-config method"),
    "speculative_options": setting({}, Key(dict, "write more --speculative-config keys as a table, e.g. {prompt_lookup_max = 3}", speculative_options,
                                           names=SCALAR_TABLE.names, item=SCALAR_TABLE.item),
                                   "more keys of --speculative-config, e.g. {prompt_lookup_max = 3}"),
    "generation_config": setting({"temperature": 0.0, "top_p": 1.0},
                                 Key(dict, "write request defaults as a table, e.g. {temperature = 0.0}", generation_config,
                                     names=SCALAR_TABLE.names, item=SCALAR_TABLE.item),
                                 "request defaults (--override-generation-config): greedy"),
    "vllm_extra_args": setting([], Key(list, "use a list of strings", item=text(vllm_argument)), "more `vllm serve` flags, on every node"),
    "serving_ready_timeout": setting(1800, positive(86_400, "use 1 to 86400 seconds"),
                                     "seconds the deploy waits for the first generated token (and the door holds a request)"),
    "rollback_on_failure": setting(True, flag(), "no first token after a change, or a canary failed: every node returns to the "
                                                 "state that served; false: left as it is, for debugging"),
    "canaries": setting(True, flag(), "after a change serves, its answers are checked by the canary set ([canary.NAME]) before it "
                                      "is kept (docs/serving.md); false: a first token keeps it"),
    "canary": setting("off", text(one_of("off", "full")), "`tasks/verify.py --data canary=full` also runs the canary set against "
                                                          "the state that serves, compared with its recorded answers (changes nothing)"),
    "canary_long_tokens": setting(4096, positive(1_048_576, "use 1 to 1048576 tokens"),
                                  "the length of each canary with long = true (corruption was reported after thousands of tokens)"),
    "canary_perplexity_ratio": setting(1.2, Key(float, "use a number", above(1, 100, "use a ratio above 1 and at most 100")),
                                       "a perplexity canary may rise at most this many times the state before's (how a new "
                                       "revision is checked; not measured on Sparks)"),
    "canary_agree_tokens": setting(64, Key(int, "use a whole number", between(0, 1_048_576, "use 0 to 1048576 tokens")),
                                   "how many first tokens of each greedy canary must equal the state before's on the same weights "
                                   "(beyond them: numerical drift; not measured on Sparks)"),
    "canary_acceptance_ratio": setting(0.5, Key(float, "use a number", above(0, 1, "use a share above 0 and at most 1")),
                                       "after a change on the same weights and speculation, the drafts accepted at each draft "
                                       "position over the canaries may fall to this share of the state before's (a drafter "
                                       "whose acceptance collapses; not measured on Sparks)"),
    "canary_watch_seconds": setting(300, positive(86_400, "use 1 to 86400 seconds"),
                                    "how often the head asks each canary with watch = true again while it serves, and compares "
                                    "its answer with the recorded one (a change is an alert, never a restart)"),
    "serving_env": setting({"NCCL_NET": "IB", "NCCL_IB_DISABLE": "0", "NCCL_CROSS_NIC": "1", "NCCL_NVLS_ENABLE": "0",
                            "VLLM_DSPARK_GPU_REJECTED_CONTEXT_MASK": "1", "VLLM_USE_BREAKABLE_CUDAGRAPH": "0", "VLLM_USE_B12X_MOE": "1",
                            "VLLM_USE_B12X_WO_PROJECTION": "1", "TORCH_CUDA_ARCH_LIST": "12.1a", "HF_HUB_OFFLINE": "1"},
                           env_table("serving_env"), "the environment of vLLM on every node (NCCL over RoCE, DSpark's switches)"),
    # Containers (a site without GPUs or InfiniBand devices, like the lab, overrides these)
    "container_gpus": setting("all", text(gpus), "the GPUs of each runtime container (compose `gpus:`)"),
    "container_devices": setting(["/dev/infiniband"], Key(list, "use a list of device paths", item=text(container_device)),
                                 "devices passed into each runtime container"),
    "container_ulimits": setting({"memlock": -1, "stack": 67108864, "nofile": 1048576},
                                 Key(dict, "write ulimits as a table, e.g. {memlock = -1}", names=text(one_of(*ULIMITS)),
                                     item=Key(int, "use a whole number", between(-1, 2**62, "use -1 (unlimited) or a limit of 0 or more"))),
                                 "each runtime container's ulimits"),
    "container_mounts": setting([], Key(list, "use a list of absolute host paths", item=text(container_mount)),
                                "host paths mounted read-only, at the same path, into every runtime container"),
    "container_env": setting({}, env_table("container_env"),
                             "more environment for every runtime container (the hub fetch keeps its own HF_HOME, HF_XET_*)"),
    "container_secrets": setting({}, Key(dict, f"write secrets as a table of NAME = \"{SECRETS_HOME}/NAME\"",
                                         names=Key(str, "use a name", secret_name), item=text(secret_file)),
                                 f"secrets for every vLLM container: NAME = a root-only file (mode 600 or 400) on every node under "
                                 f"{SECRETS_HOME}/, mounted read-only at /run/secrets/NAME, never in the environment"),
    # Where the deploy keeps its files on the nodes
    "state_dir": setting("/var/lib/dual-spark", text(owned_directory), "the deploy's programs, records and caches on each node"),
    "model_dir": setting("/var/lib/dual-spark/model", text(owned_directory), "the model store: one directory per model source"),
    "stack_dir": setting("/etc/dual-spark", text(owned_directory), "the compose stacks and the records of the states that served"),
    "hf_endpoint": setting("https://huggingface.co", text(hub_url), "the Hugging Face hub, or a mirror of it"),
    "hf_endpoint_insecure_http": setting(False, flag(), "true: an http:// hf_endpoint (a mirror on your LAN) is meant; the token crosses in clear"),
    "hf_token_file": setting("~/.cache/huggingface/token", text(token_file),
                             "the hub token, on the head, the deploy user's; only gated repositories need it"),
    "verify_model": setting("size", text(one_of("size", "full")), "\"full\": hash every file of the model on every node again"),
    "replication_streams": setting(4, positive(32, "use 1 to 32 streams per rail"), "parallel TCP streams per fabric rail"),
    "show_program_diffs": setting(False, flag(), "the diff shows each changed program as one line; true: its full diff"),
    # The QSFP fabric
    "fabric_mtu": setting(9000, Key(int, "use a whole number", between(1280, 9216, "use an MTU between 1280 and 9216 (9000 for jumbo frames)")),
                          "the rails' MTU"),
    "netplan_path": setting("/etc/netplan/40-dual-spark.yaml", text(netplan_file), "the deploy's netplan file of the rails"),
    "expected_link_speed_mbps": setting(200000, Key(int, "use a whole number", between(1000, 800_000, "use the link speed in Mb/s, 1000 to 800000 (200000 for a CX-7 port)")),
                                        "the speed each rail must show"),
    # Host preparation
    "host_packages": setting(["rsync", "iperf3", "perftest", "rdma-core", "ibverbs-utils", "infiniband-diags", "python3-venv"],
                             Key(list, "use a list of Debian package names",
                                 item=text(matching(DEBIAN_PACKAGE, "use a Debian package name (lower-case letters, digits, '+.-')"))),
                             "the packages every node gets"),
    "memlock_limits_path": setting("/etc/security/limits.d/99-rdma.conf",
                                   text(file_under("/etc/security/limits.d", ".conf", "/etc/security/limits.d/99-rdma.conf")),
                                   "the unlimited memlock of the deploy user (RDMA)"),
    "memlock_systemd_path": setting("/etc/systemd/system.conf.d/90-rdma-memlock.conf",
                                    text(file_under("/etc/systemd/system.conf.d", ".conf", "/etc/systemd/system.conf.d/90-rdma-memlock.conf")),
                                    "the unlimited memlock of systemd's services (Docker)"),
    "userns_sysctl_path": setting("/etc/sysctl.d/60-apparmor-userns.conf",
                                  text(file_under("/etc/sysctl.d", ".conf", "/etc/sysctl.d/60-apparmor-userns.conf")),
                                  "the sysctl that lifts AppArmor's restriction on unprivileged user namespaces"),
    "reboot_worker": setting(False, flag(), "true: a worker given a new machine id is rebooted, so that every service picks it up"),
    # Verification
    "memory_floor_gib": setting(95, Key(float, "use a number", above(0, 128, "use a number of GiB above 0 and at most 128")),
                                "the GPU memory (GiB) each node must have available for vLLM"),
    # Observability (docs/observability.md): Prometheus on the head, a node exporter and the deploy's
    # collector on every node, the rules and dashboards. Nothing is removed when it is off.
    "observability": setting(True, flag(), "false: none of the observability is installed or changed"),
    "prometheus_port": setting(9090, daemon_port("Prometheus"), "Prometheus, on the head's loopback: reach it through the SSH tunnel"),
    "prometheus_retention_days": setting(15, positive(3650, "keep 1 to 3650 days of samples (15 by default)"),
                                         "samples older than this are dropped..."),
    "prometheus_retention_gib": setting(8, positive(1024, "cap the samples at 1 to 1024 GiB (8 by default): Prometheus drops the oldest beyond it"),
                                        "...and the oldest too once the store is this big: it never fills the disk"),
    "node_exporter_port": setting(9100, daemon_port("the node exporter"), "on each node's rail 0 address, never the management LAN"),
    "metrics_interval_seconds": setting(15, Key(int, "use a whole number", between(5, 300, "scrape every 5 to 300 seconds (15 by default)")),
                                        "how often Prometheus scrapes and the collector reads"),
    "heal_margin_seconds": setting(120, positive(86_400, "allow a heal 1 to 86400 seconds beyond 1.5 times the last start (120 by default)"),
                                   "a heal is expected within 1.5 times the head's last start plus this: DualSparkApiDown warns until then, pages after"),
    # Objectives (docs/observability.md#objectives), each watched by burn-rate alerts. The fastest burn
    # the alerts page on is 14.4 times the budget: a budget above 1/14.4 could never page.
    "slo_error_ratio": setting(0.01, Key(float, "use a number", between(0.0001, 0.05, "allow 0.0001 to 0.05 of requests to fail (0.01 by default)")),
                               "at most this share of requests fail (a 5xx from the door, or vLLM ending one in error)"),
    "slo_ttft_seconds": setting(10.0, Key(float, "use a number", bucket_bound(TTFT_BUCKETS, "time to first token")),
                                "the first token within this long (a bucket bound of vLLM's histogram)..."),
    "slo_ttft_target": setting(0.95, Key(float, "use a number", between(0.95, 0.9999, "owe 0.95 to 0.9999 of requests their first token in time (0.95 by default)")),
                               "...for at least this share of requests"),
    "slo_itl_seconds": setting(0.2, Key(float, "use a number", bucket_bound(ITL_BUCKETS, "inter-token latency")),
                               "each next token within this long of the one before (a bucket bound)..."),
    "slo_itl_target": setting(0.95, Key(float, "use a number", between(0.95, 0.9999, "owe 0.95 to 0.9999 of tokens their time (0.95 by default)")),
                              "...for at least this share of tokens"),
    "grafana_image": setting("", text(lambda v: None if v == "" or DIGEST_REF.fullmatch(v) else
                                      "pin Grafana by digest, e.g. grafana/grafana-oss@sha256:<64 hex> (docker buildx imagetools inspect "
                                      "grafana/grafana-oss:TAG shows it), or \"\" for no Grafana"),
                             "Grafana on the head, on loopback, pinned by digest, with the deploy's dashboards; \"\": no Grafana"),
    "grafana_port": setting(3000, daemon_port("Grafana"), "Grafana, on the head's loopback"),
    # Delivery (docs/observability.md#delivery): Alertmanager on the head sends the alerts, and the
    # heartbeat, to the site's receivers; with none they stay on the head.
    "alertmanager_port": setting(9093, daemon_port("Alertmanager"), "Alertmanager, on the head's loopback (its cluster listener off)"),
    "alert_webhooks": setting([], Key(list, "list webhook URLs as strings, e.g. [\"https://hooks.example.com/alerts\"]", webhooks,
                                      item=Key(str, "write each webhook URL as a string", webhook_url, shown=url_shown), shown=url_shown),
                              "where Alertmanager sends the alerts and the heartbeat: http(s) URLs, a token in the path or query "
                              "never shown; []: the alerts stay on the head"),
}

BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
SETTINGS_PAGE = """# Settings

Every setting a site may change under `[settings]` in `site.toml` (or for one run with
`pyinfra ... --data key=value`), with its default and what it is. A value out of bounds is refused
before any host is contacted, naming the setting and the fix. This page is written from the
settings' one declaration, `SETTINGS` in site_schema.py: edit that, then
`.venv/bin/python -c 'import site_schema; print(site_schema.settings_page(), end="")' > docs/settings.md`.

| setting | default | what it is |
|---|---|---|
"""


def toml_value(value) -> str:
    """A value as a site file writes it: JSON's strings, numbers, booleans and arrays are TOML;
    tables inline, a key bare where TOML allows it."""
    if isinstance(value, dict):
        keys = [name if BARE_KEY.fullmatch(name) else json.dumps(name) for name in value]
        return "{ " + ", ".join(f"{key} = {toml_value(item)}" for key, item in zip(keys, value.values())) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return json.dumps(value)


def settings_page() -> str:
    """docs/settings.md: each setting, its default and what it is."""
    rows = []
    for name, key in SETTINGS.items():
        doc = key.doc.replace("|", r"\|")
        rows.append(f"| `{name}` | `{toml_value(key.default)}` | {doc} |")
    return SETTINGS_PAGE + "\n".join(rows) + "\n"


# pyinfra connector keys a `--data` may set: connection details live in the site file, per node.
CONNECTOR = {
    "ssh_connect_timeout": positive(600, "use 1 to 600 seconds"),
}


class Checker:
    """Checks values against keys and tables, reporting through ``error(field, seen, fix)``."""

    def __init__(self, error: Callable[[str, object, str], None], suggest: Callable[[str, object, str], str]):
        self.error, self.suggest = error, suggest

    def value(self, where: str, value, key: Key) -> bool:
        seen = key.shown(value) if key.shown else value
        if not kind_ok(value, key.kind):
            self.error(where, seen, key.fix)
            return False
        if isinstance(value, (str, list, dict)) and len(value) > (MAX_TEXT if isinstance(value, str) else MAX_ITEMS):
            self.error(where, seen, f"use at most {MAX_TEXT} characters" if isinstance(value, str) else f"use at most {MAX_ITEMS} entries")
            return False
        ok = True
        if key.rule is not None:
            problem = key.rule(value)
            if problem:
                self.error(where, seen, problem)
                ok = False
        if isinstance(value, list) and key.item is not None:
            ok = all([self.value(f"{where}[{index}]", item, key.item) for index, item in enumerate(value)]) and ok
        if isinstance(value, dict):
            for name, item in value.items():
                if key.names is not None and not self.value(where, name, key.names):
                    ok = False
                elif key.item is not None and not self.value(f"{where}.{name}", item, key.item):
                    ok = False
        return ok

    def table(self, where: str, table: dict, schema: dict[str, Key], label: str, required: bool = True) -> dict:
        """The keys of ``table`` that are known and valid; each unknown, wrong or missing one reported."""
        good = {}
        for name, value in table.items():
            if name not in schema:
                self.error(f"{where}.{name}" if where else name, value, self.suggest(name, schema, label))
            elif self.value(f"{where}.{name}" if where else name, value, schema[name]):
                good[name] = value
        if required:
            for name, key in schema.items():
                if key.required and name not in table:
                    self.error(f"{where}.{name}" if where else name, None, key.fix if key.kind is list else f"set {name} in {label}")
        return good
