"""Runtime artifacts: the profile's runtime image and the model, on every node, each obtained
once on the head and passed down the chain of ranks over the fabric, verified on arrival."""

from io import BytesIO

from pyinfra import host

from operations.managed import managed_files
from operations.own import deploy_directories
from operations.runtime import model_on_every_node, paths, runtime_image
from programs import built

cluster = host.data.cluster
settings, user = cluster.settings, cluster.deploy_user
where = paths(settings.state_dir, settings.model_dir)
image_name, image = cluster.image_name, cluster.image
container = {"mounts": settings.container_mounts, "env": settings.container_env}

managed_files(
    name=f"Claim the deploy's directories (state, model: {user}'s, stack), then install the programs in one archive "
         "(model hashing and replication, hub fetch, progress lines, serving health and watchdog)",
    programs=[(BytesIO(built()), where["programs"], "755")],
    directories=deploy_directories(settings, user),
    show_program_diffs=settings.show_program_diffs,
)

runtime_image(
    name=f"Obtain the runtime image {image.tag} once on the head, send it down the ranks, smoke-test each",
    image_name=image_name, image=image, user=user, state_dir=settings.state_dir, container=container,
)

model_on_every_node(
    name="Fetch the model once on the head, hash it, replicate it down the ranks over the fabric, verified",
    model=cluster.model, user=user, state_dir=settings.state_dir, model_dir=settings.model_dir,
    image=image, hf_endpoint=settings.hf_endpoint, hf_endpoint_insecure_http=settings.hf_endpoint_insecure_http,
    hf_token_file=settings.hf_token_file, container=container, streams=settings.replication_streams,
    verify_model=settings.verify_model,
)
