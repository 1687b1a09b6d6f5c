"""Runtime artifacts: the profile's runtime image and the model, on both nodes, each obtained
once on the head and sent to the worker over the fabric, verified on arrival."""

from pyinfra import host

from operations.managed import managed_files
from operations.runtime import model_on_both, paths, runtime_image

user = host.data.deploy_user
where = paths(host.data.state_dir, host.data.model_dir)
image_name = host.data.profiles[host.data.profile]["image"]
image = host.data.images[image_name]
container = {"mounts": host.data.container_mounts, "env": host.data.container_env}

managed_files(
    name=f"Install the helpers (model hashing and replication, hub fetch, progress lines, serving health and watchdog); give {user} the model directory",
    programs=[
        ("files/runtime/model_sync.py", where["model_sync"], "755"),
        ("files/runtime/fetch_model.py", where["fetch_model"], "755"),
        ("files/runtime/progress.py", where["progress"], "755"),
        ("files/serving/health.py", where["health"], "755"),
        ("files/serving/watchdog.py", where["watchdog"], "755"),
    ],
    directories=[(host.data.model_dir, user, "755")],
    show_program_diffs=host.data.show_program_diffs,
)

runtime_image(
    name=f"Obtain the runtime image {image['tag']} once on the head, send it to the worker, smoke-test both",
    image_name=image_name, image=image, user=user, peer_rails=host.data.peer_rails,
    state_dir=host.data.state_dir, container=container,
)

model_on_both(
    name="Fetch the model once on the head, hash it, replicate it to the worker over the fabric, verified",
    model=host.data.model, user=user, state_dir=host.data.state_dir, model_dir=host.data.model_dir,
    rails=host.data.rails, peer_rails=host.data.peer_rails, image=image, hf_endpoint=host.data.hf_endpoint,
    hf_token_file=host.data.hf_token_file, container=container, streams=host.data.replication_streams,
    verify_model=host.data.verify_model,
)
