"""Operations for serving: one compose stack per node (built as data, its launch script rendered
from templates/serving/), checked
by the real `docker compose config` before it is installed, and brought up in the only order
multi-node vLLM survives: the head stops first, fresh workers start, then the head. Containers
restart only when a stack of the cluster changed (or one of them is not running), and never
with a tensor parallel the model's attention heads refuse."""

from __future__ import annotations

from io import StringIO

from pyinfra import host, logger
from pyinfra.api import FunctionCommand, OperationError, QuoteString, StringCommand, operation

from checks.serving import heads_refusal
from cluster import Cluster
from facts.runtime import ImageState
from facts.serving import ModelHeads, SecretFiles
from layout import RUN_DIR, STACK_FILES, STOP_TIMEOUT
from operations.canary import canaries
from operations.handover import (
    cluster_stacks,
    own,
    probe,
    read_cluster,
    recorded_if_serving,
    recording,
    served_or_rolled_back,
    starts,
    way_back,
)
from operations.own import claimed, sealed, secret_refusal
from operations.peer import acts_here, reachable, read_all
from operations.readings import Reading, plans, read
from operations.render import show_diff
from operations.stack import (
    SPECULATIVE_FIELDS,
    Stack,
    StackSettings,
    cache_kept,
    compose,
    drained_stop,
    planned_done,
    speculative_config,
    stack_settings,
)
from operations.upload import upload
from states import cluster_state, state_of

STAGING = f"{RUN_DIR}/stack-check"


@plans
def readings(cluster: Cluster, name: str) -> list[Reading]:
    settings = stack_settings(cluster, name)
    return [(ImageState, {"tag": settings.cluster.image.tag, "marker": settings.smoke_marker}), (ModelHeads, {"model_dir": settings.model_dir}),
            *([(SecretFiles, {"paths": secret_paths(settings)})] if settings.site.container_secrets else [])]


def secret_paths(settings: StackSettings) -> list[str]:
    return [settings.site.container_secrets[name] for name in sorted(settings.site.container_secrets)]


def secrets_sealed(stacks: list[StackSettings]) -> None:
    """Refuse, before anything stops or changes, a secret file of the site's (container_secrets)
    that is not root's alone on any of the nodes ``stacks`` names that answer (operations/own.py)."""
    settings = own(stacks)
    if not settings.site.container_secrets:
        return
    names = [other.hostname for other in stacks if other.hostname != host.name]
    readings = read_all(SecretFiles, [reachable(name) for name in names], paths=secret_paths(settings))
    for name, reading in zip([host.name, *names], readings):
        for secret, path in sorted(settings.site.container_secrets.items()):
            refusal = reading is not None and secret_refusal(secret, path, reading["files"].get(path))
            if refusal:
                raise OperationError(f"{name}: {refusal}. Nothing was stopped or changed.")


def heads_divided(settings: StackSettings) -> None:
    """Refuse, before anything stops or changes, a tensor parallel that vLLM would refuse for the
    model's attention heads (read from the config.json of the model on this node)."""
    refusal = heads_refusal(settings.cluster.profile_name, settings.cluster.tensor_parallel, settings.cluster.pipeline_parallel,
                            read(host, ModelHeads, model_dir=settings.model_dir))
    if refusal:
        raise OperationError(refusal)


def image_supports(settings: StackSettings) -> None:
    """Refuse, before anything stops or changes, a profile's speculative key that the image's vLLM
    lacks: its SpeculativeConfig's fields, as this node's smoke test read them (operations/runtime.py).
    Before the changes run (--dry) an image whose fields are not read yet waits for the runtime step."""
    profile, image = settings.cluster.profile, settings.cluster.image
    used = {key: field for key, field in SPECULATIVE_FIELDS.items() if getattr(profile, key) is not None and profile.speculative_tokens}
    if not used:
        return
    reading = read(host, ImageState, tag=image.tag, marker=settings.smoke_marker)
    fields = reading["speculative_keys"] if reading["id"] is not None and reading["smoke_tested"] == reading["id"] else None
    named = f"image {profile.image} ({image.tag})"
    if fields is None:
        if host.state.is_executing:
            raise OperationError(f"the speculative config keys {named} takes are not read on {host.name}: run "
                                 "`pyinfra inventory.py tasks/runtime.py` (its smoke test reads them), then this step again")
        return
    for key, field in used.items():
        if field not in fields:
            raise OperationError(
                f"profile {settings.cluster.profile_name} sets {key}, but the vLLM of {named}, {reading['id'][:19]}, has no {field} in its "
                f"SpeculativeConfig: nothing was stopped. Fix: drop {key} from the profile, or use an image whose vLLM has {field}"
                + ("; for another draft length under load, a second profile with another fixed speculative_tokens and no "
                   f"speculative_schedule (one based on {settings.cluster.profile_name} inherits its schedule), switched with tasks/profile.py" if key == "speculative_schedule" else ""))


def install(stack: Stack, reading: dict, stack_dir: str, programs: str):
    """Stage both files, check them with the real `docker compose config`, keep the previous
    ones, install into stack_dir only if it is the deploy's (claimed by tasks/runtime.py: a real
    directory holding its marker; never made here). Nothing is installed if a check fails."""
    for name, text in zip(STACK_FILES, (stack.compose, stack.launch)):
        show_diff(f"{stack_dir}/{name}", reading["compose" if name == "compose.yaml" else "launch"], text)
    yield StringCommand("rm", "-rf", STAGING, "&&", "mkdir", "-p", STAGING)
    for name, text in zip(STACK_FILES, (stack.compose, stack.launch)):
        staged = f"{STAGING}/{name}"
        yield from upload(StringIO(text), staged)
    yield StringCommand("chmod", "755", f"{STAGING}/launch.sh", "&&", "docker", "compose", "-f", f"{STAGING}/compose.yaml",
                        "config", "-q")
    for name in STACK_FILES:
        target = QuoteString(f"{stack_dir}/{name}")
        yield StringCommand(claimed(programs, stack_dir, "stack_dir"), "&&", "{", "test", "!", "-f", target, "||", "cp", "-p", target,
                            StringCommand(target, '.previous', _separator=""), ";", "}", "&&",
                            "install", "-m", "755" if name == "launch.sh" else "644", f"{STAGING}/{name}", target)
    yield StringCommand("rm", "-rf", STAGING)


@operation()
def head_stopped_for_change(stacks: list[StackSettings]):
    """
    On the head: stop its vLLM when any node's stack is about to change or a worker is not
    running its current one, so the workers restart with no head waiting on a dead session.
    Refuses first, stopping nothing, a tensor parallel the model's attention heads do not divide,
    a profile's speculative key the image's vLLM lacks, and a secret file (container_secrets) that
    is not root's alone on any node.

    + stacks: every node's stack settings (``stack_settings``), in rank order

    **Example:**

    .. code:: python

        head_stopped_for_change(stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes])
    """
    if not acts_here("head"):
        return
    settings = own(stacks)
    heads_divided(settings)
    image_supports(settings)
    secrets_sealed(stacks)
    readings = read_cluster(stacks, "restarting the serving cluster")
    if None in readings:
        return
    _, everywhere = cluster_stacks(stacks, readings)
    mine = readings[settings.rank]
    running = mine["container"] is not None and mine["container"]["status"] == "running"
    if everywhere or not running:
        host.noop("the head keeps running" if running else "the head is not running")
        return
    yield drained_stop(settings)


@operation()
def stack_up(role: str, stacks: list[StackSettings], ready_timeout: int, rollback: bool):
    """
    Install this node's stack when it changed and start it when any node's is not in place:
    every worker fresh (``--force-recreate``), the head after them, and then the head waits until
    a token is generated through the API, and records on every node the state that serves
    (operations/records.py). When no token comes, every node returns to the state that served
    before (``rollback``), and the step fails saying why. The head's API key is made on the first
    run (a random token, in a file only the deploy user reads; it never leaves the head). A tensor
    parallel the model's attention heads do not divide, a speculative key the image's vLLM lacks,
    or a secret file that is not root's alone, is refused before anything is installed; the
    secrets are checked again in the command that starts the stack.

    + role: the nodes this step starts ("worker" or "head")
    + stacks: every node's stack settings (``stack_settings``), in rank order
    + ready_timeout: seconds the head waits for the first token
    + rollback: return to the state that served before when no token comes

    **Example:**

    .. code:: python

        stack_up(role="worker", stacks=[stack_settings(cluster, node.hostname) for node in cluster.nodes],
                 ready_timeout=1800, rollback=True)
    """
    if not acts_here(role):
        return
    settings = own(stacks)
    heads_divided(settings)
    image_supports(settings)
    secrets_sealed([settings])
    readings = read_cluster(stacks, "starting the serving cluster")
    mine = readings[settings.rank]
    wanted, everywhere = cluster_stacks(stacks, readings)
    stack = wanted[settings.rank]
    head = settings.role == "head"
    files_ok = mine["compose"] == stack.compose.splitlines() and mine["launch"] == stack.launch.splitlines()
    if not files_ok:  # before any other command: pyinfra's check for a change (--dry) stops at the first one
        yield from install(stack, mine, settings.site.stack_dir, settings.programs)
    if head and not mine["api_key"]:
        key = QuoteString(settings.api_key_file)
        yield StringCommand("umask", "077", "&&", "python3", "-c", QuoteString("import secrets; print(secrets.token_urlsafe(32))"),
                            ">", key, "&&", "chown", QuoteString(f"{settings.cluster.deploy_user}:"), key)
    if None in readings:
        return  # a node started without all the others waits at the rendezvous for ever: the next run starts them
    cluster = cluster_state([found.hash for found in wanted])
    states = [state_of(node, found.hash, cluster, readings[0]["model_digest"]) for node, found in zip(stacks, wanted)]
    if everywhere:
        if head and any(reading["records"]["served"] is None or reading["records"]["served"]["cluster"] != cluster
                        for reading in readings):
            host.log("will record on every node the state in place as the one that serves (the way back for the next change), "
                     "once the head generates a token", logger.info)
            yield FunctionCommand(recorded_if_serving, (probe(settings), recording(stacks, states)), {})
            return
        host.noop(f"the {settings.role} serves profile {settings.cluster.profile_name} (stack {stack.hash})")
        return
    # a start the deploy makes is no crash loop: it owes no backoff (the watchdog's record of failed starts)
    yield StringCommand("rm", "-f", QuoteString(f"{settings.restarts_dir}/{settings.role}-starts"))
    yield cache_kept(settings)
    up = compose(settings.site.stack_dir, "up", "-d", "--force-recreate", "--remove-orphans", "--timeout", str(STOP_TIMEOUT))
    yield StringCommand(sealed(settings.programs, settings.site.container_secrets), "&&", up) if settings.site.container_secrets else up
    if head:
        back, back_what = way_back(stacks, readings, cluster, "served") if rollback else (None, "rollback_on_failure is false")
        yield FunctionCommand(served_or_rolled_back, (
            probe(settings), int(ready_timeout), f"serving {settings.cluster.model.served_name} (profile {settings.cluster.profile_name})",
            [node.hostname for node in stacks], starts(stacks), canaries(settings, cluster, states[0]["model_digest"], speculative_config(settings) or "none"), recording(stacks, states),
            back, back_what, planned_done(settings)), {})
