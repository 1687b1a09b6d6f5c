"""What is served, as data: the model, the runtime images, the profiles and the canaries of
group_data/serving.toml, with the site file's [model], [image.NAME], [profile.NAME] and [canary.NAME] tables
laid over them, validated (each problem naming the field, the value and the fix), and each image
given the local tag both nodes know it by."""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path

import site_schema as schema
from site_schema import Checker

REPO = Path(__file__).resolve().parent
DEFAULTS = REPO / "group_data" / "serving.toml"


def defaults() -> dict:
    return tomllib.loads(DEFAULTS.read_text())


def merge(raw: dict, check: Checker, error) -> dict:
    """{"model": {...}, "images": {name: {..., "tag"}}, "profiles": {name: {...}}, "canaries": {name: {...}}} from the
    defaults and a site file's tables (already of the right shape), each key checked by
    ``check`` against site_schema's tables; ``error(field, seen, fix)`` records the rest."""
    base = defaults()
    model = dict(base["model"])
    site_model = check.table("model", raw.get("model", {}), schema.MODEL, "[model]", required=False)
    if "path" in site_model:
        model.pop("repo", None), model.pop("revision", None)
    if "repo" in site_model:
        model.pop("revision", None), model.pop("path", None)
    model.update(site_model)
    images = {name: dict(spec) for name, spec in base["image"].items()}
    for name, spec in raw.get("image", {}).items():
        spec = check.table(f"image.{name}", spec, schema.IMAGE, f"[image.{name}]", required=False)
        if name in images and ("ref" in spec or "build" in spec):
            images[name].pop("ref", None), images[name].pop("build", None)
        images.setdefault(name, {}).update(spec)
    profiles = {name: dict(spec) for name, spec in base["profile"].items()}
    for name, spec in raw.get("profile", {}).items():
        spec = check.table(f"profile.{name}", spec, schema.PROFILE, f"[profile.{name}]", required=False)
        if "base" in spec and spec["base"] not in profiles:
            error(f"profile.{name}.base", spec["base"], f"start from one of the profiles: {', '.join(sorted(profiles))}")
        start = dict(profiles.get(spec.get("base", name), {}))
        profiles[name] = {**start, **{k: v for k, v in spec.items() if k != "base"}}
    canaries = {name: dict(spec) for name, spec in base["canary"].items()}
    for name, spec in raw.get("canary", {}).items():
        spec = check.table(f"canary.{name}", spec, schema.CANARY, f"[canary.{name}]", required=False)
        if "max_tokens" in spec or spec.get("long"):
            canaries.get(name, {}).pop("max_tokens", None), canaries.get(name, {}).pop("long", None)
        canaries.setdefault(name, {}).update(spec)
    _model(model, error)
    for name, spec in canaries.items():
        _canary(name, spec, error)
    for name, spec in images.items():
        _image(name, spec, error)
    for name, spec in profiles.items():
        _profile(name, spec, images, error)
    return {"model": model, "images": images, "profiles": profiles, "canaries": canaries}


def _model(model: dict, error) -> None:
    if "path" in model and "repo" in model:
        error("model", sorted(model), "name the weights one way: repo and revision (Hugging Face), or path (a directory on the head)")
    elif "path" not in model and "repo" not in model:
        error("model", sorted(model), "name the weights: repo and revision (Hugging Face), or path (a directory on the head)")
    elif "repo" in model and "revision" not in model:
        error("model.revision", None, "pin the revision: the 40-hex commit id of the repository (a branch moves)")
    for key in ("served_name", "tokenizer_mode"):
        if key not in model:
            error(f"model.{key}", None, "set it (see group_data/serving.toml)")


def _canary(name: str, spec: dict, error) -> None:
    where = f"canary.{name}"
    if not schema.NAME.fullmatch(name):
        error(where, name, "name canaries with lower-case letters, digits, '-' and '_'")
    if "prompt" not in spec:
        error(f"{where}.prompt", None, "write the prompt the canary completes")
    if spec.get("perplexity"):
        if any(key in spec for key in ("max_tokens", "long", "ignore_eos", "checks", "watch", "tool", "extra_body")):
            error(where, sorted(spec), "a perplexity canary scores its prompt alone: give it prompt and perplexity = true, nothing else")
        spec["checks"] = ()
        return
    if ("max_tokens" in spec) == bool(spec.get("long")):
        error(where, sorted(spec), "give its length one way: max_tokens, or long = true (canary_long_tokens)")
    if "checks" in spec:
        spec["checks"] = tuple(spec["checks"])
    if spec.get("watch") and "greedy" not in spec.get("checks", schema.CANARY_CHECKS):
        error(f"{where}.watch", True, "a watched canary is compared with its recorded greedy answer: list greedy in its checks, or leave watch out")


def _image(name: str, spec: dict, error) -> None:
    where = f"image.{name}"
    if not schema.NAME.fullmatch(name):
        error(where, name, "name images with lower-case letters, digits, '-' and '_'")
    if ("ref" in spec) == ("build" in spec):
        error(where, sorted(spec), "give exactly one of ref (pulled by digest) or build (a directory with a Dockerfile)")
        return
    if "ref" in spec:
        spec["tag"] = f"dual-spark/{name}:{schema.DIGEST_REF.fullmatch(spec['ref']).group(1)[:12]}"
    else:
        context = (REPO / spec["build"]).resolve()
        if not (context / "Dockerfile").is_file():
            error(f"{where}.build", spec["build"], "point at a directory holding a Dockerfile (relative to the repository, or absolute)")
            return
        secret = schema.build_secret(context)
        if secret:
            error(f"{where}.build", spec["build"], f"{secret} in it holds credentials, and the build context goes to every node "
                  "and into the image: build from a directory of the Dockerfile and what it copies only")
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


def _profile(name: str, spec: dict, images: dict, error) -> None:
    where = f"profile.{name}"
    if not schema.NAME.fullmatch(name):
        error(where, name, "name profiles with lower-case letters, digits, '-' and '_'")
        return
    missing = sorted(key for key, declared in schema.PROFILE.items() if declared.required and key not in spec)
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
              f"image {spec['image']} is not built for it (its kv_cache_dtypes: {', '.join(image.get('kv_cache_dtypes', []))})"
              + (f"; use image {' or '.join(built_for)}" if built_for else ""))
    if spec["agent_compact_tokens"] > spec["max_model_len"]:
        error(f"{where}.agent_compact_tokens", spec["agent_compact_tokens"], f"compact within the window: at most max_model_len ({spec['max_model_len']})")
    if spec["max_num_batched_tokens"] < spec["max_num_seqs"]:
        error(f"{where}.max_num_batched_tokens", spec["max_num_batched_tokens"], f"batch at least one token per sequence: max_num_seqs ({spec['max_num_seqs']}) or more")
    _speculation(where, spec, error)


def _speculation(where: str, spec: dict, error) -> None:
    """The schedule against the profile's other keys, as vLLM 0.32 would refuse it only at start
    (num_speculative_tokens_per_batch_size needs num_speculative_tokens above 0)."""
    tokens = spec["speculative_tokens"]
    if "adaptive_verification" in spec and not tokens:
        error(f"{where}.adaptive_verification", spec["adaptive_verification"],
              "adaptive verification checks drafted tokens: set speculative_tokens above 0, or drop adaptive_verification")
    schedule = spec.get("speculative_schedule")
    if schedule is None:
        return
    if not tokens:
        error(f"{where}.speculative_schedule", schedule, "a schedule drafts at most speculative_tokens per step: set speculative_tokens "
              "above 0 (to the schedule's largest k), or drop the schedule for no speculation")
        return
    for index, (start, end, k) in enumerate(schedule):
        if k > tokens:
            error(f"{where}.speculative_schedule[{index}]", [start, end, k],
                  f"draft at most speculative_tokens ({tokens}) at any batch size: lower k, or raise speculative_tokens to {k}")
    start, end, _ = schedule[-1]
    if not start <= spec["max_num_seqs"] <= end:
        error(f"{where}.speculative_schedule", schedule,
              f"cover every batch size up to max_num_seqs ({spec['max_num_seqs']}): end the last range at {spec['max_num_seqs']}")
