"""What is served, as data: the model, the runtime images and the profiles of
group_data/serving.toml, with the site file's [model], [image.NAME] and [profile.NAME] tables
laid over them, validated (each problem naming the field, the value and the fix), and each image
given the local tag both nodes know it by."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent
DEFAULTS = REPO / "group_data" / "serving.toml"
COMMIT = re.compile(r"^[0-9a-f]{40}$")
DIGEST_REF = re.compile(r"^[a-z0-9][a-z0-9._/:-]*@sha256:([0-9a-f]{64})$")
NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,39}$")
KIND = {bool: "true or false", int: "a whole number", float: "a number", str: "a string", list: "a list", dict: "a table"}
MODEL_KEYS = {"repo": str, "revision": str, "path": str, "served_name": str, "tokenizer_mode": str,
              "tool_call_parser": str, "reasoning_parser": str}
IMAGE_KEYS = {"ref": str, "build": str, "kv_cache_dtypes": list, "python": str, "vllm": str, "env": dict}
PROFILE_KEYS = {"image": str, "kv_cache_dtype": str, "max_model_len": int, "max_num_seqs": int,
                "max_num_batched_tokens": int, "gpu_memory_utilization": float, "speculative_tokens": int,
                "thinking": bool, "prefix_caching": bool, "flashinfer_autotune": bool, "privileged": bool,
                "agent_compact_tokens": int, "env": dict}


def model_source(model: dict) -> dict:
    """Where the weights come from, as recorded in the manifest: a hub revision or a path."""
    return {"path": model["path"]} if "path" in model else {"repo": model["repo"], "revision": model["revision"]}


def defaults() -> dict:
    return tomllib.loads(DEFAULTS.read_text())


def merge(raw: dict, error, suggest) -> dict:
    """{"model": {...}, "images": {name: {..., "tag"}}, "profiles": {name: {...}}} from the
    defaults and a site file's tables; ``error(field, seen, fix)`` records each problem and
    ``suggest(key, known, where)`` words the fix for an unknown key."""
    base = defaults()
    model = dict(base["model"])
    site_model = raw.get("model", {})
    if "path" in site_model:
        model.pop("repo", None), model.pop("revision", None)
    if "repo" in site_model:
        model.pop("revision", None), model.pop("path", None)
    model.update(site_model)
    images = {name: dict(spec) for name, spec in base["image"].items()}
    for name, spec in raw.get("image", {}).items():
        if name in images and ("ref" in spec or "build" in spec):
            images[name].pop("ref", None), images[name].pop("build", None)
        images.setdefault(name, {}).update(spec)
    profiles = {name: dict(spec) for name, spec in base["profile"].items()}
    for name, spec in raw.get("profile", {}).items():
        start = dict(profiles.get(spec.get("base", name), {})) if isinstance(spec, dict) else {}
        profiles[name] = {**start, **{k: v for k, v in spec.items() if k != "base"}} if isinstance(spec, dict) else spec
    typed = Typed(error, suggest)
    _model(model, typed, error)
    for name, spec in images.items():
        _image(name, spec, typed, error)
    for name, spec in profiles.items():
        _profile(name, spec, images, typed, error)
    return {"model": model, "images": images, "profiles": profiles}


class Typed:
    """Checks a table's keys against a schema of key -> type: unknown keys and wrong types."""

    def __init__(self, error, suggest):
        self.error, self.suggest = error, suggest

    def __call__(self, where: str, table: dict, schema: dict) -> bool:
        ok = True
        for key, value in table.items():
            if key not in schema:
                self.error(f"{where}.{key}", value, self.suggest(key, schema, f"[{where}]"))
                ok = False
            elif not type_ok(value, schema[key]):
                self.error(f"{where}.{key}", value, f"use {KIND[schema[key]]}")
                ok = False
        return ok


def type_ok(value, expected: type) -> bool:
    if isinstance(value, bool):
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _model(model: dict, typed, error) -> None:
    if not typed("model", model, MODEL_KEYS):
        return
    if "path" in model:
        if not model["path"].startswith("/"):
            error("model.path", model["path"], "use the absolute path of the weights' directory on the head")
    elif "repo" not in model:
        error("model", sorted(model), "name the weights: repo and revision (Hugging Face), or path (a directory on the head)")
    elif not COMMIT.match(str(model.get("revision", ""))):
        error("model.revision", model.get("revision"), "pin the revision: the 40-hex commit id of the repository (a branch moves)")
    for key in ("served_name", "tokenizer_mode"):
        if not model.get(key):
            error(f"model.{key}", model.get(key), "set it (see group_data/serving.toml)")


def _image(name: str, spec: dict, typed, error) -> None:
    where = f"image.{name}"
    if not NAME.match(name):
        error(where, name, "name images with lower-case letters, digits, '-' and '_'")
    if not typed(where, spec, IMAGE_KEYS):
        return
    if ("ref" in spec) == ("build" in spec):
        error(where, sorted(spec), "give exactly one of ref (pulled by digest) or build (a directory with a Dockerfile)")
        return
    if "ref" in spec:
        match = DIGEST_REF.match(spec["ref"])
        if not match:
            error(f"{where}.ref", spec["ref"], "pin the image by digest: registry/name@sha256:<64 hex>")
            return
        spec["tag"] = f"dual-spark/{name}:{match.group(1)[:12]}"
    else:
        context = (REPO / spec["build"]).resolve()
        if not (context / "Dockerfile").is_file():
            error(f"{where}.build", spec["build"], "point at a directory holding a Dockerfile (relative to the repository, or absolute)")
            return
        spec["build"] = str(context)
        spec["tag"] = f"dual-spark/{name}:{context_digest(context)[:12]}"
    for key in ("kv_cache_dtypes", "python", "vllm"):
        if key not in spec:
            error(f"{where}.{key}", None, "set it (see group_data/serving.toml)")
    spec.setdefault("env", {})


def context_digest(context: Path) -> str:
    """A build context's identity: every file's path and bytes."""
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(path.relative_to(context).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _profile(name: str, spec, images: dict, typed, error) -> None:
    where = f"profile.{name}"
    if not isinstance(spec, dict) or not NAME.match(name):
        error(where, name, "a profile is a [profile.NAME] table named with lower-case letters, digits, '-' and '_'")
        return
    if not typed(where, spec, PROFILE_KEYS):
        return
    missing = sorted(set(PROFILE_KEYS) - set(spec) - {"env"})
    if missing:
        error(where, sorted(spec), f"set {', '.join(missing)}, or base = \"adaptive\" to start from a published profile")
        return
    spec.setdefault("env", {})
    image = images.get(spec["image"])
    if image is None:
        error(f"{where}.image", spec["image"], f"name one of the images: {', '.join(sorted(images))}")
    elif spec["kv_cache_dtype"] not in image.get("kv_cache_dtypes", []):
        built_for = [n for n, i in sorted(images.items()) if spec["kv_cache_dtype"] in i.get("kv_cache_dtypes", [])]
        error(f"{where}.kv_cache_dtype", spec["kv_cache_dtype"],
              f"image {spec['image']} is not built for it (it takes {', '.join(image.get('kv_cache_dtypes', []))})"
              + (f"; use image {' or '.join(built_for)}" if built_for else ""))
    for key in ("max_model_len", "max_num_seqs", "max_num_batched_tokens", "agent_compact_tokens"):
        if spec[key] < 1:
            error(f"{where}.{key}", spec[key], "use a positive number")
    if not 0 < spec["gpu_memory_utilization"] <= 1:
        error(f"{where}.gpu_memory_utilization", spec["gpu_memory_utilization"], "use a fraction above 0 and at most 1 (0.80 published)")
    if spec["speculative_tokens"] < 0:
        error(f"{where}.speculative_tokens", spec["speculative_tokens"], "use 0 (no speculation) or more")
    for key, value in spec["env"].items():
        if not isinstance(value, str):
            error(f"{where}.env.{key}", value, "write environment values as strings")
