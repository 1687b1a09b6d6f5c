"""Runtime artifacts: the profile's runtime image and the model, on every node, each obtained
once on the head and passed down the chain of ranks over the fabric, verified on arrival."""

from pyinfra import host

from operations.managed import managed_files
from operations.runtime import model_on_every_node, paths, runtime_image

user = host.data.deploy_user
where = paths(host.data.state_dir, host.data.model_dir)
cluster = host.data.cluster
image_name, image = cluster.image_name, cluster.image
container = {"mounts": host.data.container_mounts, "env": host.data.container_env}

managed_files(
    name=f"Claim the deploy's directories (state, model: {user}'s, stack), then install the helpers (model hashing and "
         "replication, hub fetch, progress lines, serving health and watchdog)",
    programs=[
        ("files/runtime/model_sync.py", where["model_sync"], "755"),
        ("files/runtime/fetch_model.py", where["fetch_model"], "755"),
        ("files/runtime/progress.py", where["progress"], "755"),
        ("files/serving/health.py", where["health"], "755"),
        ("files/serving/watchdog.py", where["watchdog"], "755"),
    ],
    directories=[  # every one claimed here, in the first step that touches any: a refusal comes before anything changes
        ("state_dir", host.data.state_dir, "root", "755"),
        ("model_dir", host.data.model_dir, user, "755"),
        ("stack_dir", host.data.stack_dir, "root", "755"),
    ],
    show_program_diffs=host.data.show_program_diffs,
)

runtime_image(
    name=f"Obtain the runtime image {image['tag']} once on the head, send it down the ranks, smoke-test each",
    image_name=image_name, image=image, user=user, state_dir=host.data.state_dir, container=container,
)

model_on_every_node(
    name="Fetch the model once on the head, hash it, replicate it down the ranks over the fabric, verified",
    model=host.data.model, user=user, state_dir=host.data.state_dir, model_dir=host.data.model_dir,
    image=image, hf_endpoint=host.data.hf_endpoint,
    hf_token_file=host.data.hf_token_file, container=container, streams=host.data.replication_streams,
    verify_model=host.data.verify_model,
)
